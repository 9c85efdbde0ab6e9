"""BM25 over the words index (Robertson/Sparck Jones idf, Lucene's form)."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from lnkmem.index import analyze
from lnkmem.index.store import Store

K1 = 1.2  # tuned on BEIR SciFact train (docs/BENCHMARKS.md)
B = 0.75


def bm25(store: Store, query: str, limit: int, sources: Optional[Sequence[str]] = None,
         under: Optional[str] = None, k1: float = K1, b: float = B,
         candidates: Optional[int] = None) -> list[tuple[int, float]]:
    """Best (pid, score) pairs for ``query``, best first.

    ``candidates``: how many to return before the limit is applied (the hybrid
    ranker asks for more than it shows).
    """
    terms = analyze.query_terms(query)
    snap = store.refresh()
    if not terms or snap.live == 0:
        return []
    cap = len(snap.alive)
    scores = np.zeros(cap, np.float32)
    avgdl = snap.avgdl
    touched = []
    with store.env.begin() as txn:
        segs = store.segment_keys(txn)
        for term in terms:
            pids, tfs = store.postings_of(txn, term, segs)
            if not len(pids):
                continue
            inside = pids < cap
            if not inside.all():
                pids, tfs = pids[inside], tfs[inside]
            live = snap.alive[pids]
            pids, tfs = pids[live], tfs[live].astype(np.float32)
            df = len(pids)
            if df == 0:
                continue
            idf = np.log1p((snap.live - df + 0.5) / (df + 0.5))
            dl = snap.doclen[pids]
            scores[pids] += idf * tfs * (k1 + 1) / (tfs + k1 * (1 - b + b * dl / avgdl))
            touched.append(pids)
    if not touched:
        return []
    if len(touched) > 1:  # the union of the terms' passages, in pid order
        seen = np.zeros(cap, bool)
        for t in touched:
            seen[t] = True
        cand = np.flatnonzero(seen)
    else:
        cand = touched[0]
    cand = snap.keep(cand, sources, under)
    if not len(cand):
        return []
    want = candidates or limit
    sc = scores[cand]
    if len(cand) > want:  # keep every tie of the last place: the order must not depend on pids
        kth = np.partition(sc, len(sc) - want)[len(sc) - want]
        keep = sc >= kth
        cand, sc = cand[keep], sc[keep]
    # best first; ties by ref, then by place in the file (pids of a file ascend with its lines)
    refs = snap.refs
    order = sorted(range(len(cand)), key=lambda i: (-sc[i], refs[snap.refid[cand[i]]], cand[i]))[:want]
    return [(int(cand[i]), float(sc[i])) for i in order]
