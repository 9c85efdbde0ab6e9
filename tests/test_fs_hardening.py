"""The filesystem as hostile input (issue 11; §3.2, §4.2, §7.1 rev. 2).

Names that are not UTF-8, files swapped for links while they are read, a
damaged `data.mdb`, Home files over 4 MiB, temp files left by kills, and
passage ids that must follow live data rather than edits. Every test drives
the real `lnk-lnkmem` over its real pipes or socket.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import Home, Many, Server, agent_entry, refs, until

OUTSIDE = "OUTSIDETEXT-91c2"


def _bad(p: Path, name: bytes) -> bytes:
    """The byte path of ``name`` under ``p`` (a name Python cannot spell in UTF-8)."""
    return os.fsencode(p) + b"/" + name


# --- 1. names that are not UTF-8 ---------------------------------------------------


def _odd_names(home: Home) -> None:
    for i in range(20):
        home.write(f"good{i:02}.md", f"The quokka number {i} smiles.\n")
    for name in (b"bad\xff.md", b"caf\xe9.md", b"\xc3\x28.txt"):
        with open(_bad(home.folder, name), "wb") as f:
            f.write(b"The quokka hides in a bad name.\n")
    os.mkdir(_bad(home.folder, b"dir\xfe"))
    with open(_bad(home.folder, b"dir\xfe/inner.md"), "wb") as f:
        f.write(b"The quokka hides in a bad folder.\n")
    os.mkdir(_bad(home.folder, b"sub"))
    with open(_bad(home.folder, b"sub/ok.md"), "wb") as f:
        f.write(b"The quokka in sub is fine.\n")
    with open(_bad(home.folder, b"sub/x\x80y.md"), "wb") as f:
        f.write(b"The quokka x y.\n")
    with open(_bad(home.agent / "chats", b"t\xff.jsonl"), "wb") as f:
        f.write(b'{"role": "user", "text": "quokka in a chat with a bad name"}\n')
    home.chat("good", [{"role": "user", "text": "the quokka chat is fine"}])


def test_names_not_utf8_are_skipped_and_counted_never_fatal(home):
    _odd_names(home)
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed(timeout=30)
        got = set(refs(s.search("quokka", limit=50)))
        want = {f"home/good{i:02}.md" for i in range(20)} | {"home/sub/ok.md", "chats/good.jsonl"}
        assert got == want
        # list of a folder holding odd names answers, without them
        listed = s.call("list", {"ref": "home"})
        assert not listed.get("isError"), listed
        names = {e["ref"] for e in listed["structuredContent"]["entries"]}
        assert {"home/good00.md", "home/sub"} <= names and len(names) == 21
        sub = s.call("list", {"ref": "home/sub"})
        assert [e["ref"] for e in sub["structuredContent"]["entries"]] == ["home/sub/ok.md"]
        chats_ = s.call("list", {"ref": "chats"})
        assert [e["ref"] for e in chats_["structuredContent"]["entries"]] == ["chats/good.jsonl"]
        # the watcher goes on: a new odd name, then a good file, both while serving
        with open(_bad(home.folder, b"later\xff.md"), "wb") as f:
            f.write(b"The wombat hides.\n")
        os.mkdir(_bad(home.folder, b"new\xfe"))
        home.write("later.md", "The wombat is found.\n")
        assert until(lambda: refs(s.search("wombat")) == ["home/later.md"], timeout=10)
        assert s.proc.poll() is None
