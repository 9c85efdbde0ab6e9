"""The search query language (§4.1 rev. 2), parsed into what BM25 needs.

What people type into every search box they know:

- plain words: ranked, none required; a word repeated weighs more (BM25's
  query term frequency, linear as Lucene's repeated clauses);
- identifiers (``PIO-1384``, ``v2.3.1``, ``foo_bar``, ``a/b/c.md``,
  ``name@example.com``): ranked as their parts and, weighted above them, whole;
- ``"an exact phrase"``: its words ranked, and only passages holding those
  words in that order are shown (checked on the candidates' text);
- ``-word`` / ``-"a phrase"`` / ``-PIO-1384``: no passage holding it is shown;
- ``word*``: a prefix, expanded to at most :data:`MAX_EXPANSIONS` terms of
  the index's dictionary (an identifier prefix such as ``PIO-13*`` too).

Any text parses: an unbalanced quote runs to the end, a lone ``-`` or ``*``
is nothing, stop words alone make no terms. Cost is bounded whatever the
query: at most :data:`MAX_TERMS` distinct terms (ranked, excluded and
prefixes together) and :data:`MAX_PHRASES` phrases are used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lnkmem.index import analyze

MAX_TERMS = 256
MAX_PHRASES = 16
MAX_EXPANSIONS = 64
WHOLE_WEIGHT = 0.5  # a whole identifier's weight beside its parts' (tuned on SciFact train and an identifier set of seed 11)

# a phrase (its closing quote optional) or a run of anything else but spaces
_TOKEN = re.compile(r'(-?)"([^"]*)"?|(\S+)')
_WORDY = re.compile(r"[^\W_]")
_PREFIX = re.compile(r"[^\W_](?:[^\W_]|[-_./@:+#~])*\Z")
_SEP_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")


@dataclass
class Query:
    weights: dict[str, float] = field(default_factory=dict)  # ranked term -> weight (qtf)
    phrases: list[str] = field(default_factory=list)  # required: these words in this order
    phrase_terms: list[list[str]] = field(default_factory=list)  # each phrase's word terms (all required)
    excluded: set[str] = field(default_factory=set)  # no passage holding one of these terms
    excluded_phrases: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)  # ranked, expanded from the dictionary
    meaning_text: str = ""  # what the query means, operators and exclusions left out (for embedding)

    @property
    def plain(self) -> bool:
        """No syntax: ranked terms only."""
        return not (self.phrases or self.excluded or self.excluded_phrases or self.prefixes)

    @property
    def empty(self) -> bool:
        return not (self.weights or self.prefixes)

    def needs_text(self) -> bool:
        return bool(self.phrases or self.excluded_phrases)


class _Budget:
    """Distinct terms used so far, at most MAX_TERMS."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def take(self, term: str) -> bool:
        if term in self.seen:
            return True
        if len(self.seen) >= MAX_TERMS:
            return False
        self.seen.add(term)
        return True


def _terms_of(text: str) -> list[tuple[str, float]]:
    """(term, weight) of a stretch of query text: its words, then its whole
    identifiers; repeats kept (they are the query term frequency)."""
    out = [(t, 1.0) for t in map(analyze.term_of, analyze.words(text)) if t]
    out += [(i, WHOLE_WEIGHT) for i in analyze.idents(text)]
    return out


# what makes a query more than plain words: a phrase, an exclusion, a prefix, an identifier
_SYNTAX = re.compile('["*' + re.escape(analyze.CONNECTORS) + ']')


def parse(text: str) -> Query:
    if _SYNTAX.search(text) is None:
        return _plain(text)
    return _parse(text)


def _plain(text: str) -> Query:
    """:func:`_parse` of a query of plain words (no quote, star or connector): each word's
    term ranked, a repeat weighing more, at most MAX_TERMS of them."""
    q = Query(meaning_text=text)
    w = q.weights
    for t in map(analyze.term_of, analyze.words(text)):
        if t:
            if t in w:
                w[t] += 1.0
            elif len(w) < MAX_TERMS:
                w[t] = 1.0
    return q


def _parse(text: str) -> Query:
    q = Query()
    budget = _Budget()

    positive: list[str] = []

    def rank(stretch: str) -> None:
        positive.append(stretch)
        for t, w in _terms_of(stretch):
            if budget.take(t):
                q.weights[t] = q.weights.get(t, 0.0) + w

    for m in _TOKEN.finditer(text):
        neg, phrase, chunk = m.group(1), m.group(2), m.group(3)
        if phrase is not None:
            words = analyze.words(phrase)
            if not words:
                continue
            if neg:
                if len(q.excluded_phrases) < MAX_PHRASES:
                    q.excluded_phrases.append(phrase)
                continue
            if len(words) == 1 and not analyze.idents(phrase):  # one quoted word: that word
                rank(phrase)
                continue
            if len(q.phrases) >= MAX_PHRASES:
                rank(phrase)
                continue
            q.phrases.append(phrase)
            # candidates hold every word of it (a whole identifier of the phrase may sit
            # inside a longer one, "x.kill_attention": the text check decides)
            q.phrase_terms.append([t for t in map(analyze.term_of, words) if t and budget.take(t)])
            rank(phrase)
            continue
        if chunk.startswith("-") and len(chunk) > 1 and _WORDY.search(chunk):
            body = chunk.lstrip("-")
            whole = analyze.idents(body)
            if whole:
                terms = whole[:1]
            else:
                terms = [t for t in map(analyze.term_of, analyze.words(body)) if t]
            for t in terms:
                if budget.take(t):
                    q.excluded.add(t)
            continue
        if chunk.endswith("*") and _WORDY.search(chunk):
            body = chunk.rstrip("*")
            low = body.casefold()
            # the prefix: the last run of letters and connectors (``appl``, ``pio-13``,
            # ``pio-``, ``v2.``); a connector in it makes it a prefix of whole identifiers
            m = _PREFIX.search(low)
            if m is None or len(low) != len(body):
                rank(body)
                continue
            stem = m.group()
            if any(c in analyze.CONNECTORS for c in stem):
                stem = stem if len(stem) <= analyze.MAX_IDENT else ""
            else:
                stem = stem if len(stem) <= analyze.MAX_WORD else ""
            rank(body[: m.start()])
            if stem and budget.take("*" + stem) and len(q.prefixes) < MAX_PHRASES:
                q.prefixes.append(stem)
            continue
        rank(chunk)
    for t in q.excluded:  # an excluded term is not also ranked
        q.weights.pop(t, None)
    q.meaning_text = text if q.plain else " ".join(p for p in positive + q.prefixes if p)
    return q


_RUN = re.compile(r"[^\W_]+")


def phrase_pattern(phrase: str) -> re.Pattern:
    """The phrase's words in this order, case-folded. Words joined by connectors
    in the phrase (``PIO-1384``) must be joined so in the text; words apart may
    be separated by anything but letters and digits (nothing between ideographs,
    which are written without spaces)."""
    low = phrase.casefold()
    runs = []  # (start, end) of each letter run, ideographs one by one
    for m in _RUN.finditer(low):
        a = m.start()
        for j in range(m.start(), m.end()):
            if _SEP_CJK.match(low[j]):
                if j > a:
                    runs.append((a, j))
                runs.append((j, j + 1))
                a = j + 1
        if a < m.end():
            runs.append((a, m.end()))
    parts = []
    for k, (a, b) in enumerate(runs):
        if k:
            pa, pb = runs[k - 1]
            between = low[pb:a]
            if between and all(c in analyze.CONNECTORS for c in between):
                parts.append(re.escape(between))
            elif _SEP_CJK.match(low[pb - 1]) or _SEP_CJK.match(low[a]):
                parts.append(r"[\W_]*")
            else:
                parts.append(r"[\W_]+")
        parts.append(re.escape(low[a:b]))
    if not runs:
        return re.compile(r"(?!)")
    head = "" if _SEP_CJK.match(low[runs[0][0]]) else r"(?<![^\W_])"
    tail = "" if _SEP_CJK.match(low[runs[-1][1] - 1]) else r"(?![^\W_])"
    return re.compile(head + "".join(parts) + tail)
