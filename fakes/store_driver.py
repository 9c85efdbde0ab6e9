"""A fake store driver (PROTOCOL.md §3.5), run as ``fakes/bin/lnk-store-driver``.

    lnk-store-driver conversations               one JSON line a conversation:
                                                 {"thread", "version", "compact"?}
    lnk-store-driver conversation THREAD [--compact]
                                                 the conversation (or its compact
                                                 one) as JSONL, Link's message shape

It keeps conversations in a file of its own, ``$FAKE_DRIVER_STORE`` (JSON,
read on every call; ``{agent}`` in the path is replaced by ``$LNK_AGENT``):

    {"<thread>": {"version": "1", "messages": [{"role", "text", "at"}, ...],
                  "compact": {"version": "c1", "messages": [...]}}}

Bad usage, or an unknown thread: a message on stderr, exit 2.

For tests, from the environment:
``FAKE_DRIVER_LOG=FILE`` appends ``{"argv", "names", "blas", "stdin", "pid"}`` a call (the
agent's names it was given; its ``OPENBLAS_NUM_THREADS``, or null; whether its standard
input held anything);
``FAKE_DRIVER_FAULT=FILE`` names a control file, JSON read on every call
(missing or empty: no fault), ``{"mode": M, "on": "conversations" |
"conversation" (default: every call), "seconds": S}``, where M is
- ``slow``: sleep S seconds (default 3600) first, past any limit;
- ``fail``: a line on stderr, then ``the store is locked``, exit 1;
- ``garbage``: lines that are not the answer's shape (not JSON, not an
  object, a thread that is not a string) among the good ones;
- ``bad-thread``: the listing also names threads that are not IDs
  (``../../escape``, ``a/b``, ``-lead``, ``""``; their conversations
  would write a marker file if they were ever asked for);
- ``huge``: 65 MiB of lines (past the engine's 64 MiB a call);
- ``churn``: every listing gives every conversation a new version.
"""

from __future__ import annotations

import json
import os
import sys
import time

NAMES = ("LNK_AGENT", "LNK_AGENT_ID", "LNK_OWNER")
HUGE = 65 * 1024 * 1024
BAD_THREADS = ("../../escape", "a/b", "-lead", "", "/abs", "t\n1")


def _fault() -> dict:
    path = os.environ.get("FAKE_DRIVER_FAULT")
    if not path:
        return {}
    try:
        with open(path) as f:
            text = f.read().strip()
        return json.loads(text) if text else {}
    except (OSError, ValueError):
        return {}


def _log(argv: list[str]) -> None:
    path = os.environ.get("FAKE_DRIVER_LOG")
    if not path:
        return
    try:
        stdin = bool(sys.stdin.buffer.read(1)) if sys.stdin is not None else False
    except (OSError, ValueError):
        stdin = False
    entry = {"argv": argv, "names": {k: os.environ[k] for k in NAMES if k in os.environ},
             "blas": os.environ.get("OPENBLAS_NUM_THREADS"), "stdin": stdin,
             "time": time.time(), "pid": os.getpid()}
    try:
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")
    except OSError:
        pass


def _store() -> dict:
    path = os.environ.get("FAKE_DRIVER_STORE", "")
    path = path.replace("{agent}", os.environ.get("LNK_AGENT", ""))
    if not path:
        raise SystemExit("lnk-store-driver: FAKE_DRIVER_STORE is not set")
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def _out(lines: list[str]) -> None:
    sys.stdout.write("".join(line + "\n" for line in lines))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _log(argv)
    fault = _fault()
    mode = fault.get("mode")
    on = fault.get("on")
    if mode and on and (not argv or argv[0] != on):
        mode = None
    if mode == "slow":
        time.sleep(float(fault.get("seconds", 3600)))
    elif mode == "fail":
        sys.stderr.write("lnk-store-driver: opening the store\nthe store is locked\n")
        return 1
    elif mode == "huge":
        line = b'{"thread": "t1", "version": "1"}\n'
        sys.stdout.buffer.write(line * (HUGE // len(line) + 1))
        return 0
    if not argv or argv[0] not in ("conversations", "conversation"):
        sys.stderr.write("usage: lnk-store-driver conversations | conversation THREAD [--compact]\n")
        return 2
    store = _store()
    if argv[0] == "conversations":
        if len(argv) != 1:
            sys.stderr.write("usage: lnk-store-driver conversations\n")
            return 2
        lines = []
        stamp = str(time.time_ns())
        for thread, conv in store.items():
            item = {"thread": thread, "version": stamp if mode == "churn" else str(conv.get("version", "1"))}
            if conv.get("compact") is not None:
                item["compact"] = stamp if mode == "churn" else str(conv["compact"].get("version", "1"))
            lines.append(json.dumps(item))
        if mode == "garbage":
            lines[1:1] = ["this is not JSON", "[1, 2, 3]", json.dumps({"thread": 5, "version": "1"}),
                          json.dumps({"thread": "t9"})]
        if mode == "bad-thread":
            lines += [json.dumps({"thread": t, "version": "1"}) for t in BAD_THREADS]
        _out(lines)
        return 0
    rest = argv[1:]
    compact = "--compact" in rest
    rest = [a for a in rest if a != "--compact"]
    if len(rest) != 1:
        sys.stderr.write("usage: lnk-store-driver conversation THREAD [--compact]\n")
        return 2
    thread = rest[0]
    if thread in BAD_THREADS:  # the engine must never ask: leave a mark where a test can see it
        mark = os.environ.get("FAKE_DRIVER_LOG")
        if mark:
            with open(mark + ".asked-bad", "a") as f:
                f.write(json.dumps(thread) + "\n")
    conv = store.get(thread)
    if conv is None or (compact and conv.get("compact") is None):
        sys.stderr.write(f"lnk-store-driver: no conversation {thread!r}\n")
        return 2
    messages = (conv["compact"] if compact else conv).get("messages", [])
    lines = [json.dumps(m) for m in messages]
    if mode == "garbage":
        lines.insert(1, "\x00\x01 not a message {")
    _out(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
