"""Issue 12: a compact index. Postings are stored in bit-packed blocks and
passages deflated with the index's own dictionary; both read back exactly what
was written, the index on disk stays within 1.2x the text it holds, an index of
the former format is rebuilt, and the copy carries the new bytes -- checked with
bounded work, so a hostile copy never crashes a decode or sizes an allocation."""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import lmdb
import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lnkmem.replica.export import export

from lnkmem.replica.load import Verified, load, verify

from lnkmem.replica.manifest import CopyDamaged, blob_name, decode_manifest, encode_manifest

from lnkmem.replica.state import CopyState
from lnkmem.index.codec import postings, textpack
from lnkmem.index.codec.postings import encode
from lnkmem.index.store import Store
from tests.helpers import Home, allocates_at_most, index_home, run_cli

# --- postings ---------------------------------------------------------------------------


def _round_trip(pids, tfs) -> bytes:
    v = postings.pack(np.asarray(pids, np.int64), np.asarray(tfs, np.int64))
    p, t = postings.unpack(v)
    order = np.argsort(np.asarray(pids, np.int64), kind="stable")
    want_p = np.asarray(pids, np.int64)[order]
    want_t = np.clip(np.asarray(tfs, np.int64), 1, 65535)[order]
    assert p.dtype == np.uint32 and t.dtype == np.uint16
    assert np.array_equal(p.astype(np.int64), want_p)
    assert np.array_equal(t.astype(np.int64), want_t)
    assert postings.count(v) == len(pids)
    assert postings.check(v) is None
    assert postings.max_tf(v) == (int(want_t.max()) if len(want_t) else 0)
    return v


@pytest.mark.parametrize("n", [0, 1, 2, 23, 127, 128, 129, 255, 256, 257, 1000, 4097])
def test_postings_round_trip_at_block_edges(n):
    rng = np.random.default_rng(n)
    for kind in range(6):
        if kind == 0:  # dense: consecutive ids, gaps of width 0
            p = np.arange(n, dtype=np.int64) + 5
        elif kind == 1:  # the largest ids there are
            p = np.arange(2 ** 32 - n, 2 ** 32, dtype=np.int64)
        elif kind == 2:  # spread over all 32 bits
            p = np.sort(rng.choice(2 ** 32, n, replace=False)) if n else np.empty(0, np.int64)
        else:
            p = np.cumsum(rng.geometric(0.5 if kind == 3 else 0.001, n)).astype(np.int64)
        t = np.full(n, 65535) if kind == 1 else (np.ones(n) if kind == 0 else rng.integers(1, 70000, n))
        _round_trip(p, t)


@pytest.mark.parametrize("n", [129, 1000, 4097])
def test_a_long_list_packed_a_chunk_at_a_time_is_the_same_bytes(n, monkeypatch):
    rng = np.random.default_rng(n)
    p = np.cumsum(rng.geometric(0.01, n)).astype(np.uint32)
    t = rng.integers(1, 70000, n).astype(np.uint32)
    whole = postings.pack(p, t)
    monkeypatch.setattr(encode, "PACK_CHUNK", postings.BLOCK * 2)  # chunks' edges inside the list
    assert postings.pack(p, t) == whole
    assert _round_trip(p, t) == whole


def _by_widths(rng, gap_bits: list, tf_bits: list):
    """A list of one block per entry of ``gap_bits``/``tf_bits`` (the last one short),
    each block's gaps and tfs as wide as asked (their largest hits the width)."""
    p, t, at = [], [], 0
    for i, (gb, tb) in enumerate(zip(gap_bits, tf_bits)):
        n = postings.BLOCK if i + 1 < len(gap_bits) else 77
        g = rng.integers(0, 1 << gb, n) if gb else np.zeros(n, np.int64)
        g[rng.integers(0, n - 1)] = (1 << gb) - 1 if gb else 0  # (a block's last gap is not stored)
        ids = at + np.cumsum(g + 1)
        at = int(ids[-1])
        f = rng.integers(1, 1 << tb, n) + 1 if tb else np.ones(n, np.int64)
        f[rng.integers(0, n)] = 1 << tb if tb else 1
        p.append(ids)
        t.append(f)
    return np.concatenate(p), np.concatenate(t)


@pytest.mark.parametrize("gap_bits,tf_bits", [
    ([5] * 9, [2] * 9),  # one width each: the units' shifts broadcast
    ([0, 1, 3, 5, 7, 8, 2, 4, 6], [0, 1, 2, 3, 4, 5, 6, 7, 8]),  # mixed, all <= 8 bits
    ([3, 12, 5, 20, 8, 24, 0, 10, 6], [1, 9, 2, 14, 3, 15, 0, 4, 2]),  # some wider than 8 (ids within 32 bits)
    ([10, 12, 20, 16, 24, 14, 9, 10, 12], [9, 10, 12, 14, 9, 15, 9, 10, 9]),  # every one wider than 8, mixed
    ([4, 4, 4, 4, 11, 4, 4, 4, 4], [2, 2, 2, 2, 2, 2, 2, 10, 2]),  # one wide block among narrow ones
])
def test_postings_decode_by_block_widths_and_lookups(gap_bits, tf_bits):
    """Lists whose blocks have every width a run may have, one block to another, decode
    whole and by lookup to what was packed (a run of <= 8 bits is read a 64-bit unit of
    8 values at a time, a wider one a value at a time)."""
    rng = np.random.default_rng(sum(gap_bits) * 31 + sum(tf_bits))
    p, t = _by_widths(rng, gap_bits, tf_bits)
    v = _round_trip(p, t)
    tf_of = dict(zip(p.tolist(), np.clip(t, 1, 65535).tolist()))
    for k in (1, 3, 40, len(p) // 9):
        want = np.sort(rng.choice(p, k, replace=False)).astype(np.int64)
        gp, gt = postings.lookup(v, want)
        got = dict(zip(gp.tolist(), gt.tolist()))
        assert all(got[x] == tf_of[x] for x in want.tolist())  # every one asked, with its tf
        assert all(tf_of.get(x) == f for x, f in got.items())  # and nothing not in the list


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 2 ** 32 - 1), unique=True, max_size=600), st.randoms(use_true_random=False))
def test_postings_round_trip_of_any_list(pids, rnd):
    tfs = [rnd.choice([1, 1, 2, 3, 200, 65535, 65536, 0]) for _ in pids]  # held in [1, 65535]
    if rnd.random() < 0.5:
        pids = sorted(pids)  # ascending, as the store writes; else in any order (a merge's)
    _round_trip(pids, tfs)


def _group(rnd, most: int, span: int, dead):
    """One term's lists in several segments (ids apart from list to list: in ranges apart,
    as a bulk build's segments, or interleaving, as segments merged before), and the bytes
    that packing its live postings at once makes."""
    pids = rnd.sample(range(span), rnd.randint(0, min(most, span)))
    pairs = sorted(zip(pids, (rnd.choice([1, 1, 2, 3, 200, 65535]) for _ in pids)))
    k = rnd.randint(1, 12)
    if rnd.random() < 0.5:
        cuts = sorted(rnd.sample(range(len(pairs) + 1), min(k - 1, len(pairs) + 1)))
        groups = [pairs[a:b] for a, b in zip([0] + cuts, cuts + [len(pairs)])]
    else:
        groups = [[] for _ in range(k)]
        for x in pairs:
            groups[rnd.randrange(k)].append(x)
    rnd.shuffle(groups)
    parts = [postings.pack(np.array([p for p, _ in g], np.int64), np.array([t for _, t in g], np.int64))
             for g in groups]
    live = [(p, t) for p, t in pairs if dead is None or p >= len(dead) or not dead[p]]
    want = postings.pack(np.array([p for p, _ in live], np.int64),
                         np.array([t for _, t in live], np.int64)) if live else None
    return parts, want


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 5, 60, 128, 129, 300, 1500]), st.sampled_from([2 ** 32, 10 ** 5, 5000]),
       st.integers(1, 6), st.sampled_from([None, 40, 1000]), st.randoms(use_true_random=False))
def test_a_merge_joins_lists_to_the_bytes_packing_them_whole_makes(most, span, terms, window, rnd):
    """A merge joins terms' lists of several segments a batch of terms at a time (any
    lengths, ranges apart or interleaving, decoded and packed a window of postings at a
    time) less the dead ids: for each term the very bytes that packing its live postings
    at once makes, None for a term left with none."""
    dead = None
    if rnd.random() < 0.5:
        dead = np.zeros(rnd.choice([span, span // 2]), bool)  # (ids past the mask are not dead)
        dead[rnd.sample(range(len(dead)), min(len(dead), rnd.choice([0, 3, 100, 4000])))] = True
    made = [_group(rnd, most, span, dead) for _ in range(terms)]
    was = encode.WINDOW
    try:
        if window:
            encode.WINDOW = window
        got = postings.join_many([parts for parts, _ in made], dead)
    finally:
        encode.WINDOW = was
    assert got == [want for _, want in made]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=60), min_size=1, max_size=5))
def test_a_merge_of_broken_lists_stops_with_a_value_error(bs):
    good = postings.pack(np.arange(300, dtype=np.int64) * 3, np.ones(300, np.int64))
    if any(postings.count(b) is None for b in bs):  # a list whose lengths are broken: refused
        with pytest.raises(ValueError):
            postings.join_many([bs + [good], [good]])
        return
    try:  # lengths whole: joined, or refused for what else is wrong with them
        out = postings.join_many([bs + [good], [good]])
    except ValueError:
        return
    assert len(out) == 2 and postings.count(out[1]) == 300
    assert np.array_equal(postings.unpack(out[1])[0], np.arange(300) * 3)


def test_postings_are_small():
    """About a byte a posting for a common term, against 6 before (u32 + u16)."""
    rng = np.random.default_rng(1)
    p = np.sort(rng.choice(130_000, 30_000, replace=False))
    v = _round_trip(p, rng.integers(1, 4, len(p)))
    assert len(v) < 1.0 * len(p), len(v)
    assert len(postings.pack(np.array([7]), np.array([1]))) <= 8  # a rare term: count + header


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400))
def test_postings_garbage_never_crashes(b):
    k = postings.count(b)
    why = postings.check(b)
    assert k is None or 0 <= k <= 128 * len(b)
    if k is None:
        assert why is not None
        with pytest.raises(ValueError):
            postings.unpack(b)
    elif why is None:
        p, t = postings.unpack(b)
        assert len(p) == len(t) == k
    if k is not None:  # the count alone states what the lengths hold (the pruning's pre-check)
        assert postings.stated_count(b) == k


def test_a_list_claiming_billions_of_postings_costs_nothing():
    claim = b"\xff\xff\xff\xff\x0f" + bytes(7) + bytes(64)  # 2**32 - 1 postings in 76 bytes
    with allocates_at_most(1 << 20):  # billions believed: gigabytes
        assert postings.count(claim) is None and postings.check(claim) is not None
        with pytest.raises(ValueError):
            postings.unpack(claim)
    tfs = np.ones(300)
    tfs[0] = 3
    good = postings.pack(np.arange(300), tfs)
    assert postings.check(good) is None
    assert postings.check(good[:-1]) is not None  # truncated
    lying = bytearray(good)
    lying[2 + 4] = 4  # the first block's largest tf says 4 (as wide as 3): it is 3
    assert "largest tfs" in postings.check(bytes(lying))
    lying = bytearray(good)  # the second block ends before the first
    lying[2 + 7:2 + 11] = (3).to_bytes(4, "little")
    assert "ascend" in postings.check(bytes(lying))


# --- passages ---------------------------------------------------------------------------


def test_passages_round_trip_with_and_without_a_dictionary():
    rng = random.Random(5)
    words = ["narwhal", "migration", "plan", "the", "of", "penguins", "south", "élan", "日本語"]
    raws = [msgspec.msgpack.encode(["home/a.md", i, i, " ".join(rng.choices(words, k=rng.randint(0, 300)))])
            for i in range(400)]
    zdict = textpack.make_dict(raws)
    assert textpack.is_zstd_dict(zdict) and len(zdict) <= textpack.ZSTD_DICT_MAX
    assert textpack.make_dict(raws[:3]) is None  # too little text to make one from
    deflate = b"".join(raws[::9])[-textpack.DICT_SIZE:]  # an index made before zstd: a deflate dictionary
    for d, tag in ((zdict, textpack.ZSTD), (deflate, textpack.DICT), (None, textpack.PLAIN)):
        packer = textpack.Packer(d)
        stored = [packer.pack(r) for r in raws]
        assert tag in {v[0] for v in stored} <= {tag, textpack.RAW}  # (a passage of no words: kept as it is)
        assert [textpack.unpack(v, d) for v in stored] == raws
        assert sum(map(len, stored)) < 0.5 * sum(map(len, raws))
    for d, other in ((zdict, None), (zdict, deflate), (deflate, zdict), (deflate, None)):
        with pytest.raises(ValueError, match="dictionary"):
            textpack.unpack(textpack.Packer(d).pack(raws[5]), other)


def test_passages_of_many_indexes_read_by_many_threads_digest_each_dictionary_once(monkeypatch):
    """serve-many: searches of ten agents run on a pool of threads; each index's zstd
    dictionary is digested once for the process (~0.4 ms), not again by each thread
    whenever it has read four other indexes since (~0.3 ms on a search)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import zstandard

    rng = random.Random(9)
    indexes = []
    for k in range(10):  # ten indexes, each its own words and dictionary
        words = [f"w{k}x{i}" for i in range(60)] + ["the", "plan", "river"]
        raws = [msgspec.msgpack.encode([f"home/{k}.md", i, i, " ".join(rng.choices(words, k=120))]) for i in range(300)]
        zdict = textpack.make_dict(raws)
        assert textpack.is_zstd_dict(zdict)
        packer = textpack.Packer(zdict)
        indexes.append((zdict, raws[:5], [packer.pack(r) for r in raws[:5]]))
    made = []
    lock = threading.Lock()
    real = zstandard.ZstdCompressionDict

    def counted(*a, **kw):
        with lock:
            made.append(a[0])
        return real(*a, **kw)

    monkeypatch.setattr(zstandard, "ZstdCompressionDict", counted)

    def read(k):
        zdict, raws, stored = indexes[k % len(indexes)]
        assert [textpack.unpack(v, bytes(zdict)) for v in stored] == raws  # (a new bytes object: each read of meta gives one)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(read, range(200)))
    assert len(made) <= len(indexes)  # (those already digested by the packing above: not again)


def test_passages_packed_where_they_were_counted_are_stored_as_given_or_packed_again(tmp_path):
    """A build's worker sends its passages deflated with the index's dictionary (made
    before it starts, from a sample): the commit stores them as they are; packed with
    a dictionary that is not the index's (the index replaced meanwhile), they are
    packed again with the index's; either way they read back as they were."""
    import numpy as np

    from lnkmem.index.commit import Batch, NewFile
    from lnkmem.index.format import Passage

    rng = random.Random(7)
    words = ["harbour", "crane", "ledger", "ember", "quartz", "violet", "the", "of", "north"]

    def passages(ref, n):
        return [Passage(ref, i + 1, i + 1, " ".join(rng.choices(words, k=120))) for i in range(n)]

    def file(ref, ps, packer=None):
        one = np.ones(len(ps), np.uint32)
        return NewFile(ref, "v1", 10, "text", [] if packer else ps, None, None, ["harbour"],
                       np.zeros(len(ps), np.uint32), one, one, one * 120,
                       [packer.pack(msgspec.msgpack.encode(p)) for p in ps] if packer else None)

    st_ = Store.open(str(tmp_path / "index"))
    try:
        sample = passages("home/sample.md", 200)
        zdict = st_.passage_dict(lambda: sample)
        assert zdict is not None and st_.passage_dict(lambda: 1 / 0) == zdict  # made once, then kept
        other = textpack.make_dict([msgspec.msgpack.encode(p) for p in passages("home/x.md", 200)])
        assert other != zdict
        mine, theirs, plain = passages("home/a.md", 30), passages("home/b.md", 30), passages("home/c.md", 5)
        st_.commit(Batch([file("home/a.md", mine, textpack.Packer(zdict))], [], zdict))
        st_.commit(Batch([file("home/b.md", theirs, textpack.Packer(other))], [], other))
        st_.commit(Batch([file("home/c.md", plain)]))
        recs = st_.file_recs(["home/a.md", "home/b.md", "home/c.md"])
        for ref, want in (("home/a.md", mine), ("home/b.md", theirs), ("home/c.md", plain)):
            assert st_.passages_of(recs[ref].pids) == want, ref
        with st_.env.begin() as txn:  # all stored with the index's dictionary
            stored = [bytes(txn.get(k.to_bytes(4, "big"), db=st_.passages))
                      for r in recs.values() for k in r.pids]
        assert {v[0] for v in stored} == {textpack.ZSTD}
        assert all(textpack.unpack(v, zdict) for v in stored)
    finally:
        st_.close()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_passage_garbage_never_crashes(b):
    try:
        raw = textpack.unpack(b, b"x" * 100, 10_000)
    except ValueError as e:  # refused, saying why
        assert str(e)
        return
    assert isinstance(raw, bytes) and len(raw) <= 10_000  # or unpacked, within its limit


def test_a_deflate_bomb_passage_is_refused_within_its_limit():
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = b"\x02" + z.compress(bytes(50 << 20)) + z.flush()  # 50 MB of zeros in ~50 KB
    with allocates_at_most(3 << 20), pytest.raises(ValueError, match="longer"):  # (inflated: 50 MB)
        textpack.unpack(bomb, None, 1 << 20)


def test_a_zstd_bomb_passage_is_refused_within_its_limit_or_the_passage_bound():
    rng = random.Random(3)
    raws = [msgspec.msgpack.encode(["home/a.md", i, i, " ".join(rng.choices(["kelp", "tide", "reef", "gull"], k=200))])
            for i in range(200)]
    zdict = textpack.make_dict(raws)
    bomb = b"\x03" + textpack._zstd(zdict).compress(bytes(50 << 20))  # 50 MB of zeros in a few KB
    assert len(bomb) < 50_000
    for limit in (1 << 20, 0):  # a copy's value (its limit), the index's own (MAX_RAW)
        with allocates_at_most(3 << 20), pytest.raises(ValueError, match="longer"):  # (inflated: 50 MB)
            textpack.unpack(bomb, zdict, limit)
    good = textpack.Packer(zdict).pack(raws[0])
    for bad in (good[:-2], good + b"\x00\x01"):  # truncated; bytes after its end
        with pytest.raises(ValueError, match="truncated"):
            textpack.unpack(bad, zdict, 1 << 20)


def test_a_zstd_frames_block_headers_bound_what_it_becomes():
    """The bound read from a frame's block headers (which lets a passage be checked by a
    stream instead of a one-shot buffer of the limit) is never below what the frame
    becomes, from a few bytes to multi-block passages, and the passages read back whole."""
    rng = random.Random(5)
    words = ["kelp", "tide", "reef", "gull", "wrack", "swell"]
    raws = [msgspec.msgpack.encode(["home/a.md", i, i, " ".join(rng.choices(words, k=n))])
            for i, n in enumerate([1, 3, 40, 200, 2000, 60000, 120000] * 3)]
    zdict = textpack.make_dict(raws)
    for raw in raws + [bytes(300_000), rng.randbytes(200_000)]:
        v = textpack.Packer(zdict).pack(raw)
        assert textpack.unpack(v, zdict, 1 << 20) == raw == textpack.unpack(v, zdict)
        if v[0] == textpack.ZSTD:
            assert textpack.frame_bound(memoryview(v)[1:]) >= len(raw)


# --- the index, through the real program ----------------------------------------------


def _corpus(base: Path, scale: float = 0.01) -> Home:
    from bench import corpus
    corpus.generate(str(base / "c"), scale, 3, log=lambda m: None)
    h = Home(base)
    os.rmdir(h.folder)
    os.rename(base / "c" / "home", h.folder)
    for src in ("chats", "skills"):
        d = base / "c" / "agent" / src
        if d.is_dir():
            for f in d.iterdir():
                os.rename(f, h.agent / src / f.name)
    return h


def _disk(state: Path) -> tuple[int, int, int]:
    """(data.mdb bytes, bytes of the pages its tables use, UTF-8 bytes of every passage's text)."""
    path = str(state / "index")
    st_ = Store.open(path)
    try:
        used = 0
        with st_.env.begin() as txn:
            for db in (st_.meta, st_.files, st_.passages, st_.postings, st_.segments, st_.dead):
                s = txn.stat(db)
                used += (s["branch_pages"] + s["leaf_pages"] + s["overflow_pages"]) * st_.psize
            pids = [int.from_bytes(k, "big") for k in txn.cursor(db=st_.passages).iternext(values=False)]
        text = sum(len(p.text.encode()) for p in st_.passages_of(pids))
        return os.path.getsize(os.path.join(path, "data.mdb")), used, text
    finally:
        st_.close()


def test_index_on_disk_within_1_2x_its_text(tmp_path):
    """At 3 MB of text (bench/corpus.py at 0.03), its segments merged into one: a
    build this small ends in two (the size tiers merge eight), each with its own
    keys for the terms they share (1.24x); smaller, the terms' keys weigh more; at
    29 MB it is 1.14x, at 115 MB (scale 1, as built) 0.98x (docs/BENCHMARKS.md)."""
    h = _corpus(tmp_path, 0.03)
    index_home(h, timeout=120)
    st_ = Store.open(str(h.state / "index"))
    assert st_.merge(sorted(st_.snapshot.segs))
    st_.close(compact=True)
    size, used, text = _disk(h.state)
    assert text > 500_000
    assert used <= 1.2 * text, (used, text)
    assert size <= 1.2 * text, (size, text)  # the file, compacted: no free pages left by the merge
    # what was written is what is read: a passage's words find it, its text shown whole
    st_ = Store.open(str(h.state / "index"))
    try:
        pid = int(np.flatnonzero(st_.snapshot.alive)[17])
        (p,) = st_.passages_of([pid])
    finally:
        st_.close()
    src = (h.folder / p.ref.split("/", 1)[1]) if p.ref.startswith("home/") else None
    if src is not None:
        assert p.text.strip() in src.read_text()


def test_an_index_of_the_former_format_is_rebuilt_once(tmp_path):
    h = Home(tmp_path)
    h.write("a.md", "The narwhal migration plan.\n")
    h.write("b.md", "Penguins prefer the south.\n")
    assert run_cli("index", *h.args()).returncode == 0
    env = lmdb.open(str(h.state / "index"), max_dbs=8)
    meta = env.open_db(b"meta")
    with env.begin(write=True) as txn:
        txn.put(b"format", b"lnkmem-index-3", db=meta)
    env.close()
    r = run_cli("search", *h.args(), "narwhal")
    assert r.returncode == 0 and "home/a.md" in r.stdout.decode(), r
    r = run_cli("index", *h.args())
    assert r.returncode == 0 and b"2 unchanged" in r.stderr, r.stderr  # rebuilt once, then kept


# --- the copy ---------------------------------------------------------------------------


def _copy_of(tmp_path: Path, h: Home) -> dict:
    from lnkmem.memory.config import from_args
    from lnkmem.memory.memory import Memory
    mem = Memory(from_args(*h.args(), {}))
    mem.store = mem.open_store()
    mem.refresh_all()
    exp = export(mem.store, CopyState(), "agent o1/a1")
    files = dict(exp.blobs)  # (made as they are asked for: before the store closes)
    mem.store.close()
    files["manifest.json"] = encode_manifest(exp.manifest)
    return files


def _verify(files: dict) -> Verified:
    m = decode_manifest(files["manifest.json"])
    return verify(m, files.__getitem__, "agent o1/a1", {"home", "chats", "skills", "notes"})


def _reseal(files: dict, kind: str, old: str, obj) -> dict:
    """The copy with file ``old`` replaced by ``obj`` under its content name."""
    import json
    blob = zlib.compress(msgspec.msgpack.encode(obj), 3)
    name = blob_name(kind, blob)
    out = {k: v for k, v in files.items() if k != old}
    out[name] = blob
    m = json.loads(files["manifest.json"])
    if kind == "seg":
        m["segments"] = [[name if s == old else s for s in parts] for parts in m["segments"]]
    else:
        m[kind] = name
    out["manifest.json"] = json.dumps(m).encode()
    return out


def test_a_copy_carries_compressed_passages_and_its_dictionary(tmp_path):
    h = _corpus(tmp_path / "a", 0.003)
    files = _copy_of(tmp_path, h)
    v = _verify(files)
    assert v.manifest.dict in files  # made from the index's text, sent as a file of its own
    # loaded into a fresh cache: the same passages, readable with the copy's dictionary
    src = Store.open(str(h.state / "index"))
    dst = Store.open(str(tmp_path / "cache" / "index"))
    try:
        load(dst, v, "v1")
        pids = [int(p) for p in np.flatnonzero(src.snapshot.alive)]
        assert len(pids) > 100
        assert dst.passages_of(pids) == src.passages_of(pids)
        from lnkmem.index.rank.search import bm25
        for q in ("the plan", "meeting notes", "budget"):
            assert bm25(dst, q, 10) == bm25(src, q, 10)
    finally:
        src.close()
        dst.close()
    # a copy of the former format is damaged: replaced, never read
    import json
    m = json.loads(files["manifest.json"])
    m["format"] = "lnkmem-copy-2"
    with pytest.raises(CopyDamaged, match="format"):
        decode_manifest(json.dumps(m).encode())


def test_a_hostile_copy_never_makes_a_decode_crash_or_allocate(tmp_path):
    h = _corpus(tmp_path / "a", 0.003)
    files = _copy_of(tmp_path, h)
    m = decode_manifest(files["manifest.json"])
    name = m.segments[0][0]
    seg = msgspec.msgpack.decode(zlib.decompress(files[name]))
    zdict = msgspec.msgpack.decode(zlib.decompress(files[m.dict]))
    cases = []
    s = list(seg)  # a list claiming 2**32 postings in a few bytes
    s[4] = [b"\xff\xff\xff\xff\x0f" + bytes(7 * 4)] + s[4][1:]
    cases.append(("seg", name, s, "broken length"))
    s = list(seg)  # a list claiming more postings than the segment holds, with valid bytes
    s[4] = [postings.pack(np.arange(len(seg[0]) // 4 + 1), np.ones(len(seg[0]) // 4 + 1))] + s[4][1:]
    cases.append(("seg", name, s, "more postings than"))
    s = list(seg)  # a passage that inflates to 100 MB
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    s[5] = [b"\x02" + z.compress(bytes(100 << 20)) + z.flush()] + s[5][1:]
    cases.append(("seg", name, s, "passage"))
    s = list(seg)  # a passage deflated with another dictionary
    s[5] = [textpack.Packer(b"another dictionary" * 50).pack(textpack.unpack(seg[5][0], zdict))] + s[5][1:]
    cases.append(("seg", name, s, "passage"))
    # a dictionary longer than deflate's window
    cases.append(("dict", m.dict, bytes(textpack.DICT_SIZE + 1), "dictionary"))
    # a zstd dictionary's magic number, then garbage
    cases.append(("dict", m.dict, b"\x37\xa4\x30\xec" + bytes(range(256)) * 8, "dictionary"))
    s = list(seg)  # a zstd passage that inflates to 100 MB
    s[5] = [b"\x03" + textpack._zstd(zdict).compress(bytes(100 << 20))] + s[5][1:]
    cases.append(("seg", name, s, "passage"))
    for kind, old, obj, why in cases:
        resealed = _reseal(files, kind, old, obj)
        # bounded by the copy's own bound (32 x a file's bytes: ~35 MB here), never a bomb's 100 MB
        with allocates_at_most(64 << 20), pytest.raises(CopyDamaged, match=why):
            _verify(resealed)


def _ask(d, key: bytes, i: int) -> bool:
    """A search's use of the cache: get, else decode and put; True on a hit."""
    if d.get(key) is not None:
        return True
    got = d.put(key, postings.unpack(postings.pack(np.arange(1000) * 3 + i, np.ones(1000))))
    assert not got[0].flags.writeable  # a search never changes a list it shares
    return False


def test_decoded_lists_are_kept_within_their_bound_the_often_asked_first():
    d = postings.Decoded(100_000)  # room for 16 lists of 1000 postings
    for i in range(100):  # a stream of lists each asked once: the first ones fill it, the rest pass by
        _ask(d, b"seg%d" % i, i)
        assert d.size <= d.CACHE_BYTES
    assert 0 < len(d.lists) < 100

    d = postings.Decoded(100_000)
    hot = [b"hot%d" % i for i in range(8)]
    for _ in range(3):
        for i, k in enumerate(hot):
            _ask(d, k, i)
    for i in range(200):  # one search of many common words: lists asked once each
        _ask(d, b"once%d" % i, i)
    assert all(d.get(k) is not None for k in hot)  # never pushed out by lists asked for once
    for _ in range(6):  # a list asked for more often than the least used one gets in
        got = _ask(d, b"new", 7)
    assert got and d.size <= d.CACHE_BYTES

    # searches cycling through more lists than fit keep most of them (least recently used
    # first would keep none: each list pushed out just before it is asked for again)
    d = postings.Decoded(100_000)
    keys = [b"c%d" % i for i in range(20)]
    for _ in range(4):
        hits = sum(_ask(d, k, i) for i, k in enumerate(keys))
    assert hits >= 14

    # counts fade: lists hot long ago give way to the ones asked for now
    d = postings.Decoded(100_000)
    d.AGE_EVERY = 64
    for _ in range(10):
        for i in range(16):
            _ask(d, b"old%d" % i, i)
    for _ in range(40):
        for i in range(8):
            _ask(d, b"now%d" % i, i)
    assert all(d.get(b"now%d" % i) is not None for i in range(8))


def test_segment_refs_are_stored_as_runs_and_broken_runs_are_damage(tmp_path):
    """A segment's refs are kept once a run of a file's passages; runs that do not add
    up to its passages (a damaged value) are refused before any list is made of them,
    and an index holding one is rebuilt at open."""
    from lnkmem.index.format import SegMeta, SegStored, encoder, seg_codec
    refs = ["home/a.md"] * 3 + ["home/b.md"] * 2 + ["home/a.md"]
    m = SegMeta(np.arange(1, 7, dtype="<u4").tobytes(), np.full(6, 9, "<u4").tobytes(), refs)
    v = seg_codec.encode(m)
    assert seg_codec.decode(v) == m
    assert len(v) < len(encoder.encode(m))
    for names, runs in ((["x"], [2 ** 32 - 1]), (["x", "y"], [3]), (["x"], [5])):
        bad = encoder.encode(SegStored(m.pids, m.lens, names, np.asarray(runs, "<u4").tobytes()))
        with allocates_at_most(1 << 20), pytest.raises(ValueError):  # (a list of the runs: GBs)
            seg_codec.decode(bad)
    path = str(tmp_path / "index")
    s = Store.open(path)
    from lnkmem.index.commit import Batch, NewFile
    from lnkmem.index.format import Passage
    s.commit(Batch(files=[NewFile("home/a.md", "v1", 5, "text", [Passage("home/a.md", 1, 1, "alpha")],
                                  [({"alpha": 1}, 1)])]))
    s.close()
    env = lmdb.open(path, max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(b"segments", txn=txn, create=False)
        k = next(iter(txn.cursor(db=db).iternext(values=False)))
        txn.put(k, encoder.encode(SegStored(np.arange(1, 2, dtype="<u4").tobytes(), np.ones(1, "<u4").tobytes(),
                                          ["home/a.md"], np.asarray([7], "<u4").tobytes())), db=db)
    env.close()
    os.unlink(os.path.join(path, "sealed"))  # (a change the seal does not know of)
    s = Store.open(path)
    try:
        assert s.rebuilt_because and "refs" in s.rebuilt_because
    finally:
        s.close()
