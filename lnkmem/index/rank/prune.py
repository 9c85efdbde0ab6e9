"""Pruned BM25 scoring, with the answers of scoring every posting: MaxScore over a
query's terms (:func:`maxscore`: terms that cannot lift a passage into the top are
only looked up, block by block), block-max for one long word (:func:`one_word`), and a
term's lists looked up for given passages (:func:`lists_for`, :func:`scores_of`'s too)."""

from __future__ import annotations

import itertools
from typing import Optional, Sequence

import numpy as np

from lnkmem.index.text import analyze
from lnkmem.index.codec import postings as plists
from lnkmem.index.rank.checks import Checks
from lnkmem.index.rank.scratch import scratch, union
from lnkmem.index.rank.terms import Term, alive_in, ranked_terms, tf_score
from lnkmem.index.rank.topk import top
from lnkmem.index.snapshot import Snapshot
from lnkmem.index.store import Store
from lnkmem.index.tables import Reading


# MaxScore scores the terms left whole, as it scores those before them, while their live
# postings together are at most this many: below it the pruning's own numpy calls (the
# threshold, each passage's bound, the lookups) cost more than scoring them. The order of
# adding is the same (by bound), so every score is the same to the last bit.
SCORE_WHOLE = 4096
BOUND_MARK = 8  # a decoded list bounds passages by marks when they are more than 1/this of its postings (else each is looked for in it)
FIRST_LOOK = 8  # MaxScore looks up its best 2·k first when more than this many times k may reach the top
LOOKUP_WHOLE = 16 << 10  # a packed list this short that MaxScore looks up is decoded whole and kept (Store.caches.looked_up)
# a longer list looked up for at least one passage in this many of its postings (a block's
# worth: most of its blocks would be decoded for them) is decoded whole instead, and offered
# to Store.caches.decoded, so that the next search of it decodes nothing
LOOKUP_DENSE = 128


# a one-word search takes a word whose lists hold this many postings block by block
LONG_LIST = 12288
BLOCK_MAX_KEPT = 1 << 14  # lists whose block maxima are kept (16 bytes a block of 128 postings: a byte for 8 postings at most); emptied when full
AVGDL_ROOM = 1.05  # block maxima are computed at this much more than the mean length, so they
# stay bounds while the mean grows that much (a BM25 term's score rises with the mean length)


def one_word(store: Store, r: Reading, snap: Snapshot, segs: list[bytes], term: str, w: float, want: int,
              k1: float, b: float) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The ``want`` best passages of one ranked word and their scores, taking its long lists
    block by block (block-max): each block's largest score, kept per list, bounds every
    passage in it; the blocks of the highest bounds are scored first, the ``want``-th best
    of those is theta, and then only the blocks whose bound reaches theta. A passage that
    could place is never in a block left out, so the answer is scoring every posting's.
    None when its lists are short (scoring them whole costs less)."""
    if analyze.joined(term):  # (scored flat: ranked_terms)
        return None
    t = term.encode()
    total = 0
    for sk in store.holding(r, segs, t):  # from the headers: a rare word costs nothing more
        v = r.posting_list(sk + t)
        if v is not None:
            total += max(plists.stated_count(v), 0)
    if total < LONG_LIST:
        return None
    terms = ranked_terms(store, r, snap, segs, {term: w}, k1, b)
    if not terms:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    tm = terms[0]
    avgdl = snap.avgdl
    scale = tm.idf * (k1 + 1)
    pool_p, pool_s = [], []
    lists, bounds = [], []

    def score(ps, ts):
        if tm.dead or (len(ps) and int(ps[-1]) >= len(snap.alive)):
            ps, ts = alive_in(snap, ps, ts)
        pool_p.append(ps)
        pool_s.append(tf_score(tm.idf, ts.astype(np.float32), snap.doclen[ps], avgdl, k1, b))

    for key, v, dec in tm.lists:
        if key is None or (len(dec[0]) if dec is not None else plists.stated_count(v)) < LONG_LIST // 4:
            # a list decoded and checked (its blocks no longer whole), or a short one: scored whole
            ps, ts = dec if dec is not None else store.caches.decoded.of(key, v)
            score(ps.astype(np.intp), ts)
            continue
        lists.append((key, v, dec))
        bounds.append(_block_max(store, key, v, dec, snap, k1, b))
    theta = -np.inf
    if lists:
        # each list's blocks by bound, highest first: the ``first`` best of all lists are a
        # prefix of each list's order (``took``); scored, their ``want``-th best is theta
        first = max(8, 2 * (-(-want // plists.BLOCK)))
        if len(lists) == 1:
            took = [min(first, len(bounds[0][1]))]
        else:
            heads = np.concatenate([gs[:first] for _, gs in bounds])
            of = np.concatenate([np.full(min(first, len(gs)), i, np.int64) for i, (_, gs) in enumerate(bounds)])
            took = np.bincount(of[np.argsort(-heads, kind="stable")[:first]], minlength=len(lists)).tolist()
        _score_blocks(store, lists, [order[:n] for (order, _), n in zip(bounds, took)], score)
        got = sum(len(x) for x in pool_s)
        if got >= want:
            alls = np.concatenate(pool_s) if len(pool_s) > 1 else pool_s[0]
            theta = float(np.partition(alls, got - want)[got - want])
        # then every block whose bound reaches theta (a bound under a little less than theta
        # in the tf part's terms: float rounding, if anything, scores a block more, never less)
        least = (theta - 1e-6) / (scale * (1 + 1e-5)) * (1 - 1e-9) if theta > -np.inf and scale > 0 else -np.inf
        reach = [len(gs) - int(np.searchsorted(gs[::-1], least)) for _, gs in bounds]
        _score_blocks(store, lists, [order[n:m] for (order, _), n, m in zip(bounds, took, reach)], score)
    if not pool_p:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    cand = np.concatenate(pool_p) if len(pool_p) > 1 else pool_p[0]
    sc = np.concatenate(pool_s) if len(pool_s) > 1 else pool_s[0]
    if lists and theta > -np.inf:  # (theta is at most the last place's score: none that may place dropped)
        keep = np.flatnonzero(sc >= theta)
        cand, sc = cand[keep], sc[keep]
    if not len(cand):
        return cand.astype(np.int64), sc
    return top(snap, cand.astype(np.int64), sc, want)


def _score_blocks(store: Store, lists: list, blks: list, score) -> None:
    """Score the blocks ``blks[i]`` (in any order) of each of ``lists`` (key, bytes or None,
    decoded or None): from the list decoded when it is, else only those blocks decoded."""
    for (key, v, dec), bs in zip(lists, blks):
        if not len(bs):
            continue
        bs = np.sort(bs)  # (pids ascending within a list: its last is its largest)
        if dec is None:
            dec = store.caches.decoded.get(key)
        if dec is not None:
            ps, ts = dec
            at = (bs[:, None] * plists.BLOCK + np.arange(plists.BLOCK)).ravel()
            if at[-1] >= len(ps):
                at = at[at < len(ps)]
            score(ps[at].astype(np.intp), ts[at])
        else:
            ps, ts = plists.blocks(v, bs)
            score(ps.astype(np.intp), ts)


def _block_max(store: Store, key: bytes, v, dec, snap: Snapshot, k1: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """A list's blocks by their largest ``tf / (tf + k1 (1 - b) + k1 b dl / avgdl)`` (float64)
    at :data:`AVGDL_ROOM` times the mean length, highest first: the blocks (int64) and those
    maxima. Kept per list (its passages and their lengths never change) and computed again
    only when the mean has grown past it, or for other k1 and b. The list is decoded whole
    once for it."""
    kept = store.caches.block_max.get(key)
    if kept is not None and kept[1] == k1 and kept[2] == b and snap.avgdl <= kept[0]:
        return kept[3]
    ps, ts = dec if dec is not None else store.caches.decoded.of(key, v)
    at = snap.avgdl * AVGDL_ROOM
    tf = ts.astype(np.float64)
    g = tf / (tf + (k1 * (1 - b) + k1 * b / at * snap.doclen[ps.astype(np.intp)].astype(np.float64)))
    nb = -(-len(g) // plists.BLOCK)
    if len(g) < nb * plists.BLOCK:
        g = np.concatenate((g, np.zeros(nb * plists.BLOCK - len(g))))
    g = g.reshape(nb, plists.BLOCK).max(axis=1)
    order = np.argsort(-g, kind="stable")
    got = (order, g[order])
    if len(store.caches.block_max) >= BLOCK_MAX_KEPT:
        store.caches.block_max.clear()
    store.caches.block_max[key] = (at, k1, b, got)
    return got


def maxscore(store: Store, r: Reading, snap: Snapshot, segs: list[bytes], weights: dict, checks: Checks,
              scores: np.ndarray, touched: list, want: int, sources, under, k1: float, b: float,
              flat: Sequence[str] = ()) -> Optional[np.ndarray]:
    """Score ``weights``' terms into ``scores`` with MaxScore (Turtle and Flood):
    terms by their score bound, highest first, each list scored whole until the
    bounds of the terms left sum below the ``want``-th best score so far (theta):
    no passage outside the lists scored can then reach the top, so the terms left
    are only looked up for the passages already there, decoding only the blocks
    that may hold them (:func:`postings.lookup`). Scores are those of scoring
    every posting (added in bound order). The candidates (in no particular order), filtered
    by sources, ``under`` and the query's exclusions; None when no list had a posting."""
    cap = len(snap.alive)
    avgdl = snap.avgdl
    terms = ranked_terms(store, r, snap, segs, weights, k1, b, flat)
    if not terms:
        return None
    terms.sort(key=lambda x: -x.ub)
    ubs = [x.ub for x in terms]
    rest = list(itertools.accumulate(ubs[::-1]))[::-1]  # bound of terms i.. together
    left_df = list(itertools.accumulate([x.df for x in terms][::-1]))[::-1]  # live postings of terms i..
    done = 0.0  # bound of the terms scored

    dead_in = any(tm.dead for tm in terms)  # lists left holding dead passages (FEW_DEAD)

    def kept(cand: np.ndarray) -> np.ndarray:
        if dead_in:
            cand = cand[snap.alive[cand]]
        cand = snap.keep(cand, sources, under)
        if checks.banned is not None or checks.required is not None:
            cand = cand[checks.mask_ok(cand)]
        return cand

    def contrib(tm: Term, pids: np.ndarray, tfs: np.ndarray, first: bool = False) -> None:
        tfs = tfs.astype(np.float32)
        dl = snap.doclen[pids]
        if first:  # (no score yet: every one 0, and a term's lists hold a passage once)
            scores[pids] = tf_score(tm.idf, tfs, dl, avgdl, tm.k1, b)
        else:
            scores[pids] += tf_score(tm.idf, tfs, dl, avgdl, tm.k1, b)

    for i, tm in enumerate(terms):
        pids, tfs = [], []
        for key, v, dec in tm.lists:
            if dec is None:
                ps, ts = store.caches.decoded.of(key, v)
            else:
                ps, ts = dec
            pids.append(ps)
            tfs.append(ts)
        p = np.concatenate(pids) if len(pids) > 1 else pids[0]
        p = p.astype(np.intp)  # once: the gather, the scatter and the marks below would each convert it
        t = np.concatenate(tfs) if len(tfs) > 1 else tfs[0]
        contrib(tm, p, t, i == 0)
        touched.append(p)
        done += tm.ub
        if i + 1 == len(terms):
            break
        if done <= rest[i + 1]:  # theta <= the bound of the terms scored: nothing can be pruned yet
            continue
        if left_df[i + 1] <= SCORE_WHOLE:  # the terms left are short: scored whole, in the same order
            continue
        cand = kept(union(touched, cap))
        if len(cand) < want:
            continue
        sc = scores[cand]
        theta = float(np.partition(sc, len(sc) - want)[len(sc) - want])
        if rest[i + 1] * (1 + 1e-5) >= theta:
            continue
        # the terms left cannot lift a passage outside ``cand`` into the top ``want``, nor one
        # of ``cand`` whose score with their bounds stays below theta: first their bounds as
        # a whole, then each passage's own (block-max: the largest tf of the block that may
        # hold it, its own length), from the lists' headers without decoding them
        left = terms[i + 1:]
        cand = cand[sc + rest[i + 1] * (1 + 1e-5) >= theta]
        bounds = [_bound(store, tm, cand, snap, k1, b) for tm in left]
        cand, bounds = _reaching(cand, bounds, scores, theta)
        best = np.zeros(0, np.int64)
        if len(cand) > FIRST_LOOK * want:
            # the best so far looked up first: their whole scores raise theta, so far fewer
            # of the others are looked up
            sc = scores[cand]
            k = 2 * want
            pick = np.zeros(len(cand), bool)
            pick[np.argpartition(sc, len(sc) - k)[len(sc) - k:]] = True
            best, cand, bounds = cand[pick], cand[~pick], [x[~pick] for x in bounds]
            _add(store, left, best, contrib)
            full = scores[best]
            theta = max(theta, float(np.partition(full, len(full) - want)[len(full) - want]))
        inc = scratch.inc
        for r, tm2 in enumerate(left):
            # before each term left, only those that still may reach theta are looked up in it
            cand, bounds = _reaching(cand, bounds, scores, theta, r)
            if r == 0:
                inc[cand] = True  # (those dropped later stay marked: their scores are never read)
                scratch.marked.append(cand)
            _add_marked(store, tm2, cand, contrib)
        return np.concatenate((best, cand)) if len(best) else cand
    return kept(union(touched, cap, ordered=False))  # (the caller only ranks them: top)


def _bound(store: Store, tm: "Term", pids: np.ndarray, snap: Snapshot, k1: float, b: float) -> np.ndarray:
    """Each of ``pids``' (ascending) largest possible score from ``tm``: its tf bounded by
    its block's largest (a decoded list: its tf), with its own length (float32)."""
    mt = np.zeros(len(pids), np.int64)
    marked = False
    inc = scratch.inc
    try:
        for key, v, dec in tm.lists:
            if dec is None:
                # held, or short and decoded whole now: exact tfs (by its header alone, a recent
                # segment's one block reaches back to pid 0 and bounds every older passage by its tf)
                dec = _held_or_short(store, key, v, len(pids))
            if dec is None:
                np.maximum(mt, plists.block_tf(v, pids), out=mt)
            elif len(dec[0]):
                ps, ts = dec
                lo, hi = np.searchsorted(pids, (ps[0], ps[-1] + 1)).tolist()  # only the pids its range spans
                if hi - lo > len(ps) // BOUND_MARK:
                    # many passages beside the list: theirs marked, its postings' marks read (one
                    # pass over it), and only the postings found placed among the passages
                    if not marked:
                        inc[pids] = marked = True
                    hit = np.flatnonzero(inc[ps])
                    at = np.searchsorted(pids, ps[hit])
                    mt[at] = np.maximum(mt[at], ts[hit])
                elif hi > lo:
                    sub = pids[lo:hi]
                    at = np.minimum(np.searchsorted(ps, sub.astype(ps.dtype)), len(ps) - 1)  # (keys of its type)
                    np.maximum(mt[lo:hi], np.where(ps[at] == sub, ts[at], 0), out=mt[lo:hi])
    finally:
        if marked:
            inc[pids] = False
    tf = mt.astype(np.float32)
    dl = snap.doclen[pids]
    return np.where(mt > 0, tf_score(tm.idf, tf, dl, snap.avgdl, tm.k1, b), 0).astype(np.float32)


def _reaching(cand: np.ndarray, bounds: list, scores: np.ndarray, theta: float, r: int = 0):
    """Those of ``cand`` whose score with the bounds of the terms ``bounds[r:]`` may reach
    theta (with room for float32's rounding), and their bounds."""
    if not len(cand) or r >= len(bounds):
        return cand, bounds
    total = scores[cand] + np.sum(bounds[r:], axis=0, dtype=np.float32)
    keep = total * (1 + 1e-5) + 1e-6 >= theta
    if keep.all():
        return cand, bounds
    return cand[keep], [x[keep] for x in bounds]


def _add(store: Store, terms: list, pids: np.ndarray, contrib) -> None:
    """Add ``terms``' scores of ``pids`` (ascending, none marked in ``scratch.inc``)."""
    inc = scratch.inc
    inc[pids] = True
    try:
        for tm in terms:
            _add_marked(store, tm, pids, contrib)
    finally:
        inc[pids] = False


def _add_marked(store: Store, tm: "Term", pids: np.ndarray, contrib) -> None:
    """Add ``tm``'s scores of the passages marked in ``scratch.inc``, its lists looked up for
    ``pids`` (ascending, those marked among them); of a list over BOUND_MARK times longer than
    ``pids``, only theirs (the others marked are never read: dropped on the way)."""
    inc = scratch.inc
    for ps, ts in lists_for(store, tm, pids):
        if len(ps) > BOUND_MARK * len(pids):  # few passages beside a long list: each looked for in it
            at = np.minimum(np.searchsorted(ps, pids.astype(ps.dtype)), len(ps) - 1)  # (keys of its type: it is not converted)
            hit = np.flatnonzero(ps.take(at) == pids)
            if len(hit):
                contrib(tm, pids.take(hit), ts.take(at.take(hit)))
            continue
        hit = np.flatnonzero(inc[ps])  # (once: a mask would be counted out for each array)
        if len(hit):
            contrib(tm, ps.take(hit), ts.take(hit))


def lists_for(store: Store, tm: "Term", want: np.ndarray):
    """Each of a term's lists as (pids, tfs), for the passages ``want`` (ascending): a
    list decoded already (cached, or masked for its dead passages) whole; a short one
    (:data:`LOOKUP_WHOLE` bytes packed) decoded whole once and kept in
    ``store.caches.looked_up``; else only the blocks that may hold them (:func:`postings.lookup`)."""
    for key, v, dec in tm.lists:
        if dec is not None:
            yield dec
            continue
        got = _held_or_short(store, key, v, len(want))
        yield got if got is not None else plists.lookup(v, want)


def _held_or_short(store: Store, key: bytes, v, asked: int = 0) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """A list (stored value ``v``) as decoded and kept in ``store.caches.decoded``; else, when it is
    short (:data:`LOOKUP_WHOLE` bytes packed), decoded whole once and kept in
    ``store.caches.looked_up``; else, when ``asked`` passages are looked up in it, at least one
    in :data:`LOOKUP_DENSE` of its postings, decoded whole and offered to ``store.caches.decoded``;
    else None (a long list not held: looked up block by block)."""
    decoded = store.caches.decoded
    got = decoded.get(key)
    if got is None:
        if len(v) <= LOOKUP_WHOLE:
            if store.caches.looked_up.CACHE_BYTES:
                got = store.caches.looked_up.of(key, v)
        elif decoded.CACHE_BYTES and asked * LOOKUP_DENSE >= plists.stated_count(v):
            got = decoded.of(key, v)
    return got
