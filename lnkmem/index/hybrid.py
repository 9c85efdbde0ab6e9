"""Fusing words (BM25) and meaning (cosine) rankings.

Three methods, compared on BEIR SciFact's train queries and LoCoMo's tuning
conversations (docs/BENCHMARKS.md, ``bench/bench_meaning.py``): reciprocal
rank fusion; a convex combination of scores after min-max normalisation of
each list; and a convex combination of z-scores (each score in standard
deviations from its list's mean). The default is the one that measured best
on the tuning queries: z-scores, words weighted 0.6 and meaning 0.4 (the
best of the sum of both tuning figures; docs/BENCHMARKS.md).

Each list is the top of its ranking (the engine fuses ``CANDIDATES`` of
each); a passage absent from a list counts as that list's last.
"""

from __future__ import annotations

import math

Pairs = list[tuple[int, float]]

METHOD = "zscore"  # "zscore" | "convex" | "rrf" (tuned on train)
ALPHA = 0.6  # weight of words (z-scores: best on SciFact train, 0.735; on LoCoMo 1-5, with a message's own words weighted above its context, R@10 0.792 at 0.6, 0.792 at 0.7, 0.795 at 0.8)
RRF_K = 5  # reciprocal rank fusion's k (tuned on train; the customary 60 measured worse)


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


def _zscores(pairs: Pairs) -> dict[int, float]:
    """Each score in standard deviations from the list's mean, shifted so that the
    list's lowest is 0 (the value of a passage absent from it). Equal scores
    (one passage, or ties) all count 1: one deviation above absence."""
    if not pairs:
        return {}
    vals = [s for _, s in pairs]
    mean = sum(vals) / len(vals)
    sd = math.sqrt(sum((s - mean) ** 2 for s in vals) / len(vals))
    lo = min(vals)
    if sd <= 1e-12 * max(1.0, abs(mean)):
        return {p: 1.0 for p, _ in pairs}
    return {p: (s - lo) / sd for p, s in pairs}


def zscore(words: Pairs, meaning: Pairs, alpha: float = ALPHA) -> Pairs:
    w, m = _zscores(words), _zscores(meaning)
    score = {p: alpha * w.get(p, 0.0) + (1 - alpha) * m.get(p, 0.0) for p in set(w) | set(m)}
    return sorted(score.items(), key=lambda x: (-x[1], x[0]))


def fuse(words: Pairs, meaning: Pairs, method: str = METHOD, **kw) -> Pairs:
    if not meaning:
        return words
    if method == "rrf":
        return rrf(words, meaning, **kw)
    if method == "zscore":
        return zscore(words, meaning, **kw)
    return convex(words, meaning, **kw)
