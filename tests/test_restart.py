"""Restart on an unchanged tree (issue 12): an index closed whole opens without
being checked again and reads no file; one left by a killed process is checked
whole; damage between runs is still caught; `serve`'s memory does not grow with
each change."""

from __future__ import annotations

import gc
import os
import signal
import time

import lmdb
import pytest

from tests.helpers import Home, Server, index_home, refs, until

CLEAN = "closed cleanly, not checked again"
CHECKED = "not closed cleanly, so read whole and its tables cross-checked"
INFO = {"LNKMEM_LOG": "info"}


@pytest.fixture()
def home(tmp_path):
    h = Home(tmp_path)
    for i in range(30):
        h.write(f"notes/n{i:03}.md", f"The okapi note {i}. " + " ".join(f"k{i}y{j}" for j in range(60)) + "\n")
    return h


def _data(home: Home):
    return home.state / "index" / "data.mdb"


def _seal(home: Home):
    return home.state / "index" / "sealed"


def test_restart_after_a_clean_close_reads_no_file_and_skips_the_cross_check(home):
    first = index_home(home, INFO)
    assert "indexed 30 files" in first
    again = index_home(home, INFO)
    assert CLEAN in again and CHECKED not in again
    assert "indexed 0 files, 30 unchanged" in again
    with Server.start(home, env=INFO) as s:
        s.initialize()
        s.wait_indexed()
        assert len(refs(s.search("okapi", limit=50))) == 30
        s.close()
        assert s.proc.returncode == 0
    assert CLEAN in s.stderr.decode()
    assert CLEAN in index_home(home, INFO)  # serve closed it whole too


def test_restart_after_sigkill_runs_the_cross_check(home):
    index_home(home)
    with Server.start(home, env=INFO) as s:
        s.initialize()
        s.wait_indexed()
        assert not _seal(home).exists()  # open: the seal is gone until a clean close
        home.write("notes/late.md", "A late okapi, written while serving.\n")
        assert until(lambda: "home/notes/late.md" in refs(s.search("late okapi", limit=50)), timeout=20)
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
    out = index_home(home, INFO)
    assert CHECKED in out and CLEAN not in out
    assert "indexed 0 files, 31 unchanged" in out  # what the killed process committed is kept
    assert CLEAN in index_home(home, INFO)


def test_a_killed_process_after_a_clean_close_of_another_still_means_check(home):
    """Two processes: the seal one writes at its close must not cover what the other
    commits after it (the seal names the last transaction)."""
    index_home(home)
    with Server.start(home, env=INFO) as s:
        s.initialize()
        s.wait_indexed()
        assert CHECKED in index_home(home, INFO)  # a second process: serve holds it open, no seal
        assert CLEAN in index_home(home, INFO)  # that one closed it whole, and serve wrote nothing since
        assert _seal(home).exists()
        home.write("notes/after.md", "An okapi written after the other process closed.\n")
        assert until(lambda: "home/notes/after.md" in refs(s.search("okapi written", limit=50)), timeout=20)
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
    out = index_home(home, INFO)
    assert CHECKED in out, out


def test_tables_damaged_between_runs_while_sealed_are_still_caught(home):
    """A write to the file after the clean close (here: a file record dropped behind the
    index's back) breaks the seal: the cross-check runs, finds it, and the index is rebuilt."""
    index_home(home)
    assert _seal(home).exists()
    env = lmdb.open(str(home.state / "index"), max_dbs=8, map_size=1 << 30)
    files = env.open_db(b"files")
    with env.begin(write=True) as txn:
        assert txn.delete(b"home/notes/n007.md", db=files)
    env.close()
    out = index_home(home, INFO)
    assert "index was damaged" in out, out  # by the files table's sum (issue 34), else the cross-check
    assert "the files table does not match its sum" in out or "live passages and files disagree" in out, out
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        assert sorted(refs(s.search("okapi", limit=50))) == [f"home/notes/n{i:03}.md" for i in range(30)]
        assert refs(s.search("k7y3")) == ["home/notes/n007.md"]


def test_a_truncated_file_with_a_forged_seal_is_caught_before_it_is_mapped(home):
    """The pre-map check of the file's own header runs whatever the seal says."""
    index_home(home)
    size = _data(home).stat().st_size
    os.truncate(_data(home), size // 2)
    st = _data(home).stat()
    stamp = _seal(home).read_text().split()
    _seal(home).write_text(" ".join([stamp[0], str(st.st_size), str(st.st_mtime_ns), str(st.st_ino), stamp[4]]))
    out = index_home(home, INFO)
    assert "index was damaged" in out and "indexed 30 files" in out, out


def _rss(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[k] = int(v.split()[0])  # KiB
    return out


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_serve_memory_does_not_grow_with_each_change(tmp_path):
    h = Home(tmp_path)
    for i in range(300):
        h.write(f"d{i % 10}/f{i:03}.md", f"# Page {i}\n\n" + " ".join(f"w{i}z{j} tapir" for j in range(150)) + "\n")
    index_home(h)
    with Server.start(h) as s:
        s.initialize()
        s.wait_indexed()
        pid = s.proc.pid

        def change(n: int) -> None:
            rel = f"d{n % 10}/f{n % 300:03}.md"
            word = f"changeword{n}x"
            with open(h.folder / rel, "a") as f:
                f.write(f"\nA change about {word}.\n")
            assert until(lambda: refs(s.search(word)) == [f"home/{rel}"], timeout=20)
            s.search("tapir")

        for n in range(10):  # warm: caches, the allocator's arenas, the stem memo
            change(n)
        before = _rss(pid)
        for n in range(10, 60):
            change(n)
        after = _rss(pid)
        grew = after["RssAnon"] - before["RssAnon"]
        # 50 changes of a 300-file index: a snapshot or buffer copied per change and kept
        # would show as MiBs; the allocator's noise is well under the bound
        assert grew < 6 * 1024, (before, after)


def test_serve_gives_its_freed_heap_back_at_rest_never_between_searches(home):
    """Searches free heap that glibc keeps; once serve is at rest (nothing queued, no
    search for 2 s) it hands it back, once per spell of searches, and never while
    searches keep coming (a trim holds the allocator's lock: a search would wait)."""
    trimmed = b"heap trimmed"
    with Server.start(home, env={"LNKMEM_LOG": "debug"}) as s:
        s.initialize()
        s.wait_indexed()
        start = len(s.stderr)  # the probes above: their own trim, once at rest
        assert until(lambda: trimmed in s.stderr[start:], timeout=20), s.stderr[start:].decode()
        mark = len(s.stderr)
        end = time.monotonic() + 5
        while time.monotonic() < end:  # a search every 0.3 s: never at rest
            assert refs(s.search("okapi"))
            time.sleep(0.3)
        assert trimmed not in s.stderr[mark:], s.stderr[mark:].decode()
        assert until(lambda: trimmed in s.stderr[mark:], timeout=30)
        once = s.stderr.count(trimmed)
        time.sleep(5)  # kept: at rest a while (two of its 2 s looks) with no search since: no trim more
        assert s.stderr.count(trimmed) == once


def test_a_burst_of_searches_has_the_index_pages_it_mapped_let_go_without_waiting_for_rest(tmp_path, monkeypatch):
    """Each page a search reads maps its cached neighbours too, and they stayed in serve's
    RSS until it rested (600 searches at 1.27M passages: ~200 MiB). Past a bound (here 0:
    at every search) a search asks the indexing thread to let go of them, at once. Here the
    memory never rests (its quiet time made an hour): only the searches' asking lets go."""
    from lnkmem.memory import memory as memory_module
    from lnkmem.memory.config import from_args
    from lnkmem.memory.memory import Memory
    monkeypatch.setattr(memory_module, "IDLE_LET_GO_S", 3600.0)  # no let-go at rest in this test
    h = Home(tmp_path / "h")
    for i in range(200):
        h.write(f"d{i % 5}/f{i:03}.md", " ".join(f"w{i}z{j} okapi" for j in range(200)) + "\n")
    mem = Memory(from_args(*h.args(), {})).start(watch=False)
    try:
        assert mem.ready.wait(60)
        st = mem.store
        where = os.path.realpath(st.data)

        def mapped() -> int:  # KiB of data.mdb resident in this process
            kib, ours = 0, False
            with open("/proc/self/smaps") as f:
                for line in f:
                    head = line.split()
                    if head and "-" in head[0] and not head[0].endswith(":"):
                        ours = line.rstrip("\n").endswith(" " + where)
                    elif ours and head[0] == "Rss:":
                        kib += int(head[1])
            return kib

        assert mem.rank("okapi w3z3", 5)[0]
        assert mapped() > 0  # what searches read stays mapped (below the bound)
        st.MAP_RESIDENT = 0  # any page of the map is let go when asked
        st.SEARCH_MAP_RESIDENT = 0
        st.MAP_CHECK_EVERY = 1
        assert mem.changed("home/d0/f000.md")  # (a change's own let-go: before the burst)
        for i in range(0, 200, 7):
            assert mem.rank(f"w{i}z{i % 200}", 5)[0]

        def let_go() -> bool:
            # a search asks at its look at the index, before its reads: the pages of the burst's
            # last searches may be read after the let-go they asked for, so look as a search does
            # until a let-go follows the last read (the memory never rests: only asking lets go)
            if mapped() == 0:
                return True
            st.refresh()
            return False
        assert until(let_go, timeout=60), mapped()
    finally:
        mem.stop()


def test_ties_are_broken_by_ref_then_place_without_sorting_every_ref():
    """top() orders tied passages by their ref, then by id, as a full
    sort would; it sorts only the tied passages' refs, so a new snapshot (every change)
    costs a search nothing more (the MCP tail after changes)."""
    import random

    import numpy as np

    from lnkmem.index.rank.topk import top
    from lnkmem.index.codec.refs import Refs
    from lnkmem.index.snapshot import Snapshot
    rnd = random.Random(5)
    for _ in range(40):
        n = rnd.randrange(5, 400)
        refs = [f"home/{rnd.choice('abcxyz')}{i}.md" for i in range(rnd.randrange(1, 30))]
        refid = np.array([rnd.randrange(len(refs)) for _ in range(n)], np.int32)
        snap = Snapshot(1, np.ones(n, np.float32), np.ones(n, bool), np.zeros(n, np.uint8), refid, Refs.of(refs), n, float(n))
        cand = np.array(sorted(rnd.sample(range(n), rnd.randrange(1, n))), np.int64)
        sc = np.array([rnd.choice([1.0, 2.0, 2.5]) for _ in cand], np.float32)
        want = rnd.randrange(1, 30)
        got, _ = top(snap, cand, sc, want)

        def key(i):
            r = int(refid[cand[i]])
            return (-float(sc[i]), r < 0, refs[r] if r >= 0 else "", int(cand[i]))

        expect = [int(cand[i]) for i in sorted(range(len(cand)), key=key)[:want]]
        assert got.tolist() == expect


# --- the snapshot saved at a clean close ---------------------------------------------

def _commits(st, rng, n):
    from tests.helpers import SOURCES, RandomText

    from lnkmem.index.commit import Batch
    text = RandomText([f"w{i}" for i in range(40)], (1, 8))  # test_snapshot's
    for k in range(n):
        files = [text.file(rng, f"{rng.choice(SOURCES)}/f{rng.randint(0, 40)}.md", f"v{k}-{i}") for i in range(rng.randint(1, 4))]
        files = list({f.ref: f for f in files}.values())
        st.commit(Batch(files=files))
        if k % 7 == 6 and st.snapshot.segs:
            st.merge(sorted(st.snapshot.segs)[:3])


def _opens_as(path: str, opened_as: str, source: str) -> None:
    """The index at ``path`` opens as ``opened_as``, its snapshot from ``source`` and the
    tables' own."""
    from tests.helpers import assert_same_snapshot

    from lnkmem.index.store import Store
    st = Store.open(path)
    try:
        assert (st.opened_as, st.snapshot_from) == (opened_as, source)
        assert_same_snapshot(st.snapshot, st.load_snapshot(check=True))
    finally:
        st.close()


def test_a_clean_close_saves_the_snapshot_and_a_restart_reads_it_as_the_tables_would(tmp_path):
    import random

    from tests.helpers import assert_same_snapshot

    from lnkmem.index.store import Store
    rng = random.Random(3)
    path = str(tmp_path / "index")
    st = Store.open(path)
    _commits(st, rng, 30)
    st.close()
    st = Store.open(path)
    try:
        assert (st.opened_as, st.snapshot_from) == ("sealed", "saved")
        assert_same_snapshot(st.snapshot, st.load_snapshot(check=True))
        _commits(st, rng, 10)  # extended from the saved one as from a loaded one
        assert_same_snapshot(st.snapshot, st.load_snapshot(check=True))
    finally:
        st.close()


def test_a_saved_snapshot_of_an_older_close_is_never_used(tmp_path):
    import random
    import shutil

    from lnkmem.index.lmdbfile import SNAP
    from lnkmem.index.store import Store
    rng = random.Random(4)
    path = str(tmp_path / "index")
    st = Store.open(path)
    _commits(st, rng, 10)
    st.close()
    shutil.copy(os.path.join(path, SNAP), tmp_path / "old")
    st = Store.open(path)
    _commits(st, rng, 5)
    st.close()
    shutil.copy(tmp_path / "old", os.path.join(path, SNAP))  # the one before the last close
    _opens_as(path, "sealed", "tables")
    # killed (no seal): the saved snapshot is not used either, whatever it says
    st = Store.open(path)
    _commits(st, rng, 3)
    st.env.close()  # as a killed process leaves it: no seal, no new snapshot file
    del st  # (and gone, as that process is: the index is no longer open in this one)
    gc.collect()
    _opens_as(path, "checked", "tables")


def test_deletions_never_leave_the_file_looking_truncated(tmp_path):
    """LMDB may end data.mdb short of the pages it counts (a page allocated and freed
    in one transaction is never written): the index's own commits must not make the
    truncation checks call a sound index damaged (seen as 'data.mdb holds N bytes but
    the index uses N + 4096' while a merge deleted old postings)."""
    import random

    from lnkmem.index.lmdbfile import check_file
    from lnkmem.index.store import Store

    st = Store.open(str(tmp_path / "index"))
    rng = random.Random(5)
    try:
        for _ in range(120):
            with st.env.begin(write=True) as txn:
                for _ in range(rng.randint(1, 300)):
                    txn.put(b"x" + rng.randbytes(8), rng.randbytes(rng.randint(10, 3000)), db=st.meta)
                cur = txn.cursor(db=st.meta)
                if cur.set_range(b"x"):
                    for _ in range(rng.randint(0, 250)):
                        if not cur.key().startswith(b"x") or not cur.delete():
                            break
            st.guard()  # raises DamagedWhileServing when the file looks shorter than its pages
            check_file(os.path.join(str(tmp_path / "index"), "data.mdb"))
    finally:
        st.close()


def test_serve_looks_at_the_tree_once_at_start_then_only_at_what_changes(home):
    """The watch is in place before the first look at the tree, so nothing changed
    meanwhile can be missed and no second look over the whole tree follows (at 120k
    files a second look took ~2 s, and a change made then waited behind it)."""
    with Server.start(home, env={"LNKMEM_LOG": "debug"}) as s:
        s.initialize()
        s.wait_indexed()
        assert until(lambda: b"caught up" in s.stderr, timeout=30), s.stderr[-2000:]  # past the watcher's first quiet spell
        home.write("notes/n003.md", "The okapi note 3 says zebrafinch now.\n")
        until(lambda: refs(s.search("zebrafinch")) == ["home/notes/n003.md"], timeout=10)
        s.close()
    err = s.stderr.decode()
    looks = [line for line in err.splitlines() if "looked at" in line]
    assert sum("looked at every source" in x for x in looks) == 1, looks
    whole = [x for x in looks if x.split("looked at ")[1].split(":")[0] in ("home", "chats", "skills", "notes")]
    assert not whole, looks
    assert any("looked at home/notes/n003.md" in x for x in looks), looks


def test_a_restarts_first_search_is_answered_before_the_tree_is_watched_or_listed(home):
    """Issue 47: `serve` on an index as it was left answers the search sent right after
    `initialize` from that index, and only then places its watch and lists the Home (both
    share the GIL with the search; placing the watch holds it for the whole walk of the
    folders). The order is the log's: one process's lines, in the order they happened."""
    index_home(home)
    with Server.start(home, env={"LNKMEM_LOG": "debug"}) as s:
        s.initialize()
        assert len(refs(s.search("okapi", limit=50))) == 30
        assert until(lambda: b"looked at every source" in s.stderr, timeout=30), s.stderr[-2000:]
        # the watch is in place and the look done: a change is still found
        home.write("notes/n004.md", "The okapi note 4 says capybara.\n")
        assert until(lambda: refs(s.search("capybara")) == ["home/notes/n004.md"], timeout=30)
        s.close()
    err = s.stderr.decode()
    answered = err.index("a search answered")
    assert answered < err.index(": in place after") and answered < err.index("home: 30 files listed"), err


def test_a_restart_that_is_never_searched_still_watches_and_looks_at_the_tree(home):
    """No search waits: the watch and the first look at the tree go ahead on their own."""
    index_home(home)
    with Server.start(home, env={"LNKMEM_LOG": "debug"}) as s:
        s.initialize()
        assert until(lambda: b"looked at every source" in s.stderr, timeout=30), s.stderr[-2000:]
        home.write("notes/n005.md", "The okapi note 5 says pangolin.\n")
        assert until(lambda: b"looked at home/notes/n005.md" in s.stderr, timeout=30), s.stderr[-2000:]
        assert refs(s.search("pangolin")) == ["home/notes/n005.md"]
        s.close()


def test_a_restart_on_an_unchanged_tree_leaves_the_saved_snapshot_as_it_is(home):
    """Nothing written: the snapshot saved at the last close is still the index's, so
    it is not written again (23 MB at 1.27M passages), and the next open still uses it."""
    from lnkmem.index.lmdbfile import SNAP
    index_home(home)
    snap = home.state / "index" / SNAP
    before = os.stat(snap)
    err = index_home(home, INFO)
    assert "30 unchanged" in err
    after = os.stat(snap)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert "snapshot as saved" in index_home(home, INFO)
    home.write("notes/n001.md", "The okapi note 1, changed.\n")
    index_home(home)
    assert os.stat(snap).st_ino != before.st_ino  # a change: saved anew
    assert "snapshot as saved" in index_home(home, INFO)


def test_a_sealed_index_reads_its_saved_snapshot_only_when_asked(tmp_path):
    """An open that changes nothing (a restart on an unchanged tree) never decodes the saved
    snapshot, counts its passages from the tables, and leaves the snapshot for the next
    open; a write that did not need it saves it again under the new stamp; a saved
    snapshot whose body is broken gives way to the tables."""
    import random

    from tests.helpers import assert_same_snapshot

    from lnkmem.index.lmdbfile import SNAP
    from lnkmem.index.store import Store
    rng = random.Random(5)
    path = str(tmp_path / "index")
    st = Store.open(path)
    _commits(st, rng, 12)
    live = st.snapshot.live
    st.close()
    snap = os.path.join(path, SNAP)
    before = os.stat(snap)

    st = Store.open(path)
    assert not st.snapshot_read and st.live_count() == live
    st.close()
    assert (os.stat(snap).st_ino, os.stat(snap).st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    st = Store.open(path)
    st.put_meta(b"watched", b"1")  # a transaction that never asked for the snapshot
    assert not st.snapshot_read
    st.close()
    _opens_as(path, "sealed", "saved")

    with open(snap, "r+b") as f:  # the stamp kept, the body broken
        head = f.readline()
        f.seek(len(head) + 5)
        f.write(b"\xff" * 64)
    st = Store.open(path)
    try:
        assert not st.snapshot_read  # the stamp agreed: read when asked
        assert st.snapshot_from == "tables"
        assert_same_snapshot(st.snapshot, st.load_snapshot(check=True))
        assert st.snapshot.live == live
    finally:
        st.close()


def _matched(err: str) -> set[str]:
    """The sources an `index` run (LNKMEM_LOG=info) found listed as the index last matched them."""
    return {line.split("lnkmem: INFO: ")[1].split(":")[0] for line in err.splitlines()
            if "as the index last matched them; none compared" in line}


def test_a_restart_on_an_unchanged_tree_compares_no_file_and_any_change_is_still_found(home):
    """A source listed exactly as at the last clean close (every path, size and version),
    nothing committed since, needs no file compared with the index (at 120k files the
    compare read every file's record: 0.3 s warm, ~8 s right after a build's compaction,
    whose copy bypasses the page cache). Any difference in the listing compares as before."""
    first = index_home(home, INFO)
    assert "indexed 30 files" in first and "home" not in _matched(first)
    again = index_home(home, INFO)
    assert "home" in _matched(again) and "indexed 0 files, 30 unchanged" in again
    home.write("notes/n007.md", "The okapi note 7 says quetzal.\n")
    err = index_home(home, INFO)
    assert "home" not in _matched(err) and "indexed 1 file, 29 unchanged" in err
    (home.folder / "notes" / "n008.md").unlink()
    err = index_home(home, INFO)
    assert "home" not in _matched(err) and "29 unchanged, 1 removed" in err
    assert "home" in _matched(index_home(home, INFO))
    # serve's own changes after its first look: closed with no listing noted, so the next
    # index compares (and finds the change already in)
    with Server.start(home, env={"LNKMEM_LOG": "debug"}) as s:
        s.initialize()
        s.wait_indexed()
        assert until(lambda: b"caught up" in s.stderr, timeout=30), s.stderr[-2000:]  # past the watcher's first quiet spell
        home.write("notes/n009.md", "The okapi note 9 says axolotl.\n")
        until(lambda: refs(s.search("axolotl")) == ["home/notes/n009.md"], timeout=10)
        s.close()
    err = index_home(home, INFO)
    assert "home" not in _matched(err) and "indexed 0 files, 29 unchanged" in err
    assert "home" in _matched(index_home(home, INFO))
    with Server.start(home, env=INFO) as s:  # serve's first look uses it too
        s.initialize()
        s.wait_indexed()
        assert refs(s.search("quetzal")) == ["home/notes/n007.md"]
        s.close()
    assert "home: 29 files listed as the index last matched them" in s.stderr.decode()


def test_a_build_that_could_not_read_a_file_as_listed_notes_no_listing(tmp_path):
    """Only a build that indexed every file of a listing as listed may say the index
    matches it: a file gone (or unreadable) between the listing and its read would
    otherwise stay out of the index while the tree lists it unchanged."""
    from lnkmem.bridges.local import LocalPlace
    from lnkmem.index.build import indexer
    from lnkmem.index.store import Store
    root = tmp_path / "home"
    root.mkdir()
    for i in range(5):
        (root / f"f{i}.md").write_text(f"okapi file {i}\n")
    places = {"home": LocalPlace(str(root))}
    st = Store.open(str(tmp_path / "index"))
    try:
        plan = indexer.plan(st, places)
        (root / "f2.md").unlink()  # listed, gone before it is read
        indexer.build(st, places, plan, str(tmp_path))
        assert st.listed("home") is None
        plan = indexer.plan(st, places)  # compared: f2 went out of the index as out of the tree
        assert plan.total == 0 and plan.listed == 4
        indexer.build(st, places, plan, str(tmp_path))
        assert st.listed("home") == plan.digests["home"]
        assert indexer.plan(st, places).total == 0
        (root / "f3.md").write_text("okapi file 3, longer now\n")
        plan = indexer.plan(st, places)
        assert [e.path for _, e in plan.todo] == ["f3.md"]
    finally:
        st.close()
