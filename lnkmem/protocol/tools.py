"""The four tools (§4.1-§4.4): their definitions and what they do.

Each tool takes validated arguments (``lnkmem.core.wire``) and a :class:`Memory`,
and returns ``(text, structured)``: the text a model reads, within the token
budget, and the same facts as JSON. Refusals raise :class:`ToolError`.
"""

from __future__ import annotations

from typing import Optional

from lnkmem.protocol import budget
from lnkmem.bridges.place import MAX_FILE, Forbidden, NotFound, check_relpath
from lnkmem.memory.memory import Memory
from lnkmem.core.errors import ToolError
from lnkmem.index.text import analyze, chats, documents
from lnkmem.index.build.count import split_ref
from lnkmem.memory.threads import notes_refusal
from lnkmem.core.wire import (SOURCES, Hit, ListArgs, ListEntry, ListResult, Progress, ReadArgs, ReadResult,
                         RememberArgs, RememberResult, SearchArgs, SearchResult, to_builtins)

OPEN_WAIT_S = 10.0
MAX_DEPTH = 1000  # hits ranked at most, to find `limit` that are not ignored files


def _wait_open(memory: Memory) -> None:
    memory.opened.wait(OPEN_WAIT_S)
    if memory.error:
        raise ToolError(memory.error)
    if memory.store is None:
        raise ToolError("the index is still opening; try again in a moment")


# --- search -----------------------------------------------------------------------

def _snippet(text: str, query: str, limit: int) -> tuple[str, bool]:
    """The passage cut to ``limit`` bytes, starting near the first match when it lies deep."""
    if budget.nbytes(text) <= limit:
        return text, False
    low = text.casefold()
    first = None
    for w in analyze.words(query):
        if len(w) >= 3:
            i = low.find(w)
            if i >= 0 and (first is None or i < first):
                first = i
    if first is not None and budget.nbytes(text[:first]) > limit // 2:
        start = text.rfind("\n", 0, first) + 1
        text = budget.ELLIPSIS + text[start:]
    return budget.cut(text, limit)


def _hit_header(n: int, h: Hit) -> str:
    where = f"{h.ref} lines {h.lines[0]}-{h.lines[1]}"
    who = ""
    if h.thread is not None:
        bits = [f"thread {h.thread}"] + [b for b in (h.role, h.at) if b]
        who = " (" + ", ".join(bits) + ")"
    return f"[{n}] {where}{who} score {h.score:.3g}\n"


def search(memory: Memory, args: SearchArgs) -> tuple[str, dict]:
    from lnkmem.index.rank.dates import parse_when
    try:  # before anything else: a bad date changes nothing
        after = parse_when(args.after, "after") if args.after is not None else None
        before = parse_when(args.before, "before") if args.before is not None else None
    except ValueError as e:
        raise ToolError(str(e)) from None
    _wait_open(memory)
    memory.check_copy()  # (a team reader's newer version, loaded now, is the one searched)
    store = memory.store  # one index for the ranking and its passages: a newer one may take its place
    sources = args.sources
    if sources is not None:
        sources = [s for s in sources if s in memory.places]
        if not sources:
            sources = ["__none__"]
    hits: list[Hit] = []
    home = memory.places.get("home")
    ignorer = home.ignore if home is not None else None
    memo: dict = {}
    want = args.limit
    ranked = "words"
    while sources != ["__none__"]:
        # files ignored since they were indexed (out of the index at the next pass) are
        # never shown (§3.2); the ranking is asked again, deeper, until `limit` hits
        # remain or it has no more to give
        pairs, ranked = memory.rank(args.query, want, sources, args.under or None, after, before, store)
        hits, dropped = [], 0
        for (pid, score), p in zip(pairs, store.passages_of(p for p, _ in pairs)):
            if p is None:
                continue
            if ignorer is not None and p.ref.startswith("home/") and ignorer.ignored(p.ref[5:], False, memo):
                dropped += 1
                continue
            hits.append(Hit(ref=p.ref, source=p.ref.split("/", 1)[0], lines=(p.first, p.last),
                            score=round(score, 4), text=p.text, thread=p.thread, role=p.role, at=p.at))
        if not dropped or len(hits) >= args.limit or len(pairs) < want or want >= MAX_DEPTH:
            hits = hits[:args.limit]
            break
        want = min(MAX_DEPTH, max(want * 4, args.limit + 4 * dropped))
    progress = memory.indexing
    status = f"; indexing {progress[0]}/{progress[1]}" if progress else ""
    embedding = memory.embedding
    if embedding is not None:  # a half-embedded index says so (§4.1 rev. 2)
        status += f"; {embedding[0]}/{embedding[1]} passages embedded so far"
    conversations = memory.conversations  # a store driver's (§3.5): refreshing, or unavailable and why
    if conversations is not None:
        status += f"; conversations {conversations}"
    shown = args.query if len(args.query) <= 120 else args.query[:120] + "…"  # a pasted page is not echoed whole
    intro = f"{len(hits)} hit{'s' if len(hits) != 1 else ''} for {shown!r} (ranked by {ranked.replace('+', ' and ')}{status})\n"
    room = memory.cfg.budget
    truncated = False
    intro, cut_intro = budget.cut(intro, room)
    truncated |= cut_intro
    room -= budget.nbytes(intro)
    headers = [_hit_header(i + 1, h) for i, h in enumerate(hits)]
    while hits and sum(budget.nbytes(x) + 2 for x in headers) > room:
        hits.pop()
        headers.pop()
        truncated = True
    room -= sum(budget.nbytes(x) + 2 for x in headers)
    alloc = budget.share([budget.nbytes(h.text) for h in hits], room)
    parts = [intro]
    for h, head, give in zip(hits, headers, alloc):
        h.text, was_cut = _snippet(h.text, args.query, give)
        truncated |= was_cut
        parts.append("\n" + head + h.text + "\n")
    result = SearchResult(hits=hits, ranked=ranked, truncated=truncated,
                          indexing=Progress(*progress) if progress else None,
                          embedding=Progress(*embedding) if embedding else None,
                          conversations=conversations)
    return "".join(parts), to_builtins(result)


# --- read -----------------------------------------------------------------------

def _place_for(memory: Memory, ref: str):
    source, path = split_ref(ref)
    if source not in SOURCES:
        raise ToolError(f"ref: {ref!r} names no source (refs start with home/, chats/, skills/ or are notes)")
    place = memory.places.get(source)
    if place is None:
        raise ToolError(f"ref: this memory has no {source}")
    if source == "notes":
        if path:
            raise ToolError(f"ref: {ref!r} names nothing (the notes are the ref `notes`)")
        return source, path, place
    try:
        path = check_relpath(path)
    except Forbidden as e:
        raise ToolError(f"ref: {e}") from None
    return source, path, place


def read(memory: Memory, args: ReadArgs) -> tuple[str, dict]:
    if args.lines and args.lines[0] > args.lines[1]:  # before reading anything
        raise ToolError(f"lines: [{args.lines[0]}, {args.lines[1]}] runs backwards")
    source, path, place = _place_for(memory, args.ref)
    if source != "notes" and not path:
        raise ToolError(f"ref: {args.ref!r} is a folder; use list")
    name = path.rsplit("/", 1)[-1]
    big = None
    try:
        if (source != "notes" and place.local and not documents.is_document(path)
                and not (source == "chats" and name.endswith(".jsonl"))):
            e = place.stat(path)
            if e is not None and e.size > MAX_FILE:  # not indexed, but served: streamed, line by line
                big = place.read_lines(path, *(args.lines or (1, None)), memory.cfg.budget)
        if big is None:
            data, _ = place.read(path)
    except Forbidden as e:
        raise ToolError(f"ref: {e}") from None
    except (NotFound, IsADirectoryError, OSError):
        raise ToolError(f"ref: {args.ref!r} names no file") from None
    if big is not None:
        raw, total, _, binary = big
        if binary:
            raise ToolError(f"ref: {args.ref!r} is not a text file")
        first, last = args.lines or (1, max(total, 1))
        if total and first > total:
            raise ToolError(f"lines: the file has {total} lines, fewer than {first}")
        last = min(last, total) if total else first
        body = raw.decode("utf-8", "replace")
        if body.endswith("\n"):
            body = body[:-1]
        shown = (first, last)
    elif source == "chats" and name.endswith(".jsonl"):
        text = data.decode("utf-8", "replace")
        total = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        first, last = args.lines or (1, max(total, 1))
        out = [f"{line}| {msg}" for line, msg in chats.render(text, first, last)]
        body = "\n".join(out)
        shown = (first, min(last, max(total, 1)))
    else:
        if documents.is_document(path) and source == "home":
            converted = documents.convert(data, name, memory.tmpdir, None)
            if converted is None:
                raise ToolError(f"ref: {args.ref!r} is a document that cannot be converted to text here")
            text = converted
        elif b"\0" in data[:8192]:
            raise ToolError(f"ref: {args.ref!r} is not a text file")
        else:
            text = data.decode("utf-8", "replace")
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        total = len(lines)
        first, last = args.lines or (1, max(total, 1))
        if total and first > total:
            raise ToolError(f"lines: the file has {total} lines, fewer than {first}")
        last = min(last, total) if total else first
        body_lines = lines[first - 1:last]
        body = "\n".join(body_lines)
        shown = (first, last)
    room = memory.cfg.budget
    truncated = False
    if budget.nbytes(body) > room:
        # cut at a line end where possible, and say which lines are shown
        keep, size = [], 0
        for ln in body.split("\n"):
            b = budget.nbytes(ln) + 1
            if size + b > room:
                break
            keep.append(ln)
            size += b
        if keep and source != "chats":
            body = "\n".join(keep)
            shown = (shown[0], shown[0] + len(keep) - 1)
        else:
            body, _ = budget.cut(body, room)
        truncated = True
    result = ReadResult(ref=args.ref, lines=shown, total_lines=total, text=body, truncated=truncated)
    return body, to_builtins(result)


# --- list -----------------------------------------------------------------------

def list_(memory: Memory, args: ListArgs) -> tuple[str, dict]:
    ref = (args.ref or "").strip("/")
    entries: list[ListEntry] = []
    if not ref:
        for source in SOURCES:
            place = memory.places.get(source)
            if place is None:
                continue
            if source == "notes":
                e = place.stat()
                entries.append(ListEntry("notes", "file", e.size if e else 0))
            else:
                entries.append(ListEntry(source, "folder"))
    else:
        source, path, place = _place_for(memory, ref)
        if source == "notes":
            raise ToolError("ref: `notes` is a file; use read")
        try:
            items = place.listdir(path)
        except Forbidden as e:
            raise ToolError(f"ref: {e}") from None
        except NotFound:
            raise ToolError(f"ref: {args.ref!r} names no folder") from None
        base = f"{source}/{path}" if path else source
        for name, kind, size in items:
            entries.append(ListEntry(f"{base}/{name}", kind, size if kind == "file" else None))
    lines = []
    room = memory.cfg.budget
    used = 0
    truncated = False
    kept = []
    for e in entries:
        line = f"{e.ref}/" if e.kind == "folder" else f"{e.ref} ({e.size} bytes)"
        if used + budget.nbytes(line) + 1 > room:
            truncated = True
            break
        used += budget.nbytes(line) + 1
        lines.append(line)
        kept.append(e)
    result = ListResult(ref=ref, entries=kept, truncated=truncated)
    text = "\n".join(lines) if lines else f"{ref or 'memory'} is empty"
    return budget.cut(text, room)[0], to_builtins(result)


# --- remember ---------------------------------------------------------------------

def remember(memory: Memory, args: RememberArgs, thread: Optional[str], wait: bool = True) -> tuple[str, dict]:
    if memory.notes is None:
        raise ToolError("remember is not served: this memory keeps no notes")
    why = notes_refusal(thread, memory.cfg.owner, memory.cfg.from_required, memory.cfg.judge_threads)
    if why:
        raise ToolError(f"not remembered: {why}; the notes are unchanged")
    change = memory.notes.change(args.add, args.remove, memory.notes_limit)
    if wait:  # a session waits on its loop instead, holding no thread (§5.1)
        memory.changed("notes", wait=True, timeout=10)
    what = []
    if args.remove is not None:
        what.append("removed 1 line")
    if args.add is not None:
        what.append("added 1 line")
    text = f"{' and '.join(what)}; the notes hold {change.entries} entries, {change.bytes} of {memory.notes_limit} bytes"
    return text, to_builtins(RememberResult(change.bytes, memory.notes_limit, change.entries))


def call(memory: Memory, name: str, args, thread: Optional[str], wait: bool = True) -> tuple[str, dict]:
    """One tool call; ``wait=False``: `remember` returns before its change is
    indexed (the caller waits for that itself)."""
    if memory.refused:  # its folders reached through a link: nothing is read or written
        raise ToolError(f"this agent's memory is not served: {memory.refused}")
    if name == "search":
        return search(memory, args)
    if name == "read":
        return read(memory, args)
    if name == "list":
        return list_(memory, args)
    if name == "remember":
        return remember(memory, args, thread, wait)
    raise ToolError(f"no tool named {name!r}")
