"""The approximate vector index (lnkmem/index/rank/ann.py) past a threshold, lowered here
through LNKMEM_ANN_THRESHOLD: the mechanism — built from the vectors held, kept up to
date by adds and forgets (ids reused), saved under <state> and reloaded, rebuilt when
its file is missing, stale or damaged (never handed to usearch then), filters by
over-fetching or exactly. Recall on real MiniLM vectors is bench/bench_ann.py's."""

import json
import os
import time

import numpy as np
import pytest

pytest.importorskip("usearch")

from lnkmem.core.knobs import KnobError  # noqa: E402
from lnkmem.index.rank import ann as annmod  # noqa: E402
from lnkmem.index.commit import Batch, NewFile  # noqa: E402
from lnkmem.index.format import Passage  # noqa: E402
from lnkmem.index.store import Store  # noqa: E402
from lnkmem.index.rank.vectors import VectorIndex  # noqa: E402

N, DIM, FILES = 2400, 48, 24


def _unit(rng, n, dim):
    m = rng.standard_normal((n, dim)).astype(np.float32)
    return m / np.linalg.norm(m, axis=1, keepdims=True)


def _clustered(rng, n, dim):
    """Vectors near a few dozen centres, as embeddings of related text are."""
    centres = _unit(rng, 40, dim)
    v = centres[rng.integers(0, 40, n)] + 0.35 * _unit(rng, n, dim)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _ref(f):
    return ("chats/c" if f % 3 == 0 else f"home/{'a' if f % 2 else 'b'}") + f"/f{f}.md"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("LNKMEM_ANN_THRESHOLD", "1000")
    st = Store.open(str(tmp_path / "index"))
    per = N // FILES
    files = []
    for f in range(FILES):
        ref = _ref(f)
        ps = [Passage(ref, i + 1, i + 1, f"passage {f}.{i}") for i in range(per)]
        files.append(NewFile(ref, "v1", 10, "text", ps, [({"passage": 1}, 1)] * per))
    st.commit(Batch(files=files))
    pids = np.flatnonzero(st.snapshot.alive)
    assert len(pids) == N
    vecs = _clustered(np.random.default_rng(1), N, DIM)
    assert len(st.put_vectors(pids.tolist(), vecs)) == N
    yield st, pids, vecs, str(tmp_path / "vectors.ann")
    st.close()


def _ready(vi, timeout=60):
    end = time.monotonic() + timeout
    while not vi.ann_ready:
        assert time.monotonic() < end, "the approximate index was never ready"
        time.sleep(0.02)
    t = vi._ann_thread
    if t is not None:
        t.join(timeout)


def _exact(vi, st, q, k, **kw):
    """The exact search (the same index with its approximate one set aside)."""
    ready, vi.ann_ready = vi.ann_ready, False
    try:
        return vi.search(st, q, k, **kw)
    finally:
        vi.ann_ready = ready


def _recall(got, want):
    return len({p for p, _ in got} & {p for p, _ in want}) / max(1, len(want))


def test_below_the_threshold_the_search_stays_exact(store, monkeypatch):
    st, pids, vecs, path = store
    monkeypatch.setenv("LNKMEM_ANN_THRESHOLD", str(N + 1))
    vi = VectorIndex(path)
    vi.load(st)
    assert vi.ann is None and vi._ann_thread is None
    vi.close()
    assert not os.path.exists(path)


def test_past_the_threshold_searches_by_the_graph_with_exact_scores(store):
    st, pids, vecs, path = store
    vi = VectorIndex(path)
    vi.load(st)
    _ready(vi)
    assert len(vi.ann) == N
    rng = np.random.default_rng(2)
    recalls = []
    calls = []
    real = vi.ann.neighbours
    vi.ann.neighbours = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    for q in _clustered(rng, 30, DIM):
        got, want = vi.search(st, q, 10), _exact(vi, st, q, 10)
        recalls.append(_recall(got, want))
        exact = dict(_exact(vi, st, q, N))
        for p, s in got:  # scores are the exact ones
            assert abs(exact[p] - s) < 1e-5
        assert [s for _, s in got] == sorted((s for _, s in got), reverse=True)
    assert len(calls) == 30  # the graph answered, not the exact search
    assert np.mean(recalls) >= 0.95
    vi.close()


def test_adds_and_forgets_reach_the_graph(store):
    st, pids, vecs, path = store
    vi = VectorIndex(path)
    vi.load(st)
    _ready(vi)
    # forget: an id given to a new passage is never answered with its old vector
    gone = int(pids[5])
    vi.forget([gone])
    assert not vi.ann.index.contains(gone)
    assert gone not in {p for p, _ in vi.search(st, vecs[5], 10)}
    # the id reused with another vector: found by that vector, with its score
    new = _unit(np.random.default_rng(9), 1, DIM)
    vi.add([gone], new)
    assert vi.ann.index.contains(gone)
    top = vi.search(st, new[0], 1)
    assert top[0][0] == gone and top[0][1] > 0.99
    # rows added past the matrix's end: in the graph, found
    extra = np.arange(N + 10, N + 20)
    more = _unit(np.random.default_rng(10), 10, DIM)
    vi.add(extra, more)
    assert all(vi.ann.index.contains(int(p)) for p in extra)
    vi.close()


def test_saved_reloaded_and_reconciled_after_a_restart(store):
    st, pids, vecs, path = store
    vi = VectorIndex(path)
    vi.load(st)
    _ready(vi)
    q = vecs[100]
    before = vi.search(st, q, 10)
    vi.close()  # saved on the way out
    head = json.load(open(path + ".json"))
    assert head["count"] == N and os.path.getsize(path) == head["size"]
    # meanwhile (the file lags LMDB): one passage's vector replaced, one dropped
    st.put_vectors([int(pids[100])], -vecs[100:101])
    again = VectorIndex(path)
    again.load(st)
    _ready(again)
    assert again.ann.loaded_from_file
    got = again.search(st, q, 10)
    assert int(pids[100]) not in {p for p, _ in got}  # its new vector points away
    assert len({p for p, _ in got} & {p for p, _ in before}) >= 8  # the others still found
    assert np.array_equal(again.ann.index.get(int(pids[100]), dtype=np.int8), again.matrix[pids[100]])
    assert _recall(got, _exact(again, st, q, 10)) >= 0.9
    again.close()


@pytest.mark.parametrize("damage", ["truncated", "flipped", "hostile", "no header", "forged header"])
def test_a_damaged_file_is_rebuilt_never_loaded(store, damage, monkeypatch):
    st, pids, vecs, path = store
    vi = VectorIndex(path)
    vi.load(st)
    _ready(vi)
    vi.close()
    raw = open(path, "rb").read()
    if damage == "truncated":
        open(path, "wb").write(raw[: len(raw) // 3])
    elif damage == "flipped":
        b = bytearray(raw)
        b[len(b) // 2] ^= 0xFF
        open(path, "wb").write(bytes(b))
    elif damage == "hostile":  # a header claiming a huge graph
        open(path, "wb").write(b"\xff" * 64 + os.urandom(4096))
    elif damage == "no header":
        os.unlink(path + ".json")
    else:  # the header says what the file's size is, not its digest
        head = json.load(open(path + ".json"))
        open(path, "wb").write(os.urandom(head["size"]))
    loads = []
    real = annmod.Ann.try_load
    from usearch.index import Index
    real_load = Index.load
    monkeypatch.setattr(Index, "load", lambda self, *a, **kw: loads.append(1) or real_load(self, *a, **kw))
    monkeypatch.setattr(annmod.Ann, "try_load", lambda self: real(self))
    again = VectorIndex(path)
    again.load(st)
    _ready(again)
    assert loads == []  # usearch never read the file
    assert not again.ann.loaded_from_file and len(again.ann) == N
    q = vecs[7]
    assert again.search(st, q, 1)[0][0] == int(pids[7])
    again.close()
    head = json.load(open(path + ".json"))  # saved anew, whole
    assert os.path.getsize(path) == head["size"]


def test_filters_over_fetch_or_search_exactly(store):
    st, pids, vecs, path = store
    vi = VectorIndex(path)
    vi.load(st)
    _ready(vi)
    rng = np.random.default_rng(3)
    srcs = st.snapshot.src
    for q in _clustered(rng, 10, DIM):
        # a wide filter (two thirds of the rows, past the threshold): the graph, over-fetched
        got = vi.search(st, q, 10, sources=["home"])
        assert len(got) == 10 and all(srcs[p] == 0 for p, _ in got)
        assert _recall(got, _exact(vi, st, q, 10, sources=["home"])) >= 0.8
        # a narrow one (under the threshold's rows): exactly
        got = vi.search(st, q, 10, under="home/a/f1.md")
        assert got == _exact(vi, st, q, 10, under="home/a/f1.md")
    vi.close()


def test_dead_passages_are_not_answered(store):
    st, pids, vecs, path = store
    vi = VectorIndex(path)
    vi.load(st)
    _ready(vi)
    ref = _ref(4)
    st.commit(Batch(removed=[ref]))
    dead = set(np.flatnonzero(~st.snapshot.alive[: len(pids) + 1]).tolist()) & set(pids.tolist())
    assert dead
    for i in sorted(dead)[:5]:
        i = int(np.flatnonzero(pids == i)[0])
        assert not {p for p, _ in vi.search(st, vecs[i], 10)} & dead
    vi.close()


def test_the_threshold_knob(monkeypatch):
    monkeypatch.setenv("LNKMEM_ANN_THRESHOLD", "0")
    assert annmod.threshold() == 0
    monkeypatch.setenv("LNKMEM_ANN_THRESHOLD", "lots")  # issue 36: refused, naming it (was: the default, a warning logged)
    with pytest.raises(KnobError, match="LNKMEM_ANN_THRESHOLD"):
        annmod.threshold()
    monkeypatch.delenv("LNKMEM_ANN_THRESHOLD")
    assert annmod.threshold() == annmod.THRESHOLD


def test_the_served_engine_keeps_its_index_under_state(home, tmp_path):
    """The real `lnk-lnkmem serve` past a lowered threshold: searches by meaning through
    the graph, leaves `<state>/vectors.ann` (and its header) on the way out, and a
    truncated file there is rebuilt at the next start, answering the same."""
    from fakes.harness import FakeServer
    from tests.helpers import Server, until
    sock = tmp_path / "embed.sock"
    model = FakeServer.start("fakes.embedding_server", "--unix", sock, "--dim", "64", "--model", "fake-mini")
    env = {"LNK_MEMORY_SPEC": '{"model": "fake-mini"}', "LNK_MEMORY_MODEL": model.listen,
           "LNKMEM_ANN_THRESHOLD": "50"}
    home.write("spring.md", "We purchased an automobile last spring; the vehicle runs well.\n")
    for i in range(160):
        home.write(f"filler/f{i}.md", f"Note {i} about gardening, bread number {i} and the weather on day {i}.\n")
    path = home.state / "vectors.ann"
    try:
        def top(s):
            r = s.search("buying a car")["structuredContent"]
            return r["ranked"], r["hits"][0]["ref"] if r["hits"] else None

        with Server.start(home, env=env) as s:
            s.wait_indexed()
            assert until(lambda: top(s) == ("meaning+words", "home/spring.md"), timeout=20)
            # saved once built (on its own thread)
            assert until(lambda: (home.state / "vectors.ann.json").exists(), timeout=30)
            assert top(s) == ("meaning+words", "home/spring.md")
        assert path.exists()
        head = json.loads((home.state / "vectors.ann.json").read_text())
        assert head["count"] >= 161 and head["size"] == path.stat().st_size
        path.write_bytes(path.read_bytes()[:100])  # truncated
        with Server.start(home, env=env) as s:
            s.wait_indexed()
            assert until(lambda: top(s) == ("meaning+words", "home/spring.md"), timeout=20)
            assert until(lambda: (home.state / "vectors.ann.json").exists() and path.stat().st_size > 100, timeout=30)
        head = json.loads((home.state / "vectors.ann.json").read_text())
        assert head["size"] == path.stat().st_size > 100  # rebuilt and saved whole
    finally:
        model.stop()


def test_temps_of_a_killed_save_are_removed(store):
    st, pids, vecs, path = store
    dead = 2 ** 22 + 12345  # no such process
    for name in (f"{path}.{dead}.tmp", f"{path}.json.{dead}.tmp"):
        open(name, "wb").write(b"half a save")
    vi = VectorIndex(path)
    vi.load(st)
    _ready(vi)
    vi.close()
    left = [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")]
    assert left == [] and os.path.exists(path)


def test_a_state_that_refuses_the_file_keeps_the_graph_serving(store, tmp_path):
    """`vectors.ann` cannot be written (here its folder is gone): a warning, the graph
    built in memory still answers, and nothing is rebuilt at each add. (A folder at its
    name is no such refusal: it is removed, test_what_stands_at_the_files_names_...)"""
    st, pids, vecs, _ = store
    path = tmp_path / "gone" / "blocked.ann"
    vi = VectorIndex(str(path))
    vi.load(st)
    _ready(vi)
    graph = vi.ann
    assert graph is not None and len(graph) == N
    vi.add([int(pids[3])], vecs[4:5])
    assert vi.ann is graph and vi.search(st, vecs[4], 1)[0][1] > 0.99
    vi.close()
    assert not path.parent.exists() and not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


@pytest.mark.parametrize("kind", ["link", "folder", "fifo"])
@pytest.mark.parametrize("which", ["file", "header"])
def test_what_stands_at_the_files_names_is_replaced_never_written_through(store, tmp_path, which, kind):
    """A link (to a file outside), a folder or a FIFO at `vectors.ann` or its header:
    the save replaces it (the file outside unchanged), never waits on it, and the next
    load reads the saved graph."""
    st, pids, vecs, path = store
    at = path if which == "file" else path + ".json"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"not the engine's")
    if kind == "link":
        os.symlink(outside, at)
    elif kind == "folder":
        os.mkdir(at)
    else:
        os.mkfifo(at)
    vi = VectorIndex(path)
    vi.load(st)
    _ready(vi)
    vi.close()
    assert outside.read_bytes() == b"not the engine's"
    assert os.path.isfile(path) and not os.path.islink(path)
    assert os.path.isfile(path + ".json") and not os.path.islink(path + ".json")
    again = VectorIndex(path)
    again.load(st)
    _ready(again)
    assert again.ann is not None and again.ann.loaded_from_file
    again.close()
