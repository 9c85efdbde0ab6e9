"""Prose is not syntax (§4.1 rev. 3, issue 35), through the real `lnk-lnkmem serve`:
a short keyword query keeps its operators, a pasted text is read as prose, a phrase
beside words scores rather than filters, identifiers beat their parts, a phrase may
span two passages of a file, long lines are cut between words, a message's own words
outweigh its context, and up to 100 hits."""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import Home, Server

FILLER = ("Notes on the harbour survey, the ferry timetable and the long walk back along the "
          "coast road, with nothing in them that any query below looks for. ")


@pytest.fixture(scope="module")
def prose_server(tmp_path_factory):
    home = Home(tmp_path_factory.mktemp("prose"))
    home.write("climate/ice.md", "Mountain glaciers retreat each summer; melting rates doubled since 1990.\n")
    home.write("climate/coast.md", "Sea levels rise along the coast as the warm water expands.\n")
    home.write("phrases/one.md", "The quick brown fox jumps over the lazy dog.\n")
    home.write("phrases/two.md", "The brown quick fox, lazy as a dog, jumps.\n")
    home.write("words/apple.md", "Apples and applesauce recipes.\n")
    home.write("words/both.md", "Orchard notes: pears. Orchard apples too.\n")
    home.write("words/application.md", "An application form for the orchard.\n")
    home.write("talk/dash.md", "Morse code: a dot, a dash, a dot again.\n")
    home.write("talk/nodash.md", "Morse code: a dot and another dot.\n")
    # the identifier rule: one file holds it exactly, others only its parts, many times
    home.write("tickets/exact.md", "Tracking PIO-1384 for the release; the fix is in review and looks long to land.\n")
    home.write("tickets/parts.md", "PIO 1384 is unrelated; PIO PIO 1384 and 1384 again, PIO 1384.\n")
    home.write("tickets/dec.md", "Decision DEC-0054 was taken at the review of the budget and the plan.\n")
    home.write("tickets/decparts.md", "DEC 0054 DEC DEC 0054 0054 dec 0054.\n")
    # a phrase across a passage boundary: two paragraphs, each a passage of its own
    home.write("long/boundary.md", FILLER * 9 + "The wombat said alpha bravo\n\ncharlie delta the wombat ended. "
               + FILLER * 9 + "\n\nThe wombat, the wombat and the wombat again.\n")
    # a line longer than the limit (2,400 characters) with a word where the limit falls
    line = ("word " * 479) + "xylophonically " + ("more " * 200)
    assert line.index("xylophonically") < 2400 < line.index("xylophonically") + len("xylophonically")
    home.write("long/line.md", line + "\n")
    s = Server.start(home)
    s.initialize()
    s.wait_indexed()
    yield s
    s.close()


def _hits(server, query, **kw):
    r = server.search(query, **kw)
    assert not r.get("isError"), r
    return r["structuredContent"]["hits"]


def _refs(server, query, **kw):
    return [h["ref"] for h in _hits(server, query, **kw)]


def test_a_short_keyword_query_keeps_its_operators(prose_server):
    s = prose_server
    assert _refs(s, "orchard -apples") == ["home/words/application.md"]
    assert set(_refs(s, "appl* -orchard")) == {"home/words/apple.md"}
    assert _refs(s, '"quick brown fox"') == ["home/phrases/one.md"]  # a query of phrases only: required
    assert _refs(s, "+dash morse") == ["home/talk/dash.md"]  # the explicit required marker
    assert _refs(s, "code -dash") == ["home/talk/nodash.md"]
    # beside plain words a phrase scores: the passage holding it first, the others kept
    assert _refs(s, 'jumps "lazy dog"') == ["home/phrases/one.md", "home/phrases/two.md"]
    assert _refs(s, 'jumps +"lazy dog"') == ["home/phrases/one.md"]


def test_typographic_quotes_are_quotes(prose_server):
    s = prose_server
    for q in ("\u201cquick brown fox\u201d", "\u00abquick brown fox\u00bb", "\u201equick brown fox\u201c"):
        assert _refs(s, q) == ["home/phrases/one.md"], q
    assert _refs(s, "\u201cbrown quick\u201d") == ["home/phrases/two.md"]


def test_pasted_prose_loses_no_document_to_its_punctuation(prose_server):
    s = prose_server
    # quotes that hold words in another order than the document, a dash glued to a
    # word, a footnote star: read as syntax, each would have lost the right document
    q = ('The report we discussed says "summer glaciers retreat" faster than expected, and '
         'that -glaciers, melting* rates have doubled since 1990; see the "other notes.')
    assert _refs(s, q)[0] == "home/climate/ice.md"
    # a pasted transcript that writes a dash as " -dash" excludes nothing
    q = "In the recording the operator keyed a dot, then -dash, then a dot again, in Morse code."
    assert set(_refs(s, q)[:2]) == {"home/talk/dash.md", "home/talk/nodash.md"}
    assert _refs(s, q)[0] == "home/talk/dash.md"
    # an em dash and an en dash are punctuation in either reading
    assert _refs(s, "morse \u2014 dash")[0] == "home/talk/dash.md"
    assert _refs(s, "morse \u2013dash")[0] == "home/talk/dash.md"


def test_an_odd_quote_never_makes_a_phrase_to_the_end(prose_server):
    s = prose_server
    assert _refs(s, '"lazy dog') == _refs(s, "lazy dog")
    assert set(_refs(s, '"lazy dog')) == {"home/phrases/one.md", "home/phrases/two.md"}
    # three quotes: the first two pair, the last is punctuation
    assert _refs(s, '"quick brown" "lazy dog') == _refs(s, 'quick brown lazy dog "quick brown"')
    long = 'He wrote "the brown quick fox was lazy, he said "and the dog jumped over it all.'
    assert "home/phrases/two.md" in _refs(s, long) and "home/phrases/one.md" in _refs(s, long)


def test_a_phrase_beside_words_lifts_its_passage_and_prose_ranks_as_its_words(prose_server):
    s = prose_server
    # both files hold every word; in a keyword query the phrase decides, and neither is lost
    assert _refs(s, 'fox jumps "quick brown"')[:2] == ["home/phrases/one.md", "home/phrases/two.md"]
    assert _refs(s, 'fox jumps "brown quick"')[:2] == ["home/phrases/two.md", "home/phrases/one.md"]
    # pasted prose ranks exactly as its text without quotes, stars and leading dashes
    for q in ('Somebody wrote that "the quick brown fox" and a lazy dog were in the story, then it -jumps*.',
              'He said \u201cthe brown quick fox\u201d was \u00ablazy\u00bb \u2014 and the dog jumped, "twice.'):
        bare = q
        for c in '"*\u201c\u201d\u00ab\u00bb':
            bare = bare.replace(c, "")
        bare = bare.replace(" -", " ")
        got = [(h["ref"], h["score"]) for h in _hits(s, q)]
        assert got and got == [(h["ref"], h["score"]) for h in _hits(s, bare)], (q, bare)


def test_an_exact_identifier_ranks_above_its_parts_whatever_their_counts(prose_server):
    s = prose_server
    for q in ("PIO-1384", "pio-1384", "PIO-1384 release", "What is the state of PIO-1384? It was in review."):
        assert _refs(s, q)[:2] == ["home/tickets/exact.md", "home/tickets/parts.md"], q
    for q in ("DEC-0054", "the budget decision DEC-0054, taken at the review"):
        assert _refs(s, q)[0] == "home/tickets/dec.md", q
    assert "home/tickets/parts.md" in _refs(s, "1384")  # its parts alone still find the parts


def test_a_phrase_may_span_a_passage_boundary(prose_server):
    s = prose_server
    hits = _hits(s, '"alpha bravo charlie delta"')
    assert hits and {h["ref"] for h in hits} == {"home/long/boundary.md"}
    assert len({tuple(h["lines"]) for h in hits}) == 2  # the two passages it spans
    assert _refs(s, '"bravo delta"') == []  # words apart are no phrase
    # beside a word the spanning phrase scores: each of its two passages lifted, the others not
    lifted = {tuple(h["lines"]): h["score"] for h in _hits(s, 'wombat "alpha bravo charlie delta"')}
    bare = {tuple(h["lines"]): h["score"] for h in _hits(s, "wombat alpha bravo charlie delta")}
    spanning = {tuple(h["lines"]) for h in hits}
    assert lifted.keys() == bare.keys() and len(bare) == 3
    assert all((lifted[k] > bare[k] + 0.1) == (k in spanning) for k in bare), (lifted, bare)


def test_a_long_line_is_cut_between_words(prose_server):
    s = prose_server
    hits = _hits(s, "xylophonically", limit=10)
    assert [h["ref"] for h in hits] == ["home/long/line.md"]
    assert "xylophonically" in hits[0]["text"]
    every = _hits(s, "word more", limit=10)
    texts = [h["text"] for h in every if h["ref"] == "home/long/line.md"]
    assert len(texts) == 2 and all(len(t) <= 2400 for t in texts)
    assert "".join(sorted(texts, key=lambda t: not t.startswith("word"))).count("xylophonically") == 1


def test_any_text_is_a_query_answered_quickly(prose_server):
    s = prose_server
    for q in ['"', "\u201c", "\u00ab\u00bb", '"""""', "+", "-", "*", "+ - * \" \u201d", '+"', "-+*",
              "!?.,;:" * 1666, '"' * 10_000, "\u201c" * 10_000, "-" * 10_000, "*-+\"" * 2500,
              ".,;:!?\"'()[]{}<>-*+/\\|@#$%^&~`" * 322, '"a' * 5000, "+a " * 3333, "a-b* " * 2000]:
        r = s.search(q[:10_000])  # (within the call's 20 s deadline; search latency: bench_local)
        assert not r.get("isError"), (q[:20], r)


def test_a_message_found_by_its_context_only_ranks_below_those_that_say_it(home):
    """The bundled example: a reply carries the gist of the two messages before it; the
    messages that say "deploy freeze" themselves rank above the message that only
    carries it in its context (its own words count twice: chats.OWN_WEIGHT)."""
    home.chat("owner", [
        {"role": "user", "text": "When is the deploy freeze this year?", "at": "2026-11-25T09:12:00Z"},
        {"role": "assistant", "text": "The deploy freeze runs from 22 December to 2 January, as decided at "
                                      "the 24 November stand-up.", "at": "2026-11-25T09:12:05Z"},
        {"role": "user", "text": "Remind me to ask Marco about the batch runner budget on Friday.",
         "at": "2026-11-26T16:40:00Z"},
    ])
    home.write("skills/deploy/SKILL.md", "# Skill: ship a release\n\n1. Check the deploy freeze calendar "
               "(no deploys 22 December - 2 January).\n2. Tag the release on main and run make release on "
               "the build host.\n3. Watch the health checks; on a failed region, run make rollback.\n")
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        for q in ('"deploy freeze"', "deploy freeze"):
            hits = s.search(q, limit=10)["structuredContent"]["hits"]
            marco = [i for i, h in enumerate(hits) if "Marco" in h["text"].split("\n")[-1]]
            saying = [i for i, h in enumerate(hits) if "deploy freeze" in h["text"].split("\n")[-1].lower()
                      and h["ref"].startswith("chats/")]
            assert len(saying) == 2 and marco, (q, hits)
            assert max(saying) < min(marco), (q, [h["text"][-60:] for h in hits])


def test_limit_up_to_100(home):
    for i in range(120):
        home.write(f"many/n{i:03d}.md", f"numbat sighting number {i}\n")
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        r = s.search("numbat", limit=100)
        assert not r.get("isError"), r
        assert len(r["structuredContent"]["hits"]) == 100
        r = s.search("numbat", limit=101)
        assert r.get("isError") and "limit" in r["content"][0]["text"]


_PIECES = st.lists(st.sampled_from(["word", "xylophonically", "a", "Rich", "Countries", ".", ",", " ", "  ", ". ",
                                    "! ", "\u6771\u4eac", "\u2014", "-", "x" * 300, "e\u0301"]), min_size=1, max_size=1500)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(_PIECES)
def test_a_long_line_is_cut_into_its_own_text_never_inside_a_word(parts):
    """Any line: pieces of at most LIMIT characters that join back into the line, each cut
    between two characters that are not both letters or digits (an ideograph is a word of
    its own), unless the piece's second half holds no such place (a run like x * 300 * 9)."""
    from lnkmem.index.text.chunk import LIMIT, chunk_text, cuts
    line = "".join(parts)
    pieces = [p.text for p in chunk_text(line + "\n")]
    assert "".join(pieces) == line.rstrip("\n") or not line.strip()
    at = 0
    for k in cuts(line):
        assert 0 < k - at <= LIMIT
        half = line[at + LIMIT // 2:k + 1]
        inside = line[k - 1].isalnum() and line[k].isalnum() and not ("\u4e00" <= line[k] <= "\u9fff")
        assert not inside or all(c.isalnum() for c in half), (at, k, line[k - 20:k + 20])
        at = k
    assert len(line) - at <= LIMIT


def test_a_line_at_the_limit_is_cut_at_a_sentence_end_near_it():
    from lnkmem.index.text.chunk import LIMIT, cuts
    line = "One sentence ends here. " * 150
    k = cuts(line)[0]
    assert line[:k].endswith("here. ") and LIMIT - 400 <= k <= LIMIT
    line = "Rich Countries " * 400  # no sentence: after a space
    assert all(line[k - 1] == " " for k in cuts(line))
