"""Unit tests: spec, sizes, words, chunking, conversations, notes rules, thread rules."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lnkmem import budget
from lnkmem.errors import ToolError, UsageError
from lnkmem.index.text import analyze, chats
from lnkmem.index.text.chunk import LIMIT, chunk_text
from lnkmem.notes import apply
from lnkmem.spec import parse_size, parse_spec
from lnkmem.threads import notes_refusal


# --- §2.1 spec -------------------------------------------------------------------

def test_spec_defaults_and_values():
    assert parse_spec(None).tokens == 2000
    assert parse_spec("").notes == "4 KB"
    s = parse_spec('{"model": "mini", "tokens": 50, "notes": "2 KiB", "engine": "lnkmem"}')
    assert (s.model, s.tokens, s.notes) == ("mini", 50, "2 KiB")


@pytest.mark.parametrize("text, key", [
    ('{"tokens": 0}', "tokens"), ('{"tokens": 1000001}', "tokens"), ('{"tokens": "5"}', "tokens"),
    ('{"tokens": true}', "tokens"), ('{"tokens": 5.5}', "tokens"),
    ('{"notes": "4 GB"}', "notes"), ('{"notes": 4000}', "notes"),
    ('{"model": ""}', "model"), ('{"model": "a\\nb"}', "model"), ('{"model": "' + "m" * 201 + '"}', "model"),
    ('{"colour": 1}', "colour"), ("[1]", "object"), ("nope", "JSON"),
])
def test_spec_refusals_name_the_key(text, key):
    with pytest.raises(UsageError) as e:
        parse_spec(text)
    assert key in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text, n", [("4 KB", 4000), ("4kb", 4000), ("2 KiB", 2048), ("1MB", 10**6),
                                     ("1 mib", 2**20), ("100", 100), ("100 B", 100), ("1.5 KB", 1500)])
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "KB", "4 GB", "-1 KB", "4 K B"])
def test_bad_sizes(text):
    with pytest.raises(ValueError):
        parse_size(text)


# --- words ---------------------------------------------------------------------

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


# --- chunking -------------------------------------------------------------------

def test_chunks_keep_line_ranges_and_headings():
    text = "# Title\n## Part\n\npara one\nline two\n\n## Next\n\nmore text\n"
    pieces = chunk_text(text)
    assert [(p.first, p.last) for p in pieces] == [(1, 5), (7, 9)]
    assert pieces[0].text.startswith("# Title") and "line two" in pieces[0].text
    lines = text.split("\n")
    for p in pieces:  # a passage's text is exactly its lines
        assert p.text == "\n".join(lines[p.first - 1:p.last])


def test_long_lines_and_blocks_are_cut():
    text = ("word " * 1000 + "\n") + "\n".join(f"line {i}" for i in range(2000))
    pieces = chunk_text(text)
    assert all(len(p.text) <= LIMIT for p in pieces)
    assert pieces[0].first == 1 and pieces[-1].last == 2001


# --- conversations ----------------------------------------------------------------

def test_conversation_shapes():
    data = "\n".join([
        '{"role": "user", "text": "hello there", "at": "2026-01-01T00:00:00Z", "from": "o1"}',
        '{"role": "assistant", "content": [{"type": "text", "text": "hi"}, {"type": "image"}]}',
        '{"type": "user", "message": {"role": "user", "content": "harness line"}, "timestamp": "2026-01-02T00:00:00Z"}',
        'not json',
        '{"what": 1}',
        '{"role": "user", "text": "half wri',
    ])
    msgs, skipped = chats.messages(data)
    assert [(m.line, m.role, m.text) for m in msgs] == [
        (1, "user", "hello there"), (2, "assistant", "hi"), (3, "user", "harness line")]
    assert msgs[2].at == "2026-01-02T00:00:00Z" and skipped == 3
    assert chats.thread_of("o1.compact.jsonl") == "o1" and chats.thread_of("o1.md") == "o1"


# --- notes -----------------------------------------------------------------------

def test_notes_add_remove_fold():
    c = apply("- a\n- b\n", "new\nline  here", None, 4000)
    assert c.text == "- a\n- b\n- new line here\n" and c.entries == 3
    c = apply(c.text, None, "  - b ", 4000)
    assert c.text == "- a\n- new line here\n"
    c = apply("- a\n- b\n", "c", "a", 4000)
    assert c.text == "- b\n- c\n"


def test_notes_remove_needs_exactly_one_match():
    with pytest.raises(ToolError) as e:
        apply("- tea\n- tea\n", None, "tea", 4000)
    assert "2 lines" in str(e.value) and "- tea" in str(e.value)
    with pytest.raises(ToolError) as e:
        apply("- green tea\n- coffee\n", None, "tea", 4000)
    assert "no line equals" in str(e.value) and "green tea" in str(e.value)
    with pytest.raises(ToolError):
        apply("- a\n", None, None, 4000)


def test_notes_limit_says_size_limit_and_how_much():
    with pytest.raises(ToolError) as e:
        apply("- " + "x" * 90 + "\n", "y" * 20, None, 100)
    msg = str(e.value)
    assert "116 bytes" in msg and "100 bytes" in msg and "16 bytes" in msg


def test_thread_rules():
    assert notes_refusal(None, "", False) is None  # without LNK_MEMORY_FROM every call is the owner's
    assert notes_refusal("o1", "o1", True) is None
    assert notes_refusal("o1/chat-2", "o1", True) is None
    for t in ("agent-x", "team-y", "task-z", "stranger", "o10"):
        assert notes_refusal(t, "o1", True)
    assert notes_refusal("o1", "", True)  # no owner: nothing proves it


# --- budget ------------------------------------------------------------------------

def test_cut_respects_utf8_bytes():
    text, cut = budget.cut("é" * 100, 11)
    assert cut and budget.nbytes(text) <= 11
    assert budget.share([10, 100, 100], 150) == [10, 70, 70]


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
