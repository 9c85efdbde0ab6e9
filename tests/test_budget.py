"""The answer's budget: a cut that respects UTF-8 bytes, shares of a budget."""

from lnkmem.protocol import budget


def test_cut_respects_utf8_bytes():
    text, cut = budget.cut("é" * 100, 11)
    assert cut and budget.nbytes(text) <= 11
    assert budget.share([10, 100, 100], 150) == [10, 70, 70]
