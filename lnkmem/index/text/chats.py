"""Conversations (§3.4): `<thread>.jsonl` files of messages, their compact
versions, and `.md`/`.txt` transcripts.

A message becomes one passage (cut further when long), carrying its thread,
role, time and the line range of the message in the file. Its text is the
message as ``role: text``, after the day it was written (in words) and, in
parentheses, the gist of the two messages before it: an answer is found by
the words of the question it answers ("where did you go?" / "Paris"), which
LoCoMo measured worth 0.58 -> 0.75 R@10 by words. The line range stays the
message's own: the context is a reading aid, the hit is the message.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional

import msgspec

from lnkmem.index.text.chunk import LIMIT, chunk_text

_json = msgspec.json.Decoder()


class Message(NamedTuple):
    line: int  # 1-based line of the message in the file
    role: str
    text: str
    at: Optional[str]


class ChatPiece(NamedTuple):
    first: int
    last: int
    text: str
    role: Optional[str]
    at: Optional[str]


def thread_of(name: str) -> str:
    """The thread a chats/ file belongs to: its name less `.compact` and suffix."""
    for suffix in (".compact.jsonl", ".compact.md", ".jsonl", ".md", ".txt"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name.rsplit(".", 1)[0]


def is_conversation(name: str) -> bool:
    return name.endswith((".jsonl", ".md", ".txt")) and not name.startswith(".")


def _content_text(content) -> Optional[str]:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts) if parts else None
    return None


def parse_message(obj) -> Optional[tuple[str, str, Optional[str]]]:
    """(role, text, at) of one line's object, or None when not understood."""
    if not isinstance(obj, dict):
        return None
    # a harness transcript line: {"type", "message": {"role", "content"}, "timestamp"}
    msg = obj.get("message")
    if isinstance(msg, dict) and obj.get("type") in ("user", "assistant", "system", "tool"):
        role = msg.get("role") if isinstance(msg.get("role"), str) else obj["type"]
        text = _content_text(msg.get("content"))
        at = obj.get("timestamp")
    else:  # Link's own shape
        role = obj.get("role")
        text = obj.get("text")
        if text is None:
            text = _content_text(obj.get("content"))
        elif not isinstance(text, str):
            text = None
        at = obj.get("at")
    if not isinstance(role, str) or text is None:
        return None
    return role, text, at if isinstance(at, str) else None


def messages(data: str) -> tuple[list[Message], int]:
    """Messages of a `.jsonl` conversation and the number of lines skipped."""
    out: list[Message] = []
    skipped = 0
    for n, line in enumerate(data.split("\n"), 1):
        if not line.strip():
            continue
        try:
            parsed = parse_message(_json.decode(line))
        except (msgspec.DecodeError, RecursionError):
            parsed = None
        if parsed is None:
            skipped += 1
            continue
        out.append(Message(n, parsed[0], parsed[1], parsed[2]))
    return out, skipped


# What a message's passage carries besides the message (chosen on LoCoMo conversations
# 1-5, words R@10: the message alone 0.582; one message before 0.708, two 0.723; with the
# day in words, one 0.727, two 0.746, three 0.698; the message after added nothing):
CONTEXT = 2  # the messages before it, in parentheses: a reply is found by its question
CONTEXT_CHARS = 300  # of each, at most
DATED = True  # the day of its time in words, "[8 May 2023]"
# A message's own words (its day, role and text) count this many times for each time its
# context's words count once, its length staying its words' (fields weighted as in BM25F,
# one length normalisation): the context is a reading aid, so a word the message says
# outranks the same word in the reply after it. LoCoMo conversations 1-5, words R@10:
# 1 (as before) 0.746; 2 0.787; 3 0.788 (lengths weighted too: 2 0.777, 3 0.776).
OWN_WEIGHT = 2


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December")


def _day(at: Optional[str]) -> str:
    """The day of an RFC 3339 time in words (``8 May 2023``), so that a question
    naming a month or year finds it; "" when it does not read as one."""
    if not at or len(at) < 10:
        return ""
    try:
        y, mo, d = int(at[0:4]), int(at[5:7]), int(at[8:10])
    except ValueError:
        return ""
    if at[4] != "-" or at[7] != "-" or not 1 <= mo <= 12 or not 1 <= d <= 31:
        return ""
    return f"{d} {_MONTHS[mo - 1]} {y}"


def _gist(m: Message) -> str:
    t = " ".join(m.text.split())
    if len(t) > CONTEXT_CHARS:
        cut = t.rfind(" ", 0, CONTEXT_CHARS)
        t = t[: cut if cut > 0 else CONTEXT_CHARS] + " …"
    return f"({m.role}: {t})"


def own_start(text: str) -> int:
    """Where a conversation passage's own part starts: after its context, the
    gist lines ``(role: ...)`` before the message (0 when it has none)."""
    i = 0
    for _ in range(CONTEXT):
        if not text.startswith("(", i):
            break
        j = text.find("\n", i)
        if j <= i or text[j - 1] != ")":
            break
        i = j + 1
    return i


def chunk_conversation(name: str, data: str) -> tuple[list[ChatPiece], int]:
    """Passages of one chats/ file and the count of lines not understood."""
    if not name.endswith(".jsonl"):
        return [ChatPiece(p.first, p.last, p.text, None, None) for p in chunk_text(data)], 0
    msgs, skipped = messages(data)
    msgs = [m for m in msgs if m.text.strip()]
    pieces: list[ChatPiece] = []
    for i, m in enumerate(msgs):
        head = "\n".join(_gist(c) for c in msgs[max(0, i - CONTEXT):i])
        if head:
            head += "\n"
        day = _day(m.at) if DATED else ""
        if day:
            head += f"[{day}] "
        if len(m.text) <= LIMIT:
            pieces.append(ChatPiece(m.line, m.line, f"{head}{m.role}: {m.text}", m.role, m.at))
        else:
            for p in chunk_text(m.text):
                pieces.append(ChatPiece(m.line, m.line, f"{head}{m.role}: {p.text}", m.role, m.at))
    return pieces, skipped


def render(data: str, first: int = 1, last: Optional[int] = None) -> Iterator[tuple[int, str]]:
    """(file line, readable `role: text`) for the messages on lines first..last."""
    for m in messages(data)[0]:
        if m.line < first or (last is not None and m.line > last):
            continue
        when = f" [{m.at}]" if m.at else ""
        yield m.line, f"{m.role}{when}: {m.text}"
