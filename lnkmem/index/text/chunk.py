"""Cutting text into passages with line ranges.

A passage is what search ranks and returns: a heading's section, or a few
paragraphs of one, about ``TARGET`` characters long. Headings start a new
passage; blank lines end paragraphs; a paragraph longer than ``LIMIT`` is cut
at line ends, and a line longer than that into pieces of at most ``LIMIT``
characters (keeping its line number), each cut at a sentence's end where one
lies within ``NEAR`` characters of the limit, else after the last space before
it, never inside a word (:func:`cuts`); only a run of ``LIMIT`` characters
with no space nor punctuation in its second half is cut at the limit.
"""

from __future__ import annotations

import re
from typing import Iterator, NamedTuple

TARGET = 1200
LIMIT = 2400
SMALL = 300  # a piece this short (a title, a lead line) joins what follows
NEAR = 400  # a long line's piece ends at a sentence's end this near its limit, if one lies there

_SENTENCE_END = re.compile(r"[.!?\u3002\uff01\uff1f][\"'\u201d\u2019)\]]*\s+")
_SPACE = re.compile(r"\s+")


def cuts(line: str) -> list[int]:
    """Where a line longer than LIMIT is cut: each piece at most LIMIT characters, ending
    after a sentence's end within NEAR of its limit, else after its last space, else at
    its last boundary of a word (punctuation; an ideograph stands alone), and at the
    limit only where the second half of a piece holds none of those."""
    out = []
    at = 0
    n = len(line)
    while n - at > LIMIT:
        end = at + LIMIT
        cut = 0
        for m in _SENTENCE_END.finditer(line, end - NEAR, end):
            cut = m.end()
        if not cut:
            for m in _SPACE.finditer(line, at + LIMIT // 2, end):
                cut = m.end()
        if not cut:
            k = end
            while k > at + LIMIT // 2 and (line[k - 1].isalnum() and line[k].isalnum()) and \
                    not (_ideograph(line[k - 1]) or _ideograph(line[k])):
                k -= 1
            cut = k if k > at + LIMIT // 2 else end
        out.append(cut)
        at = cut
    return out


def _ideograph(c: str) -> bool:
    return "\u3040" <= c <= "\u30ff" or "\u3400" <= c <= "\u4dbf" or "\u4e00" <= c <= "\u9fff" or \
        "\uac00" <= c <= "\ud7af" or "\uf900" <= c <= "\ufaff"


class Piece(NamedTuple):
    first: int  # 1-based line numbers, inclusive
    last: int
    text: str
    heading: str  # the heading the piece sits under ("" if none)


def _paragraphs(lines: list[str]) -> Iterator[tuple[int, int, list[str], bool]]:
    """(first, last, lines, is_heading) of each block, 1-based."""
    block: list[str] = []
    start = 0
    fenced = False
    for i, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```") or stripped.startswith("~~~"):
            fenced = not fenced
        heading = not fenced and stripped.startswith("#") and stripped.lstrip("#").startswith(" ")
        if heading:
            if block:
                yield start, i - 1, block, False
                block = []
            yield i, i, [line], True
            continue
        if not stripped and not fenced:
            if block:
                yield start, i - 1, block, False
                block = []
            continue
        if not block:
            start = i
        block.append(line)
    if block:
        yield start, start + len(block) - 1, block, False


def _split_long(first: int, lines: list[str]) -> Iterator[tuple[int, int, str]]:
    """Cut a block over LIMIT at line ends, and over-long lines at LIMIT chars."""
    buf: list[str] = []
    size = 0
    start = first
    for n, line in enumerate(lines, first):
        if len(line) > LIMIT:
            if buf:
                yield start, n - 1, "\n".join(buf)
                buf, size = [], 0
            at = 0
            for cut in cuts(line) + [len(line)]:
                yield n, n, line[at:cut]
                at = cut
            start = n + 1
            continue
        if size + len(line) > LIMIT and buf:
            yield start, n - 1, "\n".join(buf)
            buf, size, start = [], 0, n
        if not buf:
            start = n
        buf.append(line)
        size += len(line) + 1
    if buf:
        yield start, start + len(buf) - 1, "\n".join(buf)


def chunk_text(text: str) -> list[Piece]:
    """Passages of a text file (markdown-aware); each is exactly its lines."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    pieces: list[Piece] = []
    heading = ""
    # the piece being gathered: its line range, size, and whether it holds more than headings
    first_line = last_line = 0
    size = 0
    has_body = False
    piece_heading = ""

    def flush() -> None:
        nonlocal size, has_body
        if size:
            body = "\n".join(lines[first_line - 1 : last_line])
            if body.strip():
                pieces.append(Piece(first_line, last_line, body, piece_heading))
        size, has_body = 0, False

    for first, last, block, is_heading in _paragraphs(lines):
        block_size = sum(len(x) + 1 for x in block)
        if is_heading:
            heading = block[0].strip().lstrip("#").strip()
            if size and not has_body:  # headings in a row (a title, then a section) stay together
                last_line, size, piece_heading = last, size + block_size, heading
                continue
            flush()
            first_line, last_line, size, piece_heading = first, last, block_size, heading
            continue
        if block_size > LIMIT:
            flush()
            for a, b, t in _split_long(first, block):
                pieces.append(Piece(a, b, t, heading))
            continue
        too_small = size < SMALL and size + block_size <= LIMIT  # a title joins what follows
        if size and size + block_size > TARGET and has_body and not too_small:
            flush()
        if not size:
            first_line, piece_heading = first, heading
        size += block_size + 1
        has_body = True
        last_line = last
    flush()
    return pieces
