"""One merge's run: segments merged into a new one in bounded write steps, their dead
passages dropped (:func:`merge`); what a merge killed or stopped between its steps left,
dropped (:func:`drop_merge_leftovers`).

A merge streams (docs/SCALE-NOTES.md item 2): a k-way merge by term over the merged
segments' postings (each segment's keys are term-sorted, :mod:`.steps`), one term in memory
at a time, written under a new segment id in write transactions of about ``STEP_BYTES``;
a segment not listed in ``segments`` is invisible to readers, so those writes change
nothing anyone sees. The last transaction lists the new segment and unlists the old
ones, dropping the passages that were dead when the merge began; the old segments'
postings are deleted after it, again in bounded transactions. The write lock is held
per step, so commits go on beside a merge; a passage a commit kills meanwhile stays
dead-marked in the new segment (the next merge drops it). A process killed between
steps leaves only postings of a segment not listed: :func:`drop_merge_leftovers` deletes them.

What one merge holds while it runs (its segments, the new one's id, the dead mask, the
segments copied as stored, its postings' sum) is a :class:`MergeJob`'s, not the store's;
the store is the one the functions here are given (its tables, locks and snapshot).
"""

from __future__ import annotations

import contextlib
import logging
import os
from array import array
from typing import Optional

import lmdb
import numpy as np

from lnkmem.core import memtrim, procs
from lnkmem.index import snapshot as snapshots
from lnkmem.index.commit import files_sum
from lnkmem.index.format import CRC, FCRC, FILES_SUM, PCRC, PostingsSum, id_key, seg_codec
from lnkmem.index.lmdbfile import release_map
from lnkmem.index.merge import steps as merge_steps
from lnkmem.index.merge.steps import Abandoned, dead_of

MERGING = b"merging/"  # meta: merging/<segment> -> the pid of the process writing that merge


def merge(store, segs: list[int], should_stop=None) -> bool:
    """Merge segments into one, dropping their dead passages; False when nothing was
    merged (stopped by ``should_stop``, or a segment went away meanwhile). The caller
    guards the store (:meth:`Store.merge`)."""
    segs = sorted(set(int(s) for s in segs))
    if not segs:
        return False
    stop = should_stop or (lambda: False)
    with store.merge_lock:
        drop_merge_leftovers(store)
        if len(segs) < 2 and not has_dead(store, segs):
            return False
        job = MergeJob.begin(store, segs)
        if job is None:
            return False
        new = job.new
        try:
            job.write_postings(stop)
            done = step(store, job.end)
        except Abandoned:
            done = None
        finally:
            store.merging = frozenset()
        if done is None:  # stopped, or the segments changed under it: its postings are garbage
            if not stop():
                delete_segment_postings(store, new, stop)
                step(store, lambda: unregister(store, new))
            return False
        if store.leave_merged:  # unlisted now: dropped by the compaction at close (else the next drop_merge_leftovers)
            store.left_merged = True
        else:
            for s in segs:  # unlisted now: nobody reads these any more
                if stop():
                    break  # left for the next drop_merge_leftovers
                delete_segment_postings(store, s, stop)
    store.changed()
    return True

def step(store, fn):
    """One write step of a merge, under the write lock; a full map grows and the step alone
    runs again."""
    with store.write_lock:
        store.guard()
        while True:
            try:
                return fn()
            except lmdb.MapFullError:
                store.env.set_mapsize(store.env.info()["map_size"] * 2)

def has_dead(store, segs: list[int]) -> bool:
    """Whether any of ``segs`` holds a dead passage."""
    snap = store.snapshot
    if snap.seg_of is None:
        with store.env.begin() as txn:
            return txn.stat(store.dead)["entries"] > 0
    n = min(len(snap.seg_of), len(snap.alive))
    return bool((np.isin(snap.seg_of[:n], segs) & ~snap.alive[:n]).any())


class MergeJob:
    """One merge under way: the segments merged, the new segment's id, the passages dead
    when it began (a mask by id), the segments holding none (their lists copied as
    stored) and the sum of the postings written so far."""

    def __init__(self, store, segs: list[int], new: int, deadmask: np.ndarray):
        self.store = store
        self.segs = segs
        self.new = new
        self.deadmask = deadmask
        self.clean: frozenset = frozenset()
        self.summed = PostingsSum()

    @classmethod
    def begin(cls, store, segs: list[int]) -> Optional["MergeJob"]:
        """Take the new segment's id (registered in ``meta`` as a merge of this process's);
        None when a segment to merge is no longer listed."""

        def begin():
            with store.env.begin(write=True) as txn:
                if any(txn.get(id_key(s), db=store.segments) is None for s in segs):
                    return None
                new = int(txn.get(b"next_seg", db=store.meta))
                txn.put(b"next_seg", str(new + 1).encode(), db=store.meta)
                txn.put(MERGING + id_key(new), str(os.getpid()).encode(), db=store.meta)
                # the passages dead now are dropped by this merge: a mask by id (one gather a term)
                dead = np.fromiter((int.from_bytes(k, "big") for k in
                                    txn.cursor(db=store.dead).iternext(values=False)), np.int64)
                top = max(int(dead.max()) if len(dead) else 0, int(txn.get(b"next_pid", db=store.meta)))
                mask = np.zeros(top + 1, bool)
                mask[dead] = True
                job = cls(store, segs, new, mask)
                # the segments holding none of them: their postings are copied as they are stored
                snap = store.snapshot
                if snap.seg_of is not None and snap.gen == int(txn.get(b"gen", db=store.meta)):
                    d = dead[dead < len(snap.seg_of)]
                    job.clean = frozenset(segs) - set(snap.seg_of[d].tolist())
                store.merging = frozenset(segs)  # a commit no longer drops them when wholly dead
                return job

        return step(store, begin)

    def write_postings(self, stop) -> None:
        """Write the merged segments' live postings under ``new``, term by term, in steps
        (:func:`merge_steps.steps`); a large merge's upper terms read and joined by a
        helper process (the second core, :func:`merge_steps.start`), whose steps this
        thread writes between its own."""
        store, segs, new = self.store, self.segs, self.new
        job = merge_steps.Job(store.here, store.data, segs, new, sorted(self.clean), store.STEP_BYTES,
                              store.JOIN_BYTES, store.MAP_RESIDENT, store.env.info()["map_size"])
        helper = None
        sizes = segment_sizes_of(store, store.snapshot)
        passages = sum(sizes.get(s, 0) for s in segs)
        if passages >= merge_steps.SHARED_PASSAGES:
            # the heap freed before (a build's batches) back first: a large merge's peak comes
            # on top of what is held, not of that (a 10x build's merge starts lower)
            memtrim.trim()
        if merge_steps.shared(passages):
            mid = self.split(sizes)
            if mid is not None:
                helper = merge_steps.start(job, self.deadmask, mid)
        hi = helper.lo if helper is not None else None
        summed = self.summed

        def put(items: list, theirs: bool = False) -> None:
            if items:
                step(store, lambda: self.put_postings(items))
                for k, v in items:  # (once written: a step retried is not summed twice)
                    summed.add(k, v)
            if theirs:  # (the pages its write walked; this thread's steps let go of theirs)
                store.let_go_of_map()

        try:
            for items in merge_steps.steps(job, store.env, store.postings, self.deadmask, None, hi, stop):
                put(items)
                while helper is not None and helper.ready():
                    put(helper.next(stop), True)
            if helper is not None:
                while not helper.done:
                    put(helper.next(stop), True)
                if not helper.whole:  # it failed: the rest of its share here
                    logging.getLogger("lnkmem").warning("the merge's helper process failed (%s): its terms are merged "
                                                        "here", helper.error)
                    for items in merge_steps.steps(job, store.env, store.postings, self.deadmask,
                                                   helper.resume(), None, stop):
                        put(items)
        finally:
            if helper is not None:
                helper.close()
                if not helper.whole:  # killed: its slot in the reader table would pin pages
                    with contextlib.suppress(lmdb.Error):
                        store.env.reader_check()

    def split(self, sizes: dict) -> Optional[bytes]:
        """The term from which the helper merges (its share of the postings by the bytes
        of the largest segment's lists: the segments of a build hold much the same words),
        None when there is none."""
        big = id_key(max(self.segs, key=lambda s: sizes.get(s, 0)))
        with self.store.env.begin(buffers=True) as txn:
            cur = txn.cursor(db=self.store.postings)
            lens = array("q")
            if cur.set_range(big):
                for k, v in cur:
                    if k[:4] != big:
                        break
                    lens.append(len(v))
            if len(lens) < 2:
                return None
            half = int(np.searchsorted(np.cumsum(np.frombuffer(lens, np.int64)), sum(lens) * (1 - merge_steps.HELPER_SHARE)))
            if not 0 < half < len(lens):
                return None
            cur.set_range(big)
            for _ in range(half):
                cur.next()
            mid = bytes(cur.key()[4:])
        release_map(self.store.data)
        return mid

    def put_postings(self, items: list) -> None:
        store = self.store
        with store.env.begin(write=True) as txn:
            if any(txn.get(id_key(s), db=store.segments) is None for s in self.segs):
                raise Abandoned()  # dropped by a commit (all dead) or replaced by a copy
            txn.cursor(db=store.postings).putmulti(items)

    def end(self) -> Optional[tuple]:
        """The last transaction: list the new segment, unlist the merged ones, drop the ids
        dead when the merge began; then the snapshot. None when a segment went away."""
        store, segs, new = self.store, self.segs, self.new
        dead = self.deadmask
        snap = store.snapshot
        with store.env.begin(write=True) as txn:
            listed = txn.cursor(db=store.segments)
            if not all(listed.set_key(id_key(s)) for s in segs):
                return None
            # each segment's record as stored (refs as runs), one at a time: no list a passage
            all_p, all_l, names, runs, gone = [], [], [], [], []
            psum, psums = PostingsSum(), []  # the new segment's live passages: its segments' sums
            for s in segs:
                st, rn = seg_codec.stored(txn.get(id_key(s), db=store.segments))
                store.let_go_of_map()  # (a record of the final merge's segments: overflow pages, megabytes)
                p = np.frombuffer(st.pids, "<u4")
                ln = np.frombuffer(st.lens, "<u4")
                nm = st.names
                d = dead_of(dead, p)
                if d.any():
                    left = np.bincount(np.repeat(np.arange(len(rn)), rn)[~d], minlength=len(rn))
                    nm = [x for x, k in zip(nm, (left > 0).tolist()) if k]
                    rn = left[left > 0]
                    for q in p[d].tolist():
                        txn.delete(id_key(q), db=store.dead)
                        txn.delete(id_key(q), db=store.vectors)
                        txn.delete(id_key(q), db=store.vec_pending)
                    gone.append(p[d])
                    p, ln = p[~d], ln[~d]
                all_p.append(p)
                all_l.append(ln)
                names.extend(nm)
                runs.append(rn)
                txn.delete(id_key(s), db=store.segments)
                txn.delete(CRC + id_key(s), db=store.meta)
                psums.append(txn.get(PCRC + id_key(s), db=store.meta))
                txn.delete(PCRC + id_key(s), db=store.meta)
            kept = np.concatenate(all_p).astype(np.int64) if all_p else np.empty(0, np.int64)
            summed = self.summed
            if len(kept):
                txn.put(CRC + id_key(new), summed.value(), db=store.meta)
            if len(kept) and all(psum.add_sum(p) for p in psums):
                txn.put(PCRC + id_key(new), psum.value(), db=store.meta)
            if len(kept):
                txn.put(id_key(new), seg_codec.encode_runs(kept.astype("<u4").tobytes(), np.concatenate(all_l).astype(
                    "<u4").tobytes(), names, np.concatenate(runs)), db=store.segments)
            del all_p, all_l, names, runs
            txn.delete(MERGING + id_key(new), db=store.meta)
            was = int(txn.get(b"gen", db=store.meta))
            gen = was + 1
            fsum = files_sum(store, txn)  # (a merge changes no file record: the sum stands)
            txn.put(b"gen", str(gen).encode(), db=store.meta)
            if fsum is not None:
                txn.put(FCRC, FILES_SUM.pack(gen, fsum.total, fsum.n), db=store.meta)
        gone_a = np.concatenate(gone).astype(np.int64) if gone else np.empty(0, np.int64)
        # the merged segments' part replaced; read anew only after another process wrote
        fresh = snap.seg_of is not None and was == snap.gen
        store.snapshot = snapshots.merged(snap, segs, new, gen, kept, gone_a, store.buffers, store.REFS_SLACK) \
            if fresh else store.load_snapshot()
        return new, gen


def unregister(store, new: int) -> None:
    """Forget a merge given up (its registration in ``meta``)."""
    with store.env.begin(write=True) as txn:
        txn.delete(MERGING + id_key(new), db=store.meta)


def delete_segment_postings(store, seg: int, stop=lambda: False) -> None:
    """Delete the postings stored under ``seg`` (not listed), a bounded number a transaction."""
    sk = id_key(seg)
    per = max(store.STEP_BYTES // 64, 16)

    def some() -> bool:
        with store.env.begin(write=True) as txn:
            cur = txn.cursor(db=store.postings)
            n = 0
            if cur.set_range(sk):
                while n < per and cur.key()[:4] == sk:
                    if not cur.delete():
                        return False
                    n += 1
                return n == per
            return False

    while step(store, some):
        release_map(store.data)  # the leaf pages it walked
        if stop():
            return
    release_map(store.data)


def drop_merge_leftovers(store) -> list[int]:
    """Delete the postings of segments not listed (a merge killed or stopped between its
    steps), but a merge's still under way in another live process; returns the segments
    whose postings were dropped. The caller holds the store's merge lock."""
    with store.env.begin() as txn:
        listed = {int.from_bytes(k, "big") for k in txn.cursor(db=store.segments).iternext(values=False)}
        cur = txn.cursor(db=store.postings)
        found, s = [], 0
        while cur.set_range(id_key(s)):  # one seek a segment, not a read of every key
            s = int.from_bytes(cur.key()[:4], "big")
            if s not in listed:
                owner = txn.get(MERGING + id_key(s), db=store.meta)
                if owner is None or not live_elsewhere(owner):
                    found.append(s)
            s += 1
        stale = [bytes(k) for k in txn.cursor(db=store.meta).iternext(values=False)
                 if bytes(k).startswith(MERGING) and int.from_bytes(bytes(k)[len(MERGING):], "big") not in listed
                 and not live_elsewhere(txn.get(k, db=store.meta))]
    for s in found:
        delete_segment_postings(store, s)
    if stale:
        def forget():
            with store.env.begin(write=True) as txn:
                for k in stale:
                    txn.delete(k, db=store.meta)
        step(store, forget)
    store.merger.leftovers_dropped = True
    return found


def segment_sizes_of(store, snap) -> dict:
    """Passages by segment: the snapshot's, else read from the segments' records."""
    return snap.segs if snap.segs is not None else store.segment_sizes()


def live_elsewhere(owner) -> bool:
    """Whether a merge registered by process ``owner`` (its pid) may still be writing:
    another process, alive (this process's merges are one at a time, under its lock)."""
    try:
        pid = int(owner)
    except (TypeError, ValueError):
        return False
    return pid != os.getpid() and pid > 0 and procs.alive(pid)
