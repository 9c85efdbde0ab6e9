"""Fusing the words ranking and the meaning ranking (index/hybrid.py)."""


def test_fusion_scores_the_union_by_both_rankings():
    """hybrid.fuse with both scorers: a passage one ranking missed gets that ranking's
    own score (a cosine of NaN, no vector yet, counts as the list's last, as before);
    without scorers the lists fuse as they are."""
    from lnkmem.index.rank import hybrid
    words = [(1, 9.0), (2, 5.0), (3, 1.0)]
    meaning = [(4, 0.9), (5, 0.8), (1, 0.5)]
    asked = {}

    def words_of(pids):
        asked["words"] = list(pids)
        return [{4: 0.0, 5: 4.0}[p] for p in pids]

    def meaning_of(pids):
        asked["meaning"] = list(pids)
        return [{2: 0.6, 3: float("nan")}[p] for p in pids]

    w, m = hybrid.complete(words, meaning, words_of, meaning_of)
    assert asked == {"words": [4, 5], "meaning": [2, 3]}
    assert dict(w) == {1: 9.0, 2: 5.0, 3: 1.0, 4: 0.0, 5: 4.0} and dict(m) == {4: 0.9, 5: 0.8, 1: 0.5, 2: 0.6}
    fused = [p for p, _ in hybrid.fuse(words, meaning, words_of=words_of, meaning_of=meaning_of)]
    assert fused.index(5) < fused.index(4)  # 5 holds the query's words, 4 none: 5 first now
    before = [p for p, _ in hybrid.fuse(words, meaning)]
    assert before.index(4) < before.index(5)  # each counted as the words list's last: nearer first
    assert hybrid.fuse(words, []) == words
