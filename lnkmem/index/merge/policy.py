"""Which segments to merge, and when: log-structured tiers by size (:func:`plan`), merged
here or on a merger thread of the store's own (:class:`Merger`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from typing import Optional

import numpy as np

from lnkmem.core import memtrim
from lnkmem.core.errors import DamagedIndex
from lnkmem.index.merge import run


def plan(store, factor: Optional[int] = None) -> list[int]:
    """The segments to merge next, or []: log-structured tiers by size (in passages,
    from the snapshot), the lowest tier holding ``factor`` segments first, all of that
    tier together; else a segment more than DEAD_SHARE dead, alone. A merge never
    rewrites segments of a larger tier than its own, so a few live changes never
    make a merge of most of the index."""
    factor = factor or store.MERGE_FACTOR
    snap = store.refresh()
    sizes = run.segment_sizes_of(store, snap)
    tiers: dict[int, list[int]] = {}
    for s, n in sizes.items():
        tiers.setdefault(tier(n, store.TIER_FLOOR, factor), []).append(s)
    for t in sorted(tiers):
        if len(tiers[t]) >= factor:
            return sorted(tiers[t])
    if snap.seg_of is not None and sizes:
        n = min(len(snap.seg_of), len(snap.alive))
        of = snap.seg_of[:n][~snap.alive[:n]]
        of = of[of >= 0]
        if len(of):
            dead = np.bincount(of)
            for s in sorted(sizes):
                if s < len(dead) and dead[s] > store.DEAD_SHARE * sizes[s]:
                    return [s]
    return []


def tier(n: int, floor: int, factor: int) -> int:
    """A segment's tier by its size in passages: 0 below ``floor``, then one a power of ``factor``."""
    t = 0
    while n >= floor * factor:
        n //= factor
        t += 1
    return t


class Merger:
    """A store's merging: :meth:`maybe_merge` merges what :func:`plan` asks for, here or on
    the merger thread once :meth:`start` started it; what a merge killed before this open
    left is dropped once (:attr:`leftovers_dropped`)."""

    def __init__(self, store):
        # (weakly: a store let go of is freed as its last reference goes, not at a collection
        # of cycles -- a retired one's environment closes then, its unlinked file's space back)
        self._store = weakref.ref(store)
        self.thread: Optional[threading.Thread] = None
        self.leftovers_dropped = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._holds = 0  # callers holding merges off (:meth:`held`)
        self._holds_lock = threading.Lock()
        self._running = threading.Lock()  # a start and a stop one at a time (a stop never joins a thread not started)

    @property
    def store(self):
        return self._store()

    @contextlib.contextmanager
    def held(self):
        """No merge starts while this is held, and one under way is waited for first: a
        write-back's peak is then its own, not its own and a merge's (10x: the merges of a
        re-index's segments ran beside the first write-back). Merges resume at the release."""
        with self._holds_lock:
            self._holds += 1
        try:
            with self.store.merge_lock:  # (a merge under way finishes first)
                pass
            yield
        finally:
            with self._holds_lock:
                self._holds -= 1
            self._wake.set()

    def maybe_merge(self, factor: Optional[int] = None) -> bool:
        """Merge what the policy (:func:`plan`) asks for: on the merger thread when
        one runs (this returns at once), else here, until it asks for nothing; nothing
        while another thread's merge is under way (a change never waits behind a merge)."""
        m = self.thread
        if m is not None and m.is_alive():
            self._wake.set()
            return False
        merged = False
        self.drop_merge_leftovers_once()
        while True:
            if self.store.merge_lock.locked() or self._holds:
                return merged  # a merge under way (another thread's), or merges held: never wait
            segs = plan(self.store, factor)
            if not segs or not self.store.merge(segs):
                return merged
            merged = True

    def drop_merge_leftovers_once(self) -> None:
        """What a merge killed before this open left, dropped once (never behind a merge under way)."""
        lock = self.store.merge_lock
        if not self.leftovers_dropped and lock.acquire(blocking=False):
            try:
                run.drop_merge_leftovers(self.store)
            finally:
                lock.release()

    def start(self, look: bool = True) -> None:
        """Merge on a thread of its own from now on: :meth:`maybe_merge` only wakes it.
        ``look``: at once at what the index holds (else at the first wake)."""
        with self._running:
            if self.thread is not None and self.thread.is_alive():
                return
            self._stop = threading.Event()
            self._wake = threading.Event()
            if look:
                self._wake.set()  # a first look: what the index holds may want a merge already
            thread = threading.Thread(target=self._loop, name="lnkmem-merge", daemon=True)
            thread.start()
            self.thread = thread

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the merger thread (a merge under way stops at its next step) and wait for it."""
        with self._running:
            m = self.thread
            if m is None:
                return
            self._stop.set()
            self._wake.set()
        if m is not threading.current_thread():
            m.join(timeout)
        with self._running:
            if self.thread is m:  # (not one started since)
                self.thread = None

    def _loop(self) -> None:
        store = self.store
        stop, wake = self._stop, self._wake
        try:
            store.drop_merge_leftovers()  # what a merge killed before this open left
        except Exception as e:
            logging.getLogger("lnkmem").warning("dropping merge leftovers failed: %s", e)
        while not stop.is_set():
            wake.wait()
            wake.clear()
            merged = False
            while not stop.is_set() and not self._holds:  # (held: until the release wakes it)
                try:
                    segs = plan(store)
                    if not segs or not store.merge(segs, stop.is_set):
                        break
                    merged = True
                except DamagedIndex:
                    return  # the engine rebuilds the index, and merges on its own
                except Exception as e:  # the disk, say: the next wake tries again
                    if store.damaged is not None:
                        return
                    logging.getLogger("lnkmem").warning("merging failed: %s", e)
                    stop.wait(5.0)
                    break
            if merged:  # what the merge's columns took, handed back (glibc keeps freed heap otherwise)
                memtrim.trim()
