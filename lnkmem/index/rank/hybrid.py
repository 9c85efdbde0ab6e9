"""Fusing words (BM25) and meaning (cosine) rankings.

Three methods, compared on BEIR SciFact's train queries and LoCoMo's tuning
conversations (docs/BENCHMARKS.md, ``bench/bench_meaning.py``): reciprocal
rank fusion; a convex combination of scores after min-max normalisation of
each list; and a convex combination of z-scores (each score in standard
deviations from its list's mean). The default is the one that measured best
on the tuning queries: z-scores, words weighted 0.6 and meaning 0.4 (the
best of the sum of both tuning figures; docs/BENCHMARKS.md).

Each list is the top of its ranking (the engine fuses ``CANDIDATES`` of
each). ``Engine.rank`` passes both scorers, so every passage of the union is
scored by both rankings (:func:`complete`: BM25 for a passage only meaning
found, ``search.scores_of``; cosine for one only words found,
``VectorIndex.cosines``) and each list's mean and deviation are those of the
union: a passage that holds a few of the query's words is no longer scored
as if it held as many as the words list's last, nor one that holds none
(SciFact train nDCG@10 0.7313 -> 0.7343, LoCoMo 1-5 R@10 0.792 -> 0.795).
Without the scorers (or for a passage with no vector yet), a passage absent
from a list counts as that list's last.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

Pairs = list[tuple[int, float]]
Scorer = Callable[[Sequence[int]], Sequence[float]]  # pids -> their scores by one ranking

METHOD = "zscore"  # "zscore" | "convex" | "rrf" (tuned on train)
ALPHA = 0.6  # weight of words (z-scores over the union scored by both: SciFact train 0.734 at 0.6, flat within 0.0023 from 0.425 to 0.6; LoCoMo 1-5 R@10 0.795 at 0.6, 0.798 at 0.7; the sum of both peaks at 0.575-0.6)
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


def complete(words: Pairs, meaning: Pairs, words_of: Scorer, meaning_of: Scorer) -> tuple[Pairs, Pairs]:
    """Both lists over their union: each passage only one ranking found scored by the
    other too (``words_of``: BM25 of the given pids; ``meaning_of``: their cosines,
    NaN for a passage without a vector, which is then left out of the meaning list
    as before: it counts as that list's last)."""
    in_w = {p for p, _ in words}
    in_m = {p for p, _ in meaning}
    only_m = [p for p, _ in meaning if p not in in_w]
    only_w = [p for p, _ in words if p not in in_m]
    if only_m:
        words = words + list(zip(only_m, (float(x) for x in words_of(only_m))))
    if only_w:
        meaning = meaning + [(p, float(x)) for p, x in zip(only_w, meaning_of(only_w)) if not math.isnan(x)]
    return words, meaning


def fuse(words: Pairs, meaning: Pairs, method: str = METHOD, words_of: Optional[Scorer] = None,
         meaning_of: Optional[Scorer] = None, **kw) -> Pairs:
    """The fused ranking of two lists (best first). With ``words_of`` and
    ``meaning_of``, every passage of the union is scored by both rankings first
    (:func:`complete`); without, a passage absent from a list counts as its last."""
    if not meaning:
        return words
    if words_of is not None and meaning_of is not None:
        words, meaning = complete(words, meaning, words_of, meaning_of)
    if method == "rrf":
        return rrf(words, meaning, **kw)
    if method == "zscore":
        return zscore(words, meaning, **kw)
    return convex(words, meaning, **kw)
