"""Vectors held as int8 (as stored) and searched block by block: the same
results as the widened float32 matrix, in a quarter of its memory."""

import numpy as np
import pytest

from lnkmem.index.rank import vectors
from lnkmem.index.commit import Batch, NewFile
from lnkmem.index.format import Passage, quantize
from lnkmem.index.store import Store
from lnkmem.index.rank.vectors import VectorIndex

N, DIM, FILES = 5000, 96, 50


def _unit(rng, n, dim):
    m = rng.standard_normal((n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


@pytest.fixture
def store(tmp_path):
    """A real index of N passages in FILES files, half under home/a/, with a vector each."""
    st = Store.open(str(tmp_path / "index"))
    per = N // FILES
    files = []
    for f in range(FILES):
        ref = f"home/{'a' if f % 2 else 'b'}/f{f}.md"
        ps = [Passage(ref, i + 1, i + 1, f"passage {f}.{i}") for i in range(per)]
        files.append(NewFile(ref, "v1", 10, "text", ps, [({"passage": 1}, 1)] * per))
    st.commit(Batch(files=files))
    pids = [int(p) for p in np.flatnonzero(st.snapshot.alive)]
    assert len(pids) == N
    vecs = _unit(np.random.default_rng(1), N, DIM)
    vecs[7] = 0  # a zero vector must not break quantising
    assert len(st.put_vectors(pids, vecs)) == N
    yield st, np.asarray(pids), vecs
    st.close()


def _widened(st):
    """The old way: every stored vector widened to float32 (int8 × scale)."""
    pids, q, sc = st.all_vectors()
    return pids, q.astype(np.float32) * sc[:, None]


def _exact(pids, mat, q, k, mask=None):
    sims = mat @ q
    if mask is not None:
        pids, sims = pids[mask], sims[mask]
    order = np.argsort(-sims, kind="stable")[:k]
    return pids[order], sims[order]


def test_int8_search_equals_the_widened_float_search(store):
    st, pids, _ = store
    vi = VectorIndex()
    vi.load(st)
    assert vi.matrix.dtype == np.int8 and vi.count() == N
    assert vi.nbytes < (N + 1) * (DIM + 4 + 1) + 1  # int8 + scale + flag a row: not DIM * 4
    wp, wm = _widened(st)
    under_a = np.array([st.snapshot.refs[st.snapshot.refid[p]].startswith("home/a/") for p in wp])
    rng = np.random.default_rng(2)
    for q in _unit(rng, 40, DIM):
        for k in (1, 10, 100):
            got = vi.search(st, q, k)
            ids, sims = _exact(wp, wm, q, k)
            assert [p for p, _ in got] == ids.tolist()
            assert np.allclose([s for _, s in got], sims, atol=1e-5)
        # a filter searches only its rows (the gathered path)
        got = vi.search(st, q, 20, under="home/a/")
        ids, sims = _exact(wp, wm, q, 20, under_a)
        assert [p for p, _ in got] == ids.tolist()
        assert np.allclose([s for _, s in got], sims, atol=1e-5)


def test_blocks_cover_every_row(store, monkeypatch):
    """Blocks smaller than the matrix (and not dividing it) give the same scores."""
    st, _, _ = store
    vi = VectorIndex()
    vi.load(st)
    q = _unit(np.random.default_rng(3), 1, DIM)[0]
    whole = vi.similarities(q, n=N + 1)
    monkeypatch.setattr(vectors, "BLOCK", 333)
    assert np.allclose(vi.similarities(q, n=N + 1), whole, atol=1e-6)
    rows = np.arange(1, N + 1)[::3]
    assert np.allclose(vi.similarities(q, rows=rows), whole[rows], atol=1e-6)
    monkeypatch.setattr(vectors, "_vecdot", None)  # numpy 1.x: einsum's loop
    assert np.allclose(vi.similarities(q, n=N + 1), whole, atol=1e-6)


def test_added_float_vectors_are_held_as_stored(store):
    """Vectors just embedded (float) rank exactly as after a restart (int8 from the store)."""
    st, pids, vecs = store
    fresh, loaded = VectorIndex(), VectorIndex()
    fresh.add(pids, vecs)
    loaded.load(st)
    assert np.array_equal(fresh.matrix[pids], loaded.matrix[pids])
    assert np.array_equal(fresh.scales[pids], loaded.scales[pids])
    fresh.add([], vecs[[]])  # nothing stored of a batch (all replaced meanwhile): nothing changes
    q = vecs[11]
    assert fresh.search(st, q, 10) == loaded.search(st, q, 10)
    assert fresh.search(st, q, 1)[0][0] == pids[11]
    # against the float vectors themselves: quantising moves scores a little, not the order much
    ids, _ = _exact(pids, vecs, q, 10)
    assert len(set(ids.tolist()) & {p for p, _ in loaded.search(st, q, 10)}) >= 9


def test_quantize_bytes_unchanged():
    """The stored form is byte for byte the former one (an index on disk stays valid)."""
    rng = np.random.default_rng(4)
    for v in list(_unit(rng, 20, DIM)) + [np.zeros(DIM, np.float32), np.full(DIM, 1e-30, np.float32)]:
        m = float(np.abs(v).max()) or 1.0
        scale = m / 127.0
        old = np.round(v / scale).astype(np.int8).tobytes() + np.float32(scale).tobytes()
        assert quantize(v) == old


def test_rows_of_another_length_are_left_out(tmp_path):
    """Vectors of two lengths in the store (never written so, but read defensively): the
    first row's length is kept, as before, and the index still searches them."""
    st = Store.open(str(tmp_path / "index"))
    ps = [Passage("home/a.md", i + 1, i + 1, f"p{i}") for i in range(6)]
    st.commit(Batch(files=[NewFile("home/a.md", "v1", 1, "text", ps, [({"p": 1}, 1)] * 6)]))
    pids = [int(p) for p in np.flatnonzero(st.snapshot.alive)]
    rng = np.random.default_rng(6)
    st.put_vectors(pids[:4], _unit(rng, 4, 8))
    st.put_vectors(pids[4:], _unit(rng, 2, 16))  # the last rows are longer
    vi = VectorIndex()
    vi.load(st)
    assert vi.count() == 4 and vi.matrix.shape[1] == 8
    assert {p for p, _ in vi.search(st, _unit(rng, 1, 8)[0], 10)} == set(pids[:4])
    st.close()


def test_load_takes_vectors_stored_while_it_reads(store, monkeypatch):
    """The embed loop may store vectors between the load's sizing and its reading."""
    st, pids, vecs = store
    whole = VectorIndex()
    whole.load(st)
    monkeypatch.setattr(st, "vector_shape", lambda: (10, DIM))  # sized before most were stored
    vi = VectorIndex()
    vi.load(st)
    assert vi.count() == N
    assert np.array_equal(vi.matrix[pids], whole.matrix[pids]) and np.array_equal(vi.scales[pids], whole.scales[pids])
