"""The best k of a ranking, tie-safe: chosen in numpy (the last place's score, then a
partition of the ties at it by (ref, place in the file)), never by sorting every
candidate in Python, so a Home of 444,444 tied passages costs a few vectorised
passes over them."""

from __future__ import annotations

import numpy as np

from lnkmem.index.snapshot import Snapshot


SAMPLE = 1024  # scores sampled for a floor under the last place's (top)
TIES_BY_HAND = 64  # passages tied for the last place that top orders in Python (more: by numpy)


def _tie_rank(snap: Snapshot, rids: np.ndarray) -> np.ndarray:
    """Each of ``rids``' place among the refs they name, in ref order (refid -1 last).
    Only the tied passages' own refs are sorted: never every ref of the index, which
    each new snapshot (every change) would otherwise sort again (the p99 of searches
    after changes, growing with the files)."""
    uniq, inv = np.unique(rids, return_inverse=True)
    names = [snap.refs[r] if r >= 0 else None for r in uniq.tolist()]
    order = sorted(range(len(names)), key=lambda i: (names[i] is None, names[i] or ""))
    rank = np.empty(len(names), np.int64)
    rank[order] = np.arange(len(names))
    return rank[inv]


def top(snap: Snapshot, cand: np.ndarray, sc: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``want`` best of ``cand`` (scores ``sc``), best first; ties by ref, then
    by place in the file (a file's pids ascend with its lines). O(n) whatever the ties;
    a ref is read only where scores tie (most searches: none)."""
    if len(cand) > 2 * SAMPLE and want * 64 < len(cand):
        # a floor under the last place's score: the ``want``-th best of an evenly
        # spaced sample (never above the whole's); every passage above it is kept,
        # ties at the last place included, and the rest dropped at one comparison
        sample = sc[::len(sc) // SAMPLE]
        if len(sample) > 2 * want:
            floor = np.partition(sample, len(sample) - want)[len(sample) - want]
            keep = np.flatnonzero(sc >= floor)  # (once: a mask would be counted out for each array)
            cand, sc = cand.take(keep), sc.take(keep)
    if len(cand) > want:
        # the score of the last place: numpy's vectorised sort, since its partition
        # degrades on masses of equal values (many times slower for 2M ties)
        kth = np.sort(sc)[len(sc) - want]
        keep = sc >= kth
        if np.count_nonzero(keep) > want:  # more tie at the last place than it has room for
            above = np.flatnonzero(sc > kth)
            tied = np.flatnonzero(sc == kth)
            need = want - len(above)
            ct = cand[tied]
            if len(tied) <= TIES_BY_HAND:
                refs, cs, rs = snap.refs, ct.tolist(), snap.refid[ct].tolist()
                pick = sorted(range(len(cs)), key=lambda i: (_ref_key(refs, rs[i]), cs[i]))[:need]
                tied = tied[pick]
            else:
                key = (_tie_rank(snap, snap.refid[ct]) << 32) | ct.astype(np.int64)
                tied = tied[np.argpartition(key, need - 1)[:need]]
            keep = np.concatenate((above, tied))
        cand, sc = cand[keep], sc[keep]
    s = sc.tolist()
    order = sorted(range(len(s)), key=s.__getitem__, reverse=True)
    if len(set(s)) < len(s):  # equal scores: those ordered by ref, then place (refs read for them only)
        refs, c, rs = snap.refs, cand.tolist(), snap.refid[cand].tolist()
        i, n = 0, len(order)
        while i < n:
            j, si = i + 1, s[order[i]]
            while j < n and s[order[j]] == si:
                j += 1
            if j - i > 1:
                order[i:j] = sorted(order[i:j], key=lambda k: (_ref_key(refs, rs[k]), c[k]))
            i = j
    order = np.array(order, np.intp)  # (once, not for each array)
    return cand.take(order), sc.take(order)


def _ref_key(refs, rid: int) -> tuple:
    """Sort key of a passage's ref (refid -1, none: last)."""
    return (False, refs[rid]) if rid >= 0 else (True, "")
