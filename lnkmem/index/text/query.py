"""The search query language (§4.1 rev. 3), parsed into what BM25 needs.

Syntax is for people who mean it. A query is read one of two ways:

- **as syntax** when it is short and keyword-like: at most
  :data:`SYNTAX_WORDS` words (its phrases' words counted) and no sentence
  punctuation (``. , ; : ! ?`` before a space, a quote, a star or the end;
  ``v2.3.1`` is no sentence), or, without sentence punctuation, when it is
  made of operators only (every piece a phrase, ``-word``, ``word*`` or
  ``+word``);
- **as prose** otherwise: a pasted text. Its quotes are punctuation, its
  dashes are dashes, ``word*`` is the word: every word ranked, nothing
  excluded, nothing required but an explicit ``+"a phrase"``. Any other prose
  query ranks exactly as the same text with its quotes, stars and leading
  dashes and pluses taken out (``bench/bench_prose.py`` measures it).

Read as syntax:

- plain words: ranked, none required; a word repeated weighs more (BM25's
  query term frequency, linear as Lucene's repeated clauses);
- ``"an exact phrase"``: its words ranked and, where the query's only ranked
  parts are phrases (``"deploy freeze"``, ``"a" "b" -c``), required: only
  passages holding those words in that order are shown. Beside plain words
  (``"deploy freeze" budget``) a phrase scores instead: a passage holding it
  ranks higher, one without it loses nothing;
- ``+word``, ``+PIO-1384``, ``+"a phrase"``: required (the explicit marker);
- ``-word`` / ``-"a phrase"`` / ``-PIO-1384``: no passage holding it is shown;
- ``word*``: a prefix, expanded to at most :data:`MAX_EXPANSIONS` terms of
  the index's dictionary (an identifier prefix such as ``PIO-13*`` too).

Either way:

- identifiers (``PIO-1384``, ``v2.3.1``, ``foo_bar``, ``a/b/c.md``,
  ``name@example.com``) are ranked as their parts and whole; the whole
  identifier's score is at least the most its parts can give, so the passage
  holding it exactly ranks above any passage holding only its parts, however
  often (``terms.flat_idfs``: its term scores flat; :attr:`Query.flat`). In
  prose only identifiers that name one thing are flat (letters joined to a
  number of 3 digits or more: ``PIO-1384``, ``CVE-2024-38650``): a hyphenated
  word of prose (``IL-6``, ``well-known``) ranks as its parts and, weighted
  :data:`WHOLE_WEIGHT`, whole (every one flat: SciFact train 0.695 -> 0.681);
- quotes pair left to right, typographic ones (“ ” „ ‟ « ») as ``"``; an
  unpaired last quote is punctuation, never a phrase running to the end;
- a phrase may span the boundary between two passages of one file.

Any text parses: a lone ``-``, ``+`` or ``*`` is nothing, stop words alone
make no terms. Cost is bounded whatever the query: at most
:data:`MAX_TERMS` distinct terms (ranked, excluded and prefixes together) and
:data:`MAX_PHRASES` phrases are used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from lnkmem.index.text import analyze

MAX_TERMS = 256
MAX_PHRASES = 16
MAX_EXPANSIONS = 64
WHOLE_WEIGHT = 0.5  # a whole identifier's own weight beside its parts' (tuned on SciFact train and an identifier set of seed 11)
SYNTAX_WORDS = 6  # a query of at most this many words (its phrases' too), without sentence punctuation, reads as syntax

QUOTES = "\"\u201c\u201d\u201e\u201f\u00ab\u00bb"  # " “ ” „ ‟ « »: all read as "
_QUOTE_MAP = str.maketrans({c: '"' for c in QUOTES[1:]})
# a phrase (its marker, its text) or a run of anything else but spaces and quotes
_TOKEN = re.compile(r'([+-]?)"([^"]*)"|([^\s"]+)')
_WORDY = re.compile(r"[^\W_]")
_PREFIX = re.compile(r"[^\W_](?:[^\W_]|[-_./@:+#~])*\Z")
_SEP_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")
# sentence punctuation: a full stop, comma, semicolon, colon, ! or ? before a space or the end
# an identifier that names one thing: letters joined to a number of 3 digits or more
# (PIO-1384, DEC-0054, CVE-2024-38650), flat in prose too; a hyphenated word of prose
# (IL-6, well-known) is flat only in a query read as syntax
_TICKET = re.compile(r"[^\W\d_][-_./:#]?\d{3}|\d{3}[-_./:#]?[^\W\d_]")
_SENTENCE = re.compile(r"[.,;:!?\u3002\uff0c](?=[\s\"*)\]]|\Z)")


@dataclass
class Query:
    weights: dict[str, float] = field(default_factory=dict)  # ranked term -> weight (qtf)
    phrases: list[str] = field(default_factory=list)  # required: these words in this order
    phrase_terms: list[list[str]] = field(default_factory=list)  # each required phrase's word terms
    scored: list[str] = field(default_factory=list)  # phrases that lift a passage holding them, never filter
    scored_terms: list[list[str]] = field(default_factory=list)  # each scored phrase's word terms
    required: list[list[str]] = field(default_factory=list)  # +word: a passage must hold each of these terms
    excluded: set[str] = field(default_factory=set)  # no passage holding one of these terms
    excluded_phrases: list[str] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)  # ranked, expanded from the dictionary
    meaning_text: str = ""  # what the query means, operators and exclusions left out (for embedding)
    prose: bool = False  # read as prose: its operators were punctuation
    flat: set = field(default_factory=set)  # whole identifiers scored flat (terms.flat_idfs)

    @property
    def plain(self) -> bool:
        """No syntax: ranked terms only."""
        return not (self.phrases or self.scored or self.required or self.excluded or self.excluded_phrases
                    or self.prefixes)

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


# what makes a query more than plain words: a quote, a star, a plus or a connector
_SYNTAX = re.compile("[*" + re.escape(QUOTES + analyze.CONNECTORS) + "]")


def parse(text: str, syntax: Optional[bool] = None) -> Query:
    """The query ``text`` means, read by the rule (:func:`reads_as_syntax`), or as syntax
    (``syntax=True``) or prose (``False``) whatever its length (for a caller that knows)."""
    if _SYNTAX.search(text) is None and syntax is None:
        return _plain(text)
    return _parse(text, syntax)


def _plain(text: str) -> Query:
    """:func:`_parse` of a query of plain words (no quote, star or connector): each word's
    term ranked, a repeat weighing more, at most MAX_TERMS of them."""
    q = Query(meaning_text=text, prose=not _plain_reads_as_syntax(text))
    w = q.weights
    for t in map(analyze.term_of, analyze.words(text)):
        if t:
            if t in w:
                w[t] += 1.0
            elif len(w) < MAX_TERMS:
                w[t] = 1.0
    return q


def _plain_reads_as_syntax(text: str) -> bool:
    """:func:`reads_as_syntax` of a query of plain words (no quote, star or connector: no
    piece of it an operator, its pieces those of ``str.split``), without tokenizing it
    when no sentence punctuation is anywhere in it: then it reads as syntax when at most
    SYNTAX_WORDS of its pieces hold a word (a search's every plain query: its cost each time)."""
    if _SENTENCE.search(text + " ") is not None:
        return reads_as_syntax(text)
    pieces = text.split()
    return len(pieces) <= SYNTAX_WORDS or sum(1 for p in pieces if _WORDY.search(p)) <= SYNTAX_WORDS


def _balanced(text: str) -> str:
    """``text`` with its quotes as ``"`` and an unpaired last one made a space."""
    text = text.translate(_QUOTE_MAP)
    if text.count('"') % 2:
        at = text.rfind('"')
        text = text[:at] + " " + text[at + 1:]
    return text


def _operator(m: re.Match) -> bool:
    """Whether a token is an operator: a phrase, ``-x``, ``+x`` or ``x*``."""
    if m.group(2) is not None:
        return True
    chunk = m.group(3)
    return (chunk[0] in "+-" or chunk.endswith("*")) and len(chunk) > 1 and _WORDY.search(chunk) is not None


def reads_as_syntax(text: str) -> bool:
    """The rule (§4.1 rev. 3): a query reads as syntax when it is short and keyword-like (at
    most SYNTAX_WORDS words outside its phrases, no sentence punctuation outside them), or
    when every piece of it is an operator; else as prose."""
    return _reads_as_syntax(list(_TOKEN.finditer(_balanced(text))))


def _reads_as_syntax(tokens: list) -> bool:
    meaningful = [m for m in tokens if m.group(2) is not None or _WORDY.search(m.group(3))]
    if any(_SENTENCE.search(m.group(0) + " ") for m in meaningful):
        return False
    if meaningful and all(_operator(m) for m in meaningful):
        return True
    return sum(len(m.group(2).split()) if m.group(2) is not None else 1 for m in meaningful) <= SYNTAX_WORDS


def _parse(text: str, syntax: Optional[bool] = None) -> Query:
    q = Query()
    budget = _Budget()
    text = _balanced(text)
    tokens = list(_TOKEN.finditer(text))
    if syntax is None:
        syntax = _reads_as_syntax(tokens)
    q.prose = not syntax
    positive: list[str] = []
    phrases: list[tuple[str, bool]] = []  # (phrase, required by its marker)

    def rank(stretch: str) -> None:
        positive.append(stretch)
        for t, w in _terms_of(stretch):
            if budget.take(t):
                q.weights[t] = q.weights.get(t, 0.0) + w

    def word_terms(stretch: str) -> list[str]:
        return [t for t in map(analyze.term_of, analyze.words(stretch)) if t and budget.take(t)]

    ranked_outside = False  # a plain word (or prefix) beside the phrases
    for m in tokens:
        mark, phrase, chunk = m.group(1), m.group(2), m.group(3)
        if phrase is not None:
            words = analyze.words(phrase)
            if not words:
                continue
            if mark == "-" and syntax:
                if len(q.excluded_phrases) < MAX_PHRASES:
                    q.excluded_phrases.append(phrase)
                continue
            if len(words) == 1 and not analyze.idents(phrase):  # one quoted word: that word
                if mark == "+":
                    q.required.append(word_terms(phrase))
                rank(phrase)
                continue
            phrases.append((phrase, mark == "+"))
            rank(phrase)
            continue
        if not syntax or not _WORDY.search(chunk):
            if _WORDY.search(chunk):
                ranked_outside = True
            rank(chunk)
            continue
        if chunk.startswith("-") and len(chunk) > 1:
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
        if chunk.startswith("+") and len(chunk) > 1:
            body = chunk.lstrip("+")
            whole = analyze.idents(body)
            terms = [w for w in whole[:1] if budget.take(w)] if whole else word_terms(body)
            if terms:
                q.required.append(terms)
            rank(body)
            continue
        if chunk.endswith("*"):
            body = chunk.rstrip("*")
            low = body.casefold()
            # the prefix: the last run of letters and connectors (``appl``, ``pio-13``,
            # ``pio-``, ``v2.``); a connector in it makes it a prefix of whole identifiers
            pm = _PREFIX.search(low)
            ranked_outside = True
            if pm is None or len(low) != len(body):
                rank(body)
                continue
            stem = pm.group()
            if any(c in analyze.CONNECTORS for c in stem):
                stem = stem if len(stem) <= analyze.MAX_IDENT else ""
            else:
                stem = stem if len(stem) <= analyze.MAX_WORD else ""
            rank(body[: pm.start()])
            if stem and budget.take("*" + stem) and len(q.prefixes) < MAX_PHRASES:
                q.prefixes.append(stem)
            continue
        ranked_outside = True
        rank(chunk)
    # a phrase is required where the query means it: marked +, or the query's only
    # ranked parts are phrases (read as syntax); else, read as syntax, it scores; in
    # prose its quotes were punctuation (a lift measured nothing there: the prose set's
    # tuning parts, SciFact train 0.6948 -> 0.6951 at 0.1 of its words' idf, 0.6901 at 1)
    for phrase, marked in phrases:
        required = marked or (syntax and not ranked_outside)
        if not (required or syntax):
            continue
        if len(q.phrases) + len(q.scored) >= MAX_PHRASES:
            break
        # candidates hold every word of it (a whole identifier of the phrase may sit
        # inside a longer one, "x.kill_attention": the text check decides)
        terms = word_terms(phrase)
        if required:
            q.phrases.append(phrase)
            q.phrase_terms.append(terms)
        else:
            q.scored.append(phrase)
            q.scored_terms.append(terms)
    for t in q.excluded:  # an excluded term is not also ranked
        q.weights.pop(t, None)
    q.flat = {t for t in q.weights if analyze.joined(t) and (syntax or _TICKET.search(t))}
    q.meaning_text = text if (q.plain or q.prose) else " ".join(p for p in positive + q.prefixes if p)
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
