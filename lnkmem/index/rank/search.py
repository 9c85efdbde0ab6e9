"""The words ranking: BM25 over the words index with the query language
(:mod:`lnkmem.index.text.query`) and the date filters: :func:`words` (and
:func:`bm25`, its pairs alone) and :func:`scores_of` (given passages' scores, for the
fused ranking).

Cost is bounded whatever the query or the index: at most ``query.MAX_TERMS``
terms are scored (vectorised over their postings: term at a time here, pruned by
:mod:`.prune` where it may be); the best are chosen by :func:`.topk.top`;
phrases, excluded phrases and dates are checked (:mod:`.checks`) on at most
:data:`CHECK_CAP` passages' text, best first. The terms themselves, their lists
and scores: :mod:`.terms`.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from lnkmem.index.text import query as qlang
from lnkmem.index.format import SOURCE_CODE
from lnkmem.index.rank.checks import CHECK_CAP, Checks, Pairs, Texts, holding_every
from lnkmem.index.rank.prune import lists_for, maxscore, one_word
from lnkmem.index.rank.scratch import scratch, union
from lnkmem.index.rank.terms import (B, FLAT_K1, K1, flat_idfs, idf_of, live_postings, query_weights,
                                     ranked_terms, tf_score)
from lnkmem.index.rank.topk import top
from lnkmem.index.snapshot import Snapshot
from lnkmem.index.store import Store


PHRASE_WEIGHT = 0.1  # a scored phrase's lift: this times the sum of its words' idf (the prose set's tuning parts, SciFact train / LoCoMo 1-5: 0 0.6948 / 0.7914, 0.1 0.6951 / 0.7914, 0.25 0.6942 / 0.7924, 0.5 0.6924 / 0.7922, 1 0.6901 / 0.7912)


def _newest(store: Store, snap: Snapshot, checks: Checks, want: int, sources, under) -> Pairs:
    """Passages holding the query's phrases among the newest CHECK_CAP (none of
    their words is indexed, so nothing scores them: 0 for all)."""
    cand = snap.keep(np.flatnonzero(snap.alive)[::-1], sources, under)
    cand = cand[checks.mask_ok(cand)]
    if checks.dated and len(cand):
        cand = checks.by_file_time(store, snap, cand)
    cand = cand[:CHECK_CAP]
    return checks.filter(store, [(int(p), 0.0) for p in cand], want)


def words(store: Store, query: Union[str, qlang.Query], limit: int, sources: Optional[Sequence[str]] = None,
          under: Optional[str] = None, k1: float = K1, b: float = B, candidates: Optional[int] = None,
          after: Optional[float] = None, before: Optional[float] = None,
          prune: bool = True) -> tuple[Pairs, Checks]:
    """Best (pid, score) pairs for ``query``, best first, and the checks any
    other ranking's hits must pass too (exclusions, phrases, dates).

    ``prune``: MaxScore (terms that cannot lift a passage into the top are only looked
    up); False scores every posting (the same answers: tests and bench_prune's A/B)."""
    q = qlang.parse(query) if isinstance(query, str) else query
    try:
        out = _words(store, q, limit, sources, under, k1, b, candidates, after, before, prune)
    except BaseException:
        scratch.drop()
        raise
    scratch.clean()
    return out


def _words(store: Store, q: qlang.Query, limit: int, sources, under, k1: float, b: float, candidates, after,
           before, prune: bool):
    checks = Checks(q, after, before)
    snap = store.refresh()
    want = candidates or limit
    if snap.live == 0:
        return [], checks
    cap = len(snap.alive)
    scratch.take(cap)
    scores = scratch.scores
    avgdl = snap.avgdl
    touched = scratch.touched

    def postings(r, segs, term):
        return live_postings(store, r, snap, segs, term)

    with store.reading(guarded=False) as r:  # (refresh passed the guard: one a call)
        segs = r.segment_keys()
        weights = query_weights(r, segs, q)
        if q.excluded:
            banned = np.zeros(cap, bool)
            for term in q.excluded:
                banned[postings(r, segs, term)[0]] = True
            checks.banned = banned
        checks.snap = snap
        held: dict[str, np.ndarray] = {}  # term -> bool by pid: the passages holding it

        def holding(term: str) -> np.ndarray:
            if term not in held:
                m = held[term] = np.zeros(cap, bool)
                m[postings(r, segs, term)[0]] = True
            return held[term]

        def require(has: np.ndarray) -> None:
            checks.required = has if checks.required is None else checks.required & has

        for terms in q.phrase_terms:  # a required phrase: in a passage, or across a boundary of its file
            if terms:  # (its first 8 distinct words: enough to narrow; the text check decides)
                require(holding_every(cap, snap.refid, [holding(t) for t in list(dict.fromkeys(terms))[:8]]))
        for terms in q.required:  # +word: in the passage
            for t in terms:
                require(holding(t).copy())
        for i, terms in enumerate(q.scored_terms):
            terms = list(dict.fromkeys(terms))[:8]
            if terms:
                masks = [holding(t) for t in terms]
                checks.holders[i] = holding_every(cap, snap.refid, masks)
                checks.lifts[i] = PHRASE_WEIGHT * sum(idf_of(snap, int(np.count_nonzero(m))) for m in masks)
        pruned = None
        if prune and len(weights) > 1 and not checks.on_text and not checks.dated and not q.scored \
                and snap.segs is not None and snap.seg_of is not None:
            pruned = maxscore(store, r, snap, segs, weights, checks, scores, touched, want, sources, under, k1, b,
                               q.flat)
        else:
            # one ranked word and nothing to filter by: its postings' scores are the
            # candidates' own (no scatter into the score array, nothing to zero after)
            alone = len(weights) == 1 and not checks.any and not checks.dated and not under and not q.scored \
                and (sources is None or set(sources) >= set(SOURCE_CODE))
            if alone and prune and snap.segs is not None and snap.seg_of is not None:
                (term, w), = weights.items()
                got = one_word(store, r, snap, segs, term, w, want, k1, b)
                if got is not None:
                    return list(zip(got[0].tolist(), got[1].tolist())), checks
            listed = []
            for term, w in weights.items():
                pids, tfs = postings(r, segs, term)
                if len(pids):
                    listed.append((term, pids, tfs, idf_of(snap, len(pids)) * w))
            flat = flat_idfs({t: idf for t, _, _, idf in listed}, k1, q.flat)
            for term, pids, tfs, idf in listed:
                kt = k1
                if term in flat:
                    idf, kt = flat[term], FLAT_K1
                sc = tf_score(idf, tfs.astype(np.float32), snap.doclen[pids], avgdl, kt, b)
                if alone:
                    cand, sc = top(snap, pids, sc, want)
                    return list(zip(cand.tolist(), sc.tolist())), checks
                scores[pids] += sc
                touched.append(pids)
    if pruned is not None:  # the candidates are those the pruning kept (filtered already)
        if not len(pruned):
            return [], checks
        cand, sc = top(snap, pruned, scores[pruned], want)
        return list(zip(cand.tolist(), sc.tolist())), checks
    if not touched:
        if q.phrases and not any(q.phrase_terms):  # phrases of stop words only ("to be or not to be"):
            return _newest(store, snap, checks, want, sources, under), checks  # no postings to go by
        return [], checks
    if len(touched) > 1:  # the union of the terms' passages, in pid order
        cand = union(touched, cap)
    else:
        cand = touched[0].astype(np.int64)
    cand = snap.keep(cand, sources, under)
    if checks.banned is not None or checks.required is not None:
        cand = cand[checks.mask_ok(cand)]
    if checks.dated and len(cand):  # every candidate, not only the best CHECK_CAP
        cand = checks.by_file_time(store, snap, cand)
    if not len(cand):
        return [], checks
    sc = scores[cand]
    if q.scored:
        sc = checks.lift(store, snap, cand, sc)
    if checks.on_text:
        cand, sc = top(snap, cand, sc, min(len(cand), CHECK_CAP))
        pairs = checks.filter(store, list(zip(cand.tolist(), sc.tolist())), want)
        return pairs, checks
    cand, sc = top(snap, cand, sc, want)
    return list(zip(cand.tolist(), sc.tolist())), checks


def scores_of(store: Store, query: Union[str, qlang.Query], pids, k1: float = K1, b: float = B) -> np.ndarray:
    """BM25 of each of ``pids`` for ``query`` (float32, in their order), as :func:`words`
    scores a passage: the same terms (prefixes expanded, exclusions never ranked),
    idf, lengths and order of adding; 0 for a passage holding none of them or no
    longer alive. For passages another ranking found (the fused ranking scores
    every candidate by both): each term's lists are only looked up for them,
    decoding only the blocks that may hold them (:func:`postings.lookup`, as
    MaxScore does). It scores, it does not filter: the caller's passages passed
    the query's checks (:meth:`Checks.filter`) already."""
    q = qlang.parse(query) if isinstance(query, str) else query
    pids = np.asarray(pids, np.int64).reshape(-1)
    out = np.zeros(len(pids), np.float32)
    snap = store.refresh()
    cap = len(snap.alive)
    ok = (pids >= 0) & (pids < cap)
    ok[ok] = snap.alive[pids[ok]]
    want = np.sort(pids[ok])  # ascending, as lookup needs (not np.unique: it imports numpy.ma)
    if len(want):
        want = want[np.concatenate(([True], want[1:] != want[:-1]))]
    if not len(want) or snap.live == 0:
        return out
    acc = np.zeros(len(want), np.float32)
    avgdl = snap.avgdl
    with store.reading(guarded=False) as r:  # (refresh passed the guard)
        segs = r.segment_keys()
        terms = ranked_terms(store, r, snap, segs, query_weights(r, segs, q), k1, b, q.flat)
        terms.sort(key=lambda x: -x.ub)  # MaxScore's order of adding
        for tm in terms:
            for ps, ts in lists_for(store, tm, want):
                if not len(ps):
                    continue
                at = np.minimum(np.searchsorted(want, ps), len(want) - 1)
                hit = want[at] == ps
                if not hit.any():
                    continue
                ps, ts, at = ps[hit], ts[hit].astype(np.float32), at[hit]
                dl = snap.doclen[ps]
                acc[at] += tf_score(tm.idf, ts, dl, avgdl, tm.k1, b)
    if q.scored:  # each scored phrase's lift where a passage holds it (as words() lifts it)
        dfs = {tm.term: tm.df for tm in terms}
        patterns = [(qlang.phrase_pattern(w), len(w)) for w in q.scored]
        lifts = [PHRASE_WEIGHT * sum(idf_of(snap, dfs[t]) for t in dict.fromkeys(ts[:8]) if t in dfs)
                 if ts and all(t in dfs for t in ts) else 0.0 for ts in q.scored_terms]
        texts = Texts(store, snap)
        wl = want.tolist()
        for i, pid, p in zip(range(len(wl)), wl, texts.read(wl)):
            if p is not None:
                low = p.text.casefold()
                acc[i] += sum(lift for (r, n), lift in zip(patterns, lifts) if lift and texts.holds(r, n, pid, p, low))
    out[ok] = acc[np.searchsorted(want, pids[ok])]
    return out


def bm25(store: Store, query: Union[str, qlang.Query], limit: int, sources: Optional[Sequence[str]] = None,
         under: Optional[str] = None, k1: float = K1, b: float = B,
         candidates: Optional[int] = None, prune: bool = True) -> Pairs:
    """Best (pid, score) pairs for ``query``, best first.

    ``candidates``: how many to return before the limit is applied (the hybrid
    ranker asks for more than it shows); ``prune``: as :func:`words`'.
    """
    return words(store, query, limit, sources, under, k1, b, candidates, prune=prune)[0]
