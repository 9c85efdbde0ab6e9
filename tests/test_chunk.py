"""Chunking a text into passages: line ranges and headings kept, long lines and
blocks cut within the limit."""

from lnkmem.index.text.chunk import LIMIT, chunk_text


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
