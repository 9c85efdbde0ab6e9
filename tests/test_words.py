"""Words: case folded, stemmed and stopped; Unicode and CJK split; the byte
tables for ASCII text give what the Unicode regexes give."""

from hypothesis import given, settings
from hypothesis import strategies as st

from lnkmem.index.text import analyze


def test_words_fold_case_stem_and_stop():
    counts, length = analyze.term_counts("The Runners were RUNNING; the runner runs.")
    assert counts["runner"] == 2 and counts["run"] == 2
    assert "the" not in counts and length == 5  # "were" is no stop word in Lucene's set
    assert analyze.query_terms("ÉCOLE école") == ["école"]
    assert analyze.query_terms("the of and") == []


def test_words_unicode_and_cjk():
    assert analyze.words("naïve café 東京") == ["naïve", "café", "東", "京"]
    assert analyze.words("snake_case x86") == ["snake", "case", "x86"]


def _scan_by_regex(text):
    low = text.casefold()
    return analyze._WORD.findall(low), analyze.idents(text, inner=True)


_ASCII_AND_MORE = st.text(st.sampled_from(
    list("abcXYZ019 -_./@:+#~!?,;()[]'\"\n\t\x00\x0b\x1f\x7f") + list("…—’“”·é東") + ["\u00a0", "\u0130", "\u00df"]), max_size=80)


@settings(max_examples=400, deadline=None)
@given(_ASCII_AND_MORE)
def test_words_and_identifiers_by_the_byte_tables_are_the_regexes(text):
    """ASCII text (and text whose only other characters are blanked punctuation) is
    split by byte tables; what they give is what the Unicode regexes give."""
    words, whole = analyze.scan(text)
    want_words, want_whole = _scan_by_regex(text)
    assert [w.decode() if isinstance(w, bytes) else w for w in words] == want_words
    assert sorted(whole) == sorted(want_whole)


def test_scan_takes_the_tables_for_ascii_and_typographic_punctuation_only():
    words, whole = analyze.scan("Deploy PIO-1384 — see docs/api/plan-b.md… “done”")
    assert all(isinstance(w, bytes) for w in words) and b"pio" in words and b"1384" in words
    assert {"pio-1384", "docs/api/plan-b.md", "api/plan-b.md", "plan-b.md"} <= set(whole)
    words, _ = analyze.scan("Café au lait")
    assert words == ["café", "au", "lait"]
