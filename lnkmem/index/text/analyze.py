"""Words: Unicode case folding, word splitting, English stemming, identifiers.

The same analysis runs on passages at index time and on queries at search
time. Stemming is memoised: a corpus has far fewer distinct words than
words, so each distinct word is stemmed once.

Identifiers (§4.1 rev. 2: ``PIO-1384``, ``v2.3.1``, ``foo_bar``, ``a/b/c.md``,
``name@example.com``) are words joined by connectors. Each is indexed twice:
as its parts (the words, as always) and whole (case-folded, not stemmed), so
that an exact identifier ranks above passages that only share its parts. A
whole term always holds a connector, so it never collides with a word's term;
it does not count in a passage's length, so a query of plain words scores
every passage exactly as it did before identifiers were indexed.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Optional

import snowballstemmer

# Runs of letters and digits (Unicode-aware), underscores splitting words;
# CJK ideographs, kana and hangul are taken one character at a time since
# they are written without spaces.
_WORD = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
    r"|[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)
MAX_WORD = 64
MAX_IDENT = 128
# ... and bytes of UTF-8: a term is a key of LMDB behind a 4-byte segment (at most 511
# bytes in all), and 128 letters of 4 bytes are 512
MAX_IDENT_BYTES = 507


def _fits(ident: str) -> bool:
    """Whether a whole identifier is short enough to be a term."""
    return len(ident) <= MAX_IDENT and (ident.isascii() or len(ident.encode()) <= MAX_IDENT_BYTES)

# Runs of letters/digits joined by connectors: an identifier, kept whole too.
CONNECTORS = "-_./@:+#~"
_CONNECTOR_SET = frozenset(CONNECTORS)
_LETTER = r"[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
# linear time: starts only where a run of letters starts, runs taken possessively
_IDENT = re.compile(r"(?<!" + _LETTER + ")" + _LETTER + r"++(?:[-_./@:+#~]++" + _LETTER + r"++)+")

# Lucene's English stop set: words too common to tell passages apart.
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such "
    "that the their then there these they this to was will with".split()
)

_stemmer = snowballstemmer.stemmer("english")
# the first words seen, which are the most frequent ones (a corpus's rare words, most
# of its distinct words, are stemmed at each sight, cheaply with PyStemmer). At 2M the
# memo held too much in each indexing process at 1.27M passages; 1x fills 58k
_MEMO_MAX = 150_000


class _Terms(dict):
    """word -> its term ("" for a word not indexed), filled on first sight."""

    def __missing__(self, word: str) -> str:
        if word in STOPWORDS or len(word) > MAX_WORD:
            t = ""
        else:
            t = _stemmer.stemWord(word) if word.isalpha() else word
        if len(self) < _MEMO_MAX:
            self[word] = t
        return t


_memo = _Terms()


def words(text: str) -> list[str]:
    """Case-folded words of ``text``, before stemming and stopping."""
    return _WORD.findall(text.casefold())


def joined(text: str) -> bool:
    """Whether ``text`` holds a connector: an identifier always does, a word never."""
    return not _CONNECTOR_SET.isdisjoint(text)


_MAJOR = re.compile(r"[./:@]+")
MAX_PIECES = 8


def _subs(ident: str) -> list[str]:
    """The identifiers inside one, cut at ``. / : @``: its prefixes and suffixes
    that still hold a connector (``daily_search.experiment_nations`` holds
    ``experiment_nations``; ``docs/api/plan-b.md`` holds ``plan-b.md``, ``api/plan-b.md``
    and ``docs/api``), so a query for the inner one finds it whole."""
    cuts = [m.span() for m in _MAJOR.finditer(ident)]
    if not cuts or len(cuts) >= MAX_PIECES:
        return []
    out = []
    for a, b in cuts:
        for piece in (ident[:a], ident[b:]):
            if piece and joined(piece):
                out.append(piece)
    return out


def idents(text: str, inner: bool = False) -> list[str]:
    """Whole identifiers of ``text``, case-folded (each also has its parts as
    words); with ``inner``, the identifiers inside each too (indexing)."""
    out = []
    for i in _IDENT.findall(text.casefold()):
        if _fits(i):
            out.append(i)
            if inner:
                out.extend(_subs(i))
    return out


# ASCII text (most of what is indexed) is split by byte tables, faster than the
# Unicode regexes above and the same words and identifiers (tests/test_words.py):
# the word table keeps letters and digits, lower-cased, and blanks the rest; the
# token table keeps the connectors too, so a token that is not all letters and
# digits is where identifiers are.
_ASCII_WORD = bytes(c | 0x20 if 65 <= c <= 90 else c if chr(c).isalnum() and c < 128 else 32 for c in range(256))
_ASCII_TOKEN = bytes(_ASCII_WORD[c] if _ASCII_WORD[c] != 32 or chr(c) not in CONNECTORS else c for c in range(256))
_IDENT_ASCII = re.compile(rb"(?<![a-z0-9])[a-z0-9]++(?:[" + re.escape(CONNECTORS).encode() + rb"]++[a-z0-9]++)+")
# punctuation outside ASCII that is neither a letter nor a connector: blanked, so a
# passage whose only other characters are these (an ellipsis, typographic quotes
# and dashes) still takes the tables
_PUNCT = "".join(c for c in "\u2026\u2014\u2013\u2018\u2019\u201c\u201d\u2022\u00a0\u00b7\u2212\u00ab\u00bb"
                 if not _WORD.match(c) and c not in CONNECTORS)


def ascii_text(text: str) -> Optional[str]:
    """``text`` as the ASCII tables split it (the punctuation of ``_PUNCT`` blanked),
    or None when it is not ASCII even so (then the Unicode regexes split it)."""
    if text.isascii():
        return text
    for c in _PUNCT:
        if c in text:
            text = text.replace(c, " ")
    return text if text.isascii() else None


# what :func:`tokens` puts between two texts: a token of its own (NUL, which the tables
# blank everywhere else: a text holding one is not given to :func:`tokens`)
GAP = b"\x00"
_ASCII_TOKEN_GAP = GAP + _ASCII_TOKEN[1:]


def tokens(texts: list[str]) -> list[bytes]:
    """The tokens of ASCII ``texts`` (none holding a NUL), in order, with :data:`GAP`
    between one text's and the next's: runs of letters, digits and connectors,
    lower-cased. Each token's words and identifiers are :func:`token_parts`; all of
    them, text by text, are what :func:`scan` finds in each text."""
    return b" \x00 ".join([t.encode("ascii") for t in texts]).translate(_ASCII_TOKEN_GAP).split()


def token_parts(token: bytes) -> tuple[list[bytes], list[str]]:
    """The words (bytes) and whole identifiers, with the ones inside each, of one token
    of :func:`tokens` (a word never spans two tokens, nor does an identifier)."""
    if token.isalnum():
        return [token], []
    return token.translate(_ASCII_WORD).split(), _whole([i.decode("ascii") for i in _IDENT_ASCII.findall(token)])


def scan(text: str) -> tuple[list, list[str]]:
    """The words of ``text`` (before stemming and stopping) and its whole
    identifiers with the ones inside each, as :func:`term_counts` counts them.
    Words come as bytes when the text is ASCII (a batch maps both kinds to
    terms: :func:`term_of` of the decoded word), else as str."""
    plain = ascii_text(text)
    if plain is None:
        low = text.casefold()
        return _WORD.findall(low), _whole(_IDENT.findall(low))
    raw = plain.encode("ascii")
    tokens = raw.translate(_ASCII_TOKEN).split()
    joined = [t for t in tokens if not t.isalnum()]
    if not joined:
        return tokens, []
    return raw.translate(_ASCII_WORD).split(), _whole([i.decode("ascii") for i in _IDENT_ASCII.findall(b" ".join(joined))])


def _whole(found: list[str]) -> list[str]:
    out = []
    for i in found:
        if _fits(i):
            out.append(i)
            if _MAJOR.search(i):
                out.extend(_subs(i))
    return out


def term_counts(text: str) -> tuple[dict, int]:
    """(term -> frequency, length) of a passage: stopped, stemmed terms, and
    whole identifiers (not counted in the length)."""
    low = text.casefold()
    counts = Counter(map(_memo.__getitem__, _WORD.findall(low)))
    counts.pop("", None)  # stop words and over-long words
    length = sum(counts.values())
    for i in _IDENT.findall(low):
        if _fits(i):
            counts[i] += 1
            if _MAJOR.search(i):
                for sub in _subs(i):
                    counts[sub] += 1
    return counts, length


def term_of(word: str) -> str:
    """The term of one case-folded word ("" when not indexed: a stop word)."""
    return _memo[word]


def query_terms(text: str) -> list[str]:
    """Distinct terms of a query in order of first appearance."""
    seen: dict[str, None] = {}
    for w in words(text):
        t = _memo[w]
        if t:
            seen.setdefault(t, None)
    return list(seen)
