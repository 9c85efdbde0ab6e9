"""The in-memory snapshot is extended by each commit and patched by each merge,
never read anew from every segment: after any run of commits, removals, id reuse
and merges it must equal the snapshot read from the index, and searches must
rank as they would on a freshly opened index."""

import random

import numpy as np

from lnkmem.index.rank import checks, search, terms
from lnkmem.index.commit import Batch
from lnkmem.index.store import Store
from tests.helpers import SOURCES, RandomText, assert_same_snapshot, random_file

VOCAB = [f"w{i}" for i in range(40)]
TEXT = RandomText(VOCAB, (1, 8))


def test_random_commits_and_merges_keep_the_snapshot_equal_to_a_fresh_load(tmp_path):
    rng = random.Random(12)
    st = Store.open(str(tmp_path / "index"))
    st.REFS_SLACK = -10 ** 9  # refs of removed files dropped at every merge that finds any
    refs: dict[str, int] = {}
    version = 0
    shrunk = longest = 0
    try:
        for step in range(300):
            op = rng.random()
            if op < 0.12 and st.snapshot.segs:
                segs = list(st.snapshot.segs)
                st.merge(rng.sample(segs, rng.randint(1, len(segs))))
            elif op < 0.17:
                st.maybe_merge(factor=3)
            else:
                files, removed = [], []
                for _ in range(rng.choice((1, 1, 1, 2, 5))):
                    if refs and rng.random() < 0.25:
                        removed.append(rng.choice(sorted(refs)))
                    else:
                        version += 1
                        ref = f"{rng.choice(SOURCES)}/f{rng.randint(0, 60)}.md"
                        files.append(TEXT.file(rng, ref, f"v{version}"))
                # a ref is either rewritten or removed in one batch, as the indexer does
                removed = [r for r in dict.fromkeys(removed) if r not in {f.ref for f in files}]
                files = list({f.ref: f for f in files}.values())
                st.commit(Batch(files=files, removed=removed))
                for r in removed:
                    refs.pop(r, None)
                for f in files:
                    refs[f.ref] = 1
            kept = st.snapshot
            assert_same_snapshot(kept, st.load_snapshot())
            assert len(set(kept.refs)) == len(kept.refs)
            shrunk += len(kept.refs) < longest
            longest = len(kept.refs)
            if step % 25 == 0:
                q = " ".join(rng.sample(VOCAB, 3))
                got, _ = search.words(st, q, 10)
                st.snapshot = st.load_snapshot()
                again, _ = search.words(st, q, 10)
                assert [p for p, _ in got] == [p for p, _ in again]
                assert np.allclose([s for _, s in got], [s for _, s in again])
                st.snapshot = kept  # go on extending the incremental one
        assert st.snapshot.live == sum(len(r.pids) for r in st.all_files().values())
        assert shrunk  # refs of removed files were dropped by merges
    finally:
        st.close()


def test_a_search_holding_the_old_snapshot_never_sees_a_reused_id_change(tmp_path):
    """An id freed and given again in one commit: the snapshot a search still holds
    keeps that passage's length and ref as they were."""
    st = Store.open(str(tmp_path / "index"))
    try:
        a = TEXT.file(random.Random(1), "home/a.md", "v1")
        b = TEXT.file(random.Random(2), "notes/b.md", "v1")
        st.commit(Batch(files=[a]))
        st.commit(Batch(files=[b]))
        old = st.snapshot
        pids = np.flatnonzero(old.alive)
        before = (old.doclen[pids].copy(), [old.refs[i] for i in old.refid[pids]], old.src[pids].copy())
        st.commit(Batch(files=[TEXT.file(random.Random(3), "skills/c.md", "v1")], removed=["home/a.md"]))
        assert (old.doclen[pids] == before[0]).all()
        assert [old.refs[i] for i in old.refid[pids]] == before[1]
        assert (old.src[pids] == before[2]).all()
        assert old.alive[pids].all()
        assert_same_snapshot(st.snapshot, st.load_snapshot())
    finally:
        st.close()


def test_a_search_refreshing_during_a_commit_does_not_count_the_commit_twice(tmp_path):
    """A search's refresh may read the index between a commit's transaction and the
    new snapshot (events.allocated runs there): the commit still extends the snapshot it began
    from, so passages killed or added are counted once."""
    st = Store.open(str(tmp_path / "index"))
    try:
        rng = random.Random(5)
        st.commit(Batch(files=[TEXT.file(rng, "home/a.md", "v1"), TEXT.file(rng, "home/b.md", "v1")]))
        st.events.allocated = lambda ids: st.refresh()
        st.commit(Batch(files=[TEXT.file(rng, "home/a.md", "v2")], removed=["home/b.md"]))
        st.events.allocated = None
        assert_same_snapshot(st.snapshot, st.load_snapshot())
        got, _ = search.words(st, " ".join(VOCAB), 50)
        assert {st.snapshot.refs[st.snapshot.refid[p]] for p, _ in got} == {"home/a.md"}
    finally:
        st.close()


def test_a_search_on_another_thread_during_a_commit_waits_for_the_commit_s_snapshot(tmp_path):
    """Between a commit's transaction and its snapshot, the index's generation is ahead of
    the snapshot: a search on another thread then must take the snapshot the commit is
    about to publish, not read every segment anew (at 1.27M passages that read took
    ~0.5 s and doubled the heap: every search beside a change paid it)."""
    import threading
    import time

    st = Store.open(str(tmp_path / "index"))
    try:
        rng = random.Random(6)
        st.commit(Batch(files=[TEXT.file(rng, f"home/{i}.md", "v1") for i in range(20)]))
        got, threads = [], []

        def search_beside(ids):
            t = threading.Thread(target=lambda: got.append(st.refresh()))
            t.start()
            threads.append(t)
            time.sleep(0.3)  # kept: the window widened, the search reads the generation while the commit is here

        st.events.allocated = search_beside
        st.commit(Batch(files=[TEXT.file(rng, "home/new.md", "v1")]))
        st.events.allocated = None
        threads[0].join(10)
        assert len(got) == 1 and got[0] is st.snapshot  # the commit's own, not one read anew
        assert_same_snapshot(st.snapshot, st.load_snapshot())
    finally:
        st.close()


def test_an_old_snapshot_is_let_go_once_a_commit_replaced_it(tmp_path):
    """A search computes a snapshot's facts (its shortest live length, its segments'
    dead) once; after a commit, nothing the searches keep holds the old snapshot (its
    arrays are megabytes at a million passages), even before any search asks for the
    new one's facts (or, after a dated search, its files' times)."""
    import gc
    import weakref
    st = Store.open(str(tmp_path / "index"))
    try:
        for i in range(3):
            st.commit(Batch(files=[TEXT.file(random.Random(i), f"home/f{i}.md", "v1")]))
        st.commit(Batch(removed=["home/f0.md"]))  # dead passages: the facts name their segment
        old = st.snapshot
        search.words(st, " ".join(VOCAB[:4]), 5)
        assert terms.facts_known(old) is not None  # computed for this snapshot
        search.words(st, " ".join(VOCAB[:4]), 5, after=0.0)  # files' times kept for this snapshot
        assert old.worked_out.get(checks.FILE_TIMES) is not None
        gone = weakref.ref(old)
        del old
        st.commit(Batch(files=[TEXT.file(random.Random(9), "home/f9.md", "v1")]))
        gc.collect()
        assert gone() is None
    finally:
        st.close()


def test_a_list_s_dead_are_counted_once_a_snapshot_and_anew_after_each_change(tmp_path):
    """A search counts how many of its segment's dead passages a long list holds (its
    live df) and keeps the count for the snapshot; after each change the counts are
    made anew: the ranking is always that of every posting scored, the dead dropped."""
    st = Store.open(str(tmp_path / "index"))
    try:
        rng = random.Random(7)
        st.commit(Batch(files=[random_file(rng, f"home/f{i:03}.md", "v1", VOCAB, None, (20, 40))
                               for i in range(120)]))  # one segment: its lists long beside its few dead
        q = " ".join(VOCAB[:3])
        for gone in (["home/f000.md", "home/f001.md"], ["home/f002.md"], ["home/f003.md", "home/f004.md"]):
            st.commit(Batch(removed=gone))
            first, _ = search.words(st, q, 10)
            again, _ = search.words(st, q, 10)  # with the counts kept for this snapshot
            kept = st.snapshot
            assert terms.facts_known(kept)[2]  # (counted by looking the dead up, and kept)
            fresh, _ = search.words(st, q, 10, prune=False)  # every posting scored, each list's live ones decoded
            assert first == again
            assert [p for p, _ in first] == [p for p, _ in fresh]
            assert np.allclose([s for _, s in first], [s for _, s in fresh], rtol=1e-6)
    finally:
        st.close()
