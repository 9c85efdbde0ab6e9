"""What `remember` does to the notes' text (§4.4): a line added or removed (matched as a
person reads it: a leading "- " and spaces aside), its entries counted, and two changes
of one text merged line by line. Pure text: where the text lives is :mod:`notes`'
(a local file) or :mod:`bridgenotes`' (the storage bridge)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from lnkmem.core.errors import ToolError


def norm(line: str) -> str:
    """A line as a person reads it: spaces and a leading "- " aside."""
    s = line.strip()
    if s.startswith("- "):
        s = s[2:].strip()
    elif s == "-":
        s = ""
    return s


def count_entries(text: str) -> int:
    """The notes' entries: the lines that say something, headings aside."""
    return sum(1 for line in text.splitlines() if norm(line) and not line.lstrip().startswith("#"))


@dataclass
class Change:
    """The notes after a change: their text, its size in bytes, its entries."""
    text: str  # the notes after the change
    bytes: int
    entries: int


def apply(current: str, add: Optional[str], remove: Optional[str], limit: int) -> Change:
    """The notes after removing ``remove`` and adding ``add``; ToolError if not possible."""
    if add is None and remove is None:
        raise ToolError("remember needs `add` or `remove` (or both)")
    lines = current.splitlines()
    if remove is not None:
        target = norm(remove)
        if not target:
            raise ToolError("remove: empty text names no line")
        matches = [i for i, line in enumerate(lines) if norm(line) == target]
        if len(matches) != 1:
            if matches:
                cands = [lines[i] for i in matches]
                why = f"remove: {len(matches)} lines equal {target!r}; nothing was changed. They are:"
            else:
                words = target.lower().split()
                cands = [ln for ln in lines if norm(ln) and any(w in ln.lower() for w in words)][:20]
                why = f"remove: no line equals {target!r}; nothing was changed."
                if cands:
                    why += " Lines that look alike:"
            raise ToolError("\n".join([why] + [f"  {c}" for c in cands]))
        del lines[matches[0]]
    if add is not None:
        entry = " ".join(add.split())
        if not entry:
            raise ToolError("add: empty text")
        lines.append(f"- {entry}")
    text = "\n".join(lines) + ("\n" if lines else "")
    size = len(text.encode("utf-8"))
    if size > limit:
        raise ToolError(
            f"the notes would be {size} bytes, over their limit of {limit} bytes; "
            f"remove at least {size - limit} bytes of entries first (remember with `remove`)"
        )
    return Change(text, size, count_entries(text))


def merge(base: str, theirs: str, ours: str) -> str:
    """``ours`` with the lines ``theirs`` added to or removed from ``base``."""
    from collections import Counter
    b, t = Counter(base.splitlines()), Counter(theirs.splitlines())
    added, removed = t - b, b - t
    lines = ours.splitlines()
    out = []
    for line in lines:
        if removed.get(line):
            removed[line] -= 1
            continue
        out.append(line)
    have = Counter(out)
    for line in theirs.splitlines():
        if added.get(line):
            added[line] -= 1
            if have.get(line):
                have[line] -= 1
                continue
            out.append(line)
    return "\n".join(out) + ("\n" if out else "")
