"""Words: Unicode case folding, word splitting, English stemming.

The same analysis runs on passages at index time and on queries at search
time. Stemming is memoised: a corpus has far fewer distinct words than
words, so each distinct word is stemmed once.
"""

from __future__ import annotations

import re
from collections import Counter

import snowballstemmer

# Runs of letters and digits (Unicode-aware), underscores splitting words;
# CJK ideographs, kana and hangul are taken one character at a time since
# they are written without spaces.
_WORD = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
    r"|[^\W_\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]+"
)
MAX_WORD = 64

# Lucene's English stop set: words too common to tell passages apart.
STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such "
    "that the their then there these they this to was will with".split()
)

_stemmer = snowballstemmer.stemmer("english")
_MEMO_MAX = 2_000_000


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


def term_counts(text: str) -> tuple[dict, int]:
    """(term -> frequency, length) of a passage: stopped, stemmed terms."""
    counts = Counter(map(_memo.__getitem__, _WORD.findall(text.casefold())))
    counts.pop("", None)  # stop words and over-long words
    return counts, sum(counts.values())


def query_terms(text: str) -> list[str]:
    """Distinct terms of a query in order of first appearance."""
    seen: dict[str, None] = {}
    for w in words(text):
        t = _memo[w]
        if t:
            seen.setdefault(t, None)
    return list(seen)
