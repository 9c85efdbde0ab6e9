"""The store's typed transactions (lnkmem/index/tables.py), on real LMDB files: what a
``Reading`` reads is what the index holds, and an index written only through ``Writing``
(as a copy's load writes one) is the same index: it searches the same, its snapshot is
the same, and it reopens as it was closed. A stepped write transaction keeps what it
commits and drops what it aborts; a ``with store.writing()`` that raises keeps nothing."""

import random

import pytest

from lnkmem.core.errors import DamagedIndex
from lnkmem.index.commit import Batch
from lnkmem.index.format import file_decoder, file_key, file_value, id_key
from lnkmem.index.rank.search import bm25
from lnkmem.index.store import Store
from tests.helpers import assert_same_snapshot, random_file

WORDS = [f"w{i}" for i in range(40)] + ["pangolin", "narwhal"]


def _made(path: str, removed: bool = True) -> Store:
    """An index of 60 files in three commits, 10 of them removed since (dead passages)
    unless not ``removed``."""
    rng = random.Random(11)
    st = Store.open(path)
    for c in range(3):
        st.commit(Batch(files=[random_file(rng, f"home/d{c}/f{j}.md", "v1", WORDS, None, (3, 12))
                               for j in range(20)]))
    if removed:
        st.commit(Batch(removed=[f"home/d1/f{j}.md" for j in range(10)]))
    return st


def test_a_reading_reads_what_the_index_holds(tmp_path):
    st = _made(str(tmp_path / "a"))
    try:
        snap = st.snapshot
        with st.reading() as r:
            assert r.count("files") == st.file_count() == 50
            assert r.count("passages") == st.live_count()
            assert r.meta_int(b"gen") == snap.gen
            assert r.meta(b"no such key") is None
            files = {ref: file_decoder.decode(rec) for ref, rec in r.files()}
            assert files == st.all_files()
            live = sorted(p for rec in files.values() for p in rec.pids)
            assert [st.passages_of([p])[0] is not None for p in live] == [True] * len(live)
            assert all(r.passage(p) is not None for p in live)
            dead = r.dead_ids()
            assert len(dead) and list(dead) == sorted(dead)
            assert not set(dead.tolist()) & set(live)  # the removed files' passages
            assert all(r.passage(int(p)) is None for p in dead)
            segs = r.segment_keys()
            assert segs == sorted(segs) and len(segs) == len(snap.segs)
            assert all(r.segment(sk) is not None for sk in segs)
            terms = [t for sk in segs for t, _ in r.segment_postings(sk)]
            assert b"pangolin" in terms and b"narwhal" in terms
            for sk in segs:  # a segment's terms, its lists one at a time: what a search reads
                stored = dict(r.segment_postings(sk))
                assert r.segment_terms(sk) == list(stored)
                assert all(r.posting_list(sk + t) == v for t, v in stored.items())
                assert r.posting_list(sk + b"no such term") is None
                w1 = sorted(t for t in stored if t.startswith(b"w1"))
                assert r.segment_terms(sk, b"w1") == w1 and r.segment_terms(sk, b"w1", 2) == w1[:2]
                assert r.segment_terms(sk, b"w1", 0) == [] and r.segment_terms(sk, b"zz") == []
            assert r.table_bytes("postings") > 0
            assert r.vector(live[0]) is None and list(r.vectors()) == [] and r.pending_vector_ids() == []
            with pytest.raises(KeyError):
                r.count("no such table")
    finally:
        st.close()


def _copied(src: Store, dst: Store) -> None:
    """Every table of ``src`` (which holds no dead passage) written into ``dst`` through
    one Writing, as a copy's load writes: the data dropped first, many items at a time,
    postings appended."""
    with src.reading() as r, dst.writing() as w:
        w.clear_data()
        w.put_files(sorted((file_key(ref), file_value(ref, rec)) for ref, rec in r.files()))
        for sk in r.segment_keys():
            w.put_segment(sk, r.segment(sk))
            w.put_postings(((sk + t, bytes(v)) for t, v in r.segment_postings(sk)), append=True)
        pids = sorted(p for _, rec in r.files() for p in file_decoder.decode(rec).pids)
        w.put_passages((id_key(p), r.passage(p)) for p in pids)
        for key in (b"next_pid", b"next_seg", b"zdict"):
            if r.meta(key) is not None:
                w.put_meta(key, r.meta(key))
        w.put_meta(b"gen", str(r.meta_int(b"gen") + 1).encode())
        assert w.count("files") == r.count("files")  # (a Writing reads what it wrote)
    dst.reload_snapshot(check=True)  # (every file record names exactly the live passages)


def test_an_index_written_through_writing_is_the_same_index(tmp_path):
    src = _made(str(tmp_path / "a"), removed=False)
    dst = Store.open(str(tmp_path / "b"))
    try:
        dst.commit(Batch(files=[random_file(random.Random(3), "home/old.md", "v1", ["walrus"], 2)]))
        _copied(src, dst)
        assert bm25(dst, "walrus", 10) == []  # what it held before is gone
        for q in ("pangolin", "narwhal w3", "w7 w8 w9"):
            assert bm25(dst, q, 20) == bm25(src, q, 20)
        a, b = src.snapshot, dst.snapshot
        assert (a.live, a.total_len, a.segs) == (b.live, b.total_len, b.segs)
        expect = bm25(src, "pangolin", 20)
    finally:
        src.close()
        dst.close()
    again = Store.open(str(tmp_path / "b"))  # reopened: whole, and answering the same
    try:
        assert again.rebuilt_because is None
        assert bm25(again, "pangolin", 20) == expect
        fresh = again.load_snapshot(check=True)
        assert_same_snapshot(again.snapshot, fresh)
    finally:
        again.close()


def test_a_stepped_write_keeps_what_it_commits_and_drops_what_it_aborts(tmp_path):
    st = Store.open(str(tmp_path / "a"))
    try:
        with st.write_lock:
            w = st.begin_writing()
            w.put_meta(b"step", b"1")
            assert w.meta(b"step") == b"1"
            with st.reading() as r:
                assert r.meta(b"step") is None  # no reader sees it before its commit
            w.commit()
            w = st.begin_writing()
            w.put_meta(b"step", b"2")
            w.put_meta(b"other", b"x")
            w.abort()
        with st.reading() as r:
            assert r.meta(b"step") == b"1" and r.meta(b"other") is None
        with pytest.raises(RuntimeError):
            with st.writing() as w:
                w.delete_meta(b"step")
                raise RuntimeError("a caller's failure")
        assert st.get_meta(b"step") == b"1"
    finally:
        st.close()


def test_a_damaged_index_gives_no_transaction(tmp_path):
    st = _made(str(tmp_path / "a"))
    try:
        st.damage("a test says so")
        with pytest.raises(DamagedIndex, match="a test says so"):
            with st.reading():
                pass
        with pytest.raises(DamagedIndex):
            with st.writing():
                pass
        with pytest.raises(DamagedIndex):  # a search: refused by its refresh, before its reading
            bm25(st, "pangolin", 10)
    finally:
        st.close()
