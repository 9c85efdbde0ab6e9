"""`lnk-lnkmem notes-history`: the notes' kept versions listed, printed and restored
(people's command; `status` lists them through :func:`listing`). The versions
themselves are :mod:`lnkmem.memory.noteshistory`'s; a restore is a change of the notes
like `remember`'s (:meth:`lnkmem.memory.notes.LocalNotes.restore`)."""

from __future__ import annotations

import os

from lnkmem.memory.notesrules import count_entries
from lnkmem.memory.noteshistory import History, HistoryRefused, rfc3339


def listing(state: str, texts: bool = False) -> list[dict]:
    """The kept versions as plain data (newest first, numbered from 1), for `status`;
    with ``texts``, each one's text too."""
    try:
        h = History.at(state)
    except (HistoryRefused, OSError):  # `notes-history` itself says what is wrong
        return []
    if h is None:
        return []
    try:
        out = []
        for n, v in enumerate(h.versions(), 1):
            try:
                text = h.text(v).decode("utf-8", "replace")
            except OSError:
                continue
            out.append({"n": n, "id": v.id, "at": rfc3339(v.at), "bytes": v.bytes, "entries": count_entries(text),
                        "why": v.reason})
            if texts:
                out[-1]["text"] = text
        return out
    finally:
        h.close()



def notes_path(args) -> str:
    """The notes file a restore writes: --notes, else $LNK_MEMORY_NOTES, else <agent>/memory/notes.md."""
    from lnkmem.core.errors import UsageError
    path = args.notes or os.environ.get("LNK_MEMORY_NOTES") or (
        os.path.join(os.path.abspath(args.agent), "memory", "notes.md") if args.agent else None)
    if not path:
        raise UsageError("notes-history: which notes? give --notes PATH or --agent DIR")
    return os.path.abspath(path)


def cmd_notes_history(args) -> int:
    import json
    import sys
    from lnkmem.core.errors import UsageError
    state = os.path.abspath(args.state)
    if args.show is not None and args.restore is not None:
        raise UsageError("notes-history: --show or --restore, not both")
    which = args.show if args.show is not None else args.restore
    try:  # a wrong shape at the history folder: one line, exit 2 (never followed)
        opened = History.at(state)
    except HistoryRefused as e:
        raise UsageError(f"notes-history: {e}") from None
    except OSError as e:
        raise UsageError(f"notes-history: {state}/notes-history could not be read: {e.strerror or e}") from None
    if which is None:
        if opened is not None:
            opened.close()
        versions = listing(state, texts=args.json and args.texts)
        if args.json:
            sys.stdout.write(json.dumps({"state": state, "versions": versions}, ensure_ascii=False) + "\n")
        elif not versions:
            sys.stdout.write(f"no earlier versions of the notes are kept in {state}\n")
        else:
            for v in versions:
                sys.stdout.write(f"{v['n']:>3}  {v['at']}  {v['bytes']:>8,} bytes  {v['entries']:>4} entries  {v['why']}\n")
            sys.stdout.write(f"print one: lnk-lnkmem notes-history {state} --show N; put it back: --restore N\n")
        return 0
    h = opened
    try:
        v = h.find(which) if h is not None else None
    except KeyError:
        v = None
    if v is None:
        n = len(h.versions()) if h is not None else 0
        if h is not None:
            h.close()
        raise UsageError(f"notes-history: no version {which!r} in {state} ({n} kept; 1 is the newest)")
    try:
        data = h.text(v)
    finally:
        h.close()
    if args.show is not None:
        sys.stdout.buffer.write(data)
        return 0
    from lnkmem.memory.notes import LocalNotes
    from lnkmem.core.errors import ToolError
    path = notes_path(args)
    notes = LocalNotes(path, state, os.path.abspath(args.agent) if args.agent else None)  # FolderRefused: exit 2
    try:
        change = notes.restore(data)
    except (ToolError, OSError) as e:
        raise UsageError(f"notes-history: the notes could not be restored: {e}") from None
    sys.stdout.write(f"restored version {which} ({v.id}, {v.reason}) into {path}: {change.entries} entries, "
                     f"{change.bytes} bytes; the text it replaced is kept (version 1 now)\n")
    return 0
