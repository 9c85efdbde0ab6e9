"""Compaction (store.compact_file): the free pages a build's merges leave are given
back, only while no other process has the index open, and never at the cost of
anything the index holds -- real LMDB files, real processes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import lmdb

from lnkmem.index.rank import search
from lnkmem.index.commit import Batch
from lnkmem.index.lmdbfile import COMPACTING, compact_file
from lnkmem.index.store import Store
from tests.helpers import ROOT, Home, RandomText, base_env, index_home, until

WORDS = [f"w{i}" for i in range(300)]


TEXT = RandomText(WORDS, (5, 30), passages=8)


def _same(got, want) -> bool:
    """The same passages in the same order, scores alike to 1e-4 (the sum of lengths
    behind the mean length is kept as it grew, and summed anew at an open that reads
    the tables: scores may move in the sixth digit)."""
    return [p for p, _ in got] == [p for p, _ in want] and all(
        abs(a - b) <= 1e-4 * max(1.0, abs(b)) for (_, a), (_, b) in zip(got, want))


def _merged_index(path: str) -> list:
    """An index whose merge left most of its file free; the answers to some queries."""
    rng = random.Random(4)
    st = Store.open(path)
    for i in range(10):
        st.commit(Batch(files=[TEXT.file(rng, f"home/d{i}/f{j}.md") for j in range(100)]))
    assert st.merge(sorted(st.snapshot.segs))
    assert st.free_share() > 0.2
    queries = [" ".join(rng.sample(WORDS, 3)) for _ in range(10)]
    want = [search.bm25(st, q, 10) for q in queries]
    st.close()
    return list(zip(queries, want))


def _answers_hold(path: str, qa: list) -> Store:
    st = Store.open(path)
    assert st.rebuilt_because is None
    for q, want in qa:
        assert _same(search.bm25(st, q, 10), want), q
    return st


def test_close_compact_gives_back_the_free_pages_and_keeps_everything(tmp_path):
    path = str(tmp_path / "index")
    qa = _merged_index(path)
    before = os.path.getsize(os.path.join(path, "data.mdb"))
    st = Store.open(path)
    st.close(compact=True)
    assert st.compacted is True
    after = os.path.getsize(os.path.join(path, "data.mdb"))
    assert after < 0.8 * before
    st = _answers_hold(path, qa)
    try:
        assert st.opened_as == "sealed"  # sealed after the compaction: no whole-file check next time
        assert st.free_share() < 0.05
        rng = random.Random(9)  # and it takes writes as before
        st.commit(Batch(files=[TEXT.file(rng, "home/new.md")]))
        assert search.bm25(st, " ".join(st.passages_of([max(st.snapshot.segs and [1])])[0].text.split()[:2]), 5)
    finally:
        st.close()


HOLDER = r"""
import sys, time
from lnkmem.index.store import Store
st = Store.open(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
from lnkmem.index.commit import Batch, NewFile
from lnkmem.index.format import Passage
st.commit(Batch(files=[NewFile("home/late.md", "v1", 5, "text", [Passage("home/late.md", 1, 1, "zebra late")],
                               [({"zebra": 1, "late": 1}, 2)])]))
print("wrote", flush=True)
st.close()
"""


def test_no_compaction_while_another_process_has_the_index_open(tmp_path):
    path = str(tmp_path / "index")
    qa = _merged_index(path)
    env = base_env()
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=env, text=True)
    try:
        assert p.stdout.readline().strip() == "open"
        before = os.stat(os.path.join(path, "data.mdb"))
        st = Store.open(path)
        st.close(compact=True)
        assert st.compacted is False
        now = os.stat(os.path.join(path, "data.mdb"))
        assert (now.st_ino, now.st_size) == (before.st_ino, before.st_size)
        p.stdin.write("go\n")
        p.stdin.flush()
        assert p.stdout.readline().strip() == "wrote"  # the other process's write lands in the file all see
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
    st = _answers_hold(path, qa)
    try:
        assert [st.passages_of([pid])[0].ref for pid, _ in search.bm25(st, "zebra", 5)] == ["home/late.md"]
    finally:
        st.close()


OPENER = r"""
import sys
from lnkmem.index.store import Store
from lnkmem.index.rank import search
st = Store.open(sys.argv[1])
print(st.rebuilt_because, st.snapshot.live, search.bm25(st, sys.argv[2], 10), flush=True)
st.close()
"""


def test_processes_opening_while_it_compacts_see_the_whole_index(tmp_path):
    """Openers racing the compaction: each either opened before (then there was none)
    or waits for it and opens the new file, with LMDB's lock file reset for it."""
    path = str(tmp_path / "index")
    qa = _merged_index(path)
    st = Store.open(path)
    live = st.snapshot.live
    st.close()
    env = base_env()
    env["PYTHONPATH"] = str(ROOT)
    q, want = qa[0]
    procs = []
    for i in range(6):
        procs.append(subprocess.Popen([sys.executable, "-c", OPENER, path, q], stdout=subprocess.PIPE, env=env,
                                      text=True))
        if i == 2:
            done = compact_file(path)
        time.sleep(0.01)  # kept: pacing, the openers spread around the compaction
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert all(o.startswith(f"None {live} [({want[0][0]}, ") for o in outs), outs
    del done
    _answers_hold(path, qa).close()


def _waits_on_a_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked waiting for a file lock (``/proc/locks`` lists
    a waiter with "->")."""
    with open("/proc/locks") as f:
        return any(w[1] == "->" and w[5] == str(pid) for w in map(str.split, f) if len(w) > 5)


def test_a_process_that_waited_on_the_compaction_opens_the_new_file_whole(tmp_path):
    """An opener that came while the compaction held the lock waits, then opens the
    new file with LMDB's lock table reset for it (a table left from the old file
    points its readers at the wrong meta page: an empty index)."""
    import fcntl
    path = str(tmp_path / "index")
    qa = _merged_index(path)
    st = Store.open(path)
    live = st.snapshot.live
    st.close()
    q, want = qa[0]
    env = base_env()
    env["PYTHONPATH"] = str(ROOT)
    lfd = os.open(os.path.join(path, "lock.mdb"), os.O_RDWR)
    try:
        fcntl.lockf(lfd, fcntl.LOCK_EX, 1, 0, os.SEEK_SET)  # as compact_file holds it
        p = subprocess.Popen([sys.executable, "-c", OPENER, path, q], stdout=subprocess.PIPE, env=env, text=True)
        assert until(lambda: _waits_on_a_lock(p.pid), timeout=60), "the opener never waited on the lock"
        assert p.poll() is None
        assert compact_file(path)  # (its lock and this one are this process's: closing its descriptor frees both)
    finally:
        os.close(lfd)
    out = p.communicate(timeout=60)[0].strip()
    assert out.startswith(f"None {live} [({want[0][0]}, "), out
    _answers_hold(path, qa).close()


def test_a_compaction_killed_leaves_the_old_file_and_its_leftovers_go(tmp_path):
    """A kill after the copy, before the rename, leaves the copy in its folder and the
    old file in place: the next open answers from the old file and removes the copy."""
    path = str(tmp_path / "index")
    qa = _merged_index(path)
    before = os.stat(os.path.join(path, "data.mdb"))
    os.mkdir(os.path.join(path, COMPACTING))
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=8)
    env.copy(os.path.join(path, COMPACTING), compact=True)  # what the killed one had written
    env.close()
    st = _answers_hold(path, qa)
    st.close()
    assert not os.path.exists(os.path.join(path, COMPACTING))
    assert os.stat(os.path.join(path, "data.mdb")).st_ino == before.st_ino


def test_the_index_command_compacts_what_its_build_merged(tmp_path):
    """`lnk-lnkmem index` ends with the index compacted: its file is the pages its
    tables use, whatever merges the build ran."""
    h = Home(tmp_path)
    rng = random.Random(2)
    for i in range(640):  # 640 files over 32 commits: the size tiers merge during the build
        h.write(f"notes/n{i:03}.md", "\n\n".join(" ".join(rng.choices(WORDS, k=40)) for _ in range(6)) + "\n")
    env = {"LNKMEM_BATCH_FILES": "20"}
    index_home(h, env, timeout=120)
    st = Store.open(str(h.state / "index"))
    try:
        assert st.free_share() < 0.1
        assert st.snapshot.live == 640
        with st.env.begin() as txn:  # no merged segment's postings left behind
            listed = {bytes(k) for k in txn.cursor(db=st.segments).iternext(values=False)}
            assert {bytes(k[:4]) for k in txn.cursor(db=st.postings).iternext(values=False)} <= listed
        one = Home(tmp_path / "one")  # the same files in one batch: no merge at all
        for i in range(640):
            one.write(f"notes/n{i:03}.md", (h.folder / "notes" / f"n{i:03}.md").read_text())
        index_home(one, timeout=120)
        ref = Store.open(str(one.state / "index"))
        try:
            def answer(store, q):  # (passage ids differ from build to build: refs and lines)
                hits = search.bm25(store, q, 10)
                return [(p.ref, p.first, round(s, 3)) for p, (_, s) in zip(store.passages_of([h for h, _ in hits]), hits)]

            for q in [" ".join(rng.sample(WORDS, 2)) for _ in range(20)]:
                assert answer(st, q) == answer(ref, q), q
        finally:
            ref.close()
    finally:
        st.close()


def _leftovers(st) -> set:
    with st.env.begin() as txn:
        listed = {bytes(k) for k in txn.cursor(db=st.segments).iternext(values=False)}
        return {bytes(k[:4]) for k in txn.cursor(db=st.postings).iternext(values=False)} - listed


def test_a_merge_that_leaves_its_segments_to_the_compaction_loses_nothing_either_way(tmp_path):
    """A store told to leave merged segments' postings (the people's `index`) answers
    the same at once; its compaction at close copies only listed segments'; a close
    without compaction leaves them to the next open's drop_merge_leftovers."""
    for compact in (True, False):
        path = str(tmp_path / f"index-{compact}")
        rng = random.Random(9)
        st = Store.open(path)
        st.leave_merged = True
        for i in range(6):
            st.commit(Batch(files=[TEXT.file(rng, f"home/d{i}/f{j}.md") for j in range(150)]))
        queries = [" ".join(rng.sample(WORDS, 3)) for _ in range(10)]
        want = [search.bm25(st, q, 10) for q in queries]
        assert st.merge(sorted(st.snapshot.segs))
        assert len(_leftovers(st)) == 6  # the merged six, unlisted, not deleted
        assert all(_same(search.bm25(st, q, 10), w) for q, w in zip(queries, want))
        st.close(compact=compact)
        assert bool(st.compacted) is compact
        st = Store.open(path)
        try:
            assert st.rebuilt_because is None
            if compact:
                assert not _leftovers(st) and st.free_share() < 0.1
            else:
                assert len(_leftovers(st)) == 6
                st.drop_merge_leftovers()
                assert not _leftovers(st)
            assert all(_same(search.bm25(st, q, 10), w) for q, w in zip(queries, want))
        finally:
            st.close()
