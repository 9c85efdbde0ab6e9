"""Cutting text into passages with line ranges.

A passage is what search ranks and returns: a heading's section, or a few
paragraphs of one, about ``TARGET`` characters long. Headings start a new
passage; blank lines end paragraphs; a paragraph longer than ``LIMIT`` is cut
at line ends, and a line longer than that at ``LIMIT`` characters (keeping
its line number).
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

TARGET = 1200
LIMIT = 2400
SMALL = 300  # a piece this short (a title, a lead line) joins what follows


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
            for k in range(0, len(line), LIMIT):
                yield n, n, line[k : k + LIMIT]
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
    """Passages of a text file (markdown-aware)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    pieces: list[Piece] = []
    heading = ""
    cur: list[str] = []
    cur_first = cur_last = 0
    cur_heading = ""

    def flush() -> None:
        nonlocal cur
        if cur:
            body = "\n".join(lines[cur_first - 1 : cur_last])  # exactly its lines
            if body.strip():
                pieces.append(Piece(cur_first, cur_last, body, cur_heading))
            cur = []

    for first, last, block, is_heading in _paragraphs(lines):
        if is_heading:
            heading = block[0].strip().lstrip("#").strip()
            if cur and all(x.lstrip().startswith("#") or not x.strip() for x in cur):
                # headings in a row (a title, then a section) stay together
                cur.append(block[0])
                cur_last, cur_heading = last, heading
                continue
            flush()
            cur, cur_first, cur_last, cur_heading = [block[0]], first, last, heading
            continue
        size = sum(len(x) + 1 for x in block)
        if size > LIMIT:
            flush()
            for a, b, t in _split_long(first, block):
                pieces.append(Piece(a, b, t, heading))
            continue
        cur_size = sum(len(x) + 1 for x in cur)
        only_headings = all(x.lstrip().startswith("#") or not x.strip() for x in cur)
        too_small = cur_size < SMALL and cur_size + size <= LIMIT
        if cur and cur_size + size > TARGET and not only_headings and not too_small:
            flush()
        if not cur:
            cur_first, cur_heading = first, heading
        else:
            cur.append("")  # keep the blank line between paragraphs
        cur.extend(block)
        cur_last = last
    flush()
    return pieces
