"""Fusing words (BM25) and meaning (cosine) rankings.

Two methods, compared on BEIR SciFact's train queries (docs/BENCHMARKS.md):
reciprocal rank fusion, and a convex combination of scores after min-max
normalisation of each list. The default is the one that measured better.
"""

from __future__ import annotations

Pairs = list[tuple[int, float]]

RRF_K = 60
ALPHA = 0.5  # weight of words in the convex combination (tuned on train)
METHOD = "convex"


def rrf(words: Pairs, meaning: Pairs, k: int = RRF_K) -> Pairs:
    score: dict[int, float] = {}
    for ranked in (words, meaning):
        for rank, (pid, _) in enumerate(ranked):
            score[pid] = score.get(pid, 0.0) + 1.0 / (k + rank + 1)
    return sorted(score.items(), key=lambda x: (-x[1], x[0]))


def _minmax(pairs: Pairs) -> dict[int, float]:
    if not pairs:
        return {}
    vals = [s for _, s in pairs]
    lo, hi = min(vals), max(vals)
    span = hi - lo
    return {p: ((s - lo) / span if span > 0 else 1.0) for p, s in pairs}


def convex(words: Pairs, meaning: Pairs, alpha: float = ALPHA) -> Pairs:
    w, m = _minmax(words), _minmax(meaning)
    score = {p: alpha * w.get(p, 0.0) + (1 - alpha) * m.get(p, 0.0) for p in set(w) | set(m)}
    return sorted(score.items(), key=lambda x: (-x[1], x[0]))


def fuse(words: Pairs, meaning: Pairs, method: str = METHOD, **kw) -> Pairs:
    if not meaning:
        return words
    if method == "rrf":
        return rrf(words, meaning, **kw)
    return convex(words, meaning, **kw)
