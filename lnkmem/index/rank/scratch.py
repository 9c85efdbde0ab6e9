"""A search's score arrays over passage ids, borrowed from a few kept between
searches (:data:`scratch`), and the union of the passages a search scored (:func:`union`)."""

from __future__ import annotations

import threading

import numpy as np


KEEP_IDLE = 2  # sets of arrays kept between searches, whatever the threads that search


class Scratch(threading.local):
    """A thread's arrays over passage ids while it searches: a search's cost is its
    postings', not the index's size (zeroing a score per passage of a million-passage
    index, and scanning it for the union, cost more than a query of rare words). A
    search writes only where it notes (``touched``, ``marked``), and those places
    are zeroed after it. The arrays are borrowed from a few kept between searches
    (:data:`KEEP_IDLE`) and given back once zeroed, so memory holds a set per search
    under way, not per thread that ever searched (at 1.27M passages a set is megabytes:
    `serve-many`'s 16 tool threads kept one each); after an error the set is
    dropped."""

    def __init__(self):
        # (no set borrowed: empty arrays shared by every thread, never written: take replaces them)
        self.scores, self.seen, self.inc = _NONE
        self.touched: list = []  # pid arrays whose scores were written
        self.marked: list = []  # pid arrays set in inc
        self.seen_set = False  # whether the touched are set in seen too (a union of many: union)

    def take(self, cap: int) -> None:
        """Borrow a set of arrays over at least ``cap`` ids (zeroed) for a search."""
        if not len(self.scores):
            with _idle_lock:
                if _idle:
                    self.scores, self.seen, self.inc = _idle.pop()
        if len(self.scores) < cap:
            n = max(cap, len(self.scores) * 5 // 4)
            self.scores, self.seen, self.inc = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        self.touched, self.marked, self.seen_set = [], [], False

    def clean(self) -> None:
        """Zero what the search wrote and give the set back."""
        for t in self.touched:
            self.scores[t] = 0
            if self.seen_set:
                self.seen[t] = False
        for m in self.marked:
            self.inc[m] = False
        arrays = (self.scores, self.seen, self.inc)
        self.__init__()
        if len(arrays[0]):
            with _idle_lock:
                if len(_idle) < KEEP_IDLE:
                    _idle.append(arrays)

    def drop(self) -> None:
        """Let the set go unzeroed (after an error: what it wrote is not known)."""
        self.__init__()


_NONE = (np.zeros(0, np.float32), np.zeros(0, bool), np.zeros(0, bool))
_idle: list = []  # zeroed sets of arrays, (scores, seen, inc)
_idle_lock = threading.Lock()
scratch = Scratch()


def union(touched: list, cap: int, ordered: bool = True) -> np.ndarray:
    """The pids of ``touched``'s arrays (those of ``scratch.touched``), ascending, each
    once: marked in ``scratch.seen`` and read back when they are many, else sorted (no
    pass over every id). ``ordered=False``: in no particular order (for a caller that only
    ranks them): each array's pids not marked already, marked (its cost the arrays', never
    a sort nor a pass over every id; unless an earlier union of the search marked some)."""
    if not ordered and len(touched) > 1 and not scratch.seen_set:
        seen = scratch.seen
        scratch.seen_set = True  # (unmarked after the search: ``Scratch.clean``)
        out = []
        for t in touched:
            new = t[~seen[t]] if out else t
            seen[new] = True
            out.append(new)
        return np.concatenate(out)
    if len(touched) == 1 and (not ordered or _ascending(touched[0])):
        return touched[0]
    total = sum(len(t) for t in touched)
    if total * 16 > cap:
        seen = scratch.seen
        scratch.seen_set = True  # (unmarked after the search: ``Scratch.clean``)
        for t in touched:
            seen[t] = True
        return np.flatnonzero(seen[:cap])
    # (a sort: np.unique's hashing is slower here; the stable one, since each list ascends
    # and it merges runs: much faster than numpy's default on the concatenation of two or three)
    c = np.sort(np.concatenate(touched).astype(np.int64), kind="stable")
    return c[np.concatenate(([True], c[1:] != c[:-1]))] if len(c) else c


def _ascending(p: np.ndarray) -> bool:
    """``p`` strictly ascends (one segment's list does; several joined may not)."""
    return len(p) < 2 or bool((p[1:] > p[:-1]).all())
