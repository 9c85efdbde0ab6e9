"""Fake bridges for bound-session tests: a files bridge and a storage bridge
over real Unix sockets, with on-disk stores and request logs (fakes/)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import msgspec

from fakes.harness import FakeServer
from tests.helpers import Many, until

KEY = "a1" * 32
OTHER_KEY = "b2" * 32
FAST_WRITEBACK = {"LNKMEM_WRITEBACK_S": "0.3"}  # a copy written back soon after a change


def hits(c, q: str) -> list:
    """The refs a search for ``q`` over connection ``c`` finds (never an error)."""
    r = c.search(q)
    assert not r.get("isError"), r
    return [h["ref"] for h in r["structuredContent"]["hits"]]


class Bridges:
    def __init__(self, base: Path, bindings: Optional[dict] = None, teams: Optional[dict] = None):
        self.base = base
        self.run = base / "run"
        self.run.mkdir(parents=True, exist_ok=True)
        self.files_root = base / "files"
        self.storage_root = base / "storage"
        self.config = base / "bridges.json"
        self.bindings = bindings if bindings is not None else {"a1": {"owner": "o1", "key": KEY}}
        self.teams = teams or {}
        self.write_config()
        self.files_sock = self.run / "files.sock"
        self.storage_sock = self.run / "storage.sock"
        self.files = FakeServer.start("fakes.files_bridge", "--unix", self.files_sock, "--root", self.files_root,
                                      "--config", self.config, "--log", base / "files.log")
        self.storage = FakeServer.start("fakes.storage_bridge", "--unix", self.storage_sock, "--root",
                                        self.storage_root, "--config", self.config, "--log", base / "storage.log")

    def write_config(self) -> None:
        tmp = self.config.with_suffix(".tmp")
        tmp.write_text(json.dumps({"bindings": self.bindings, "teams": self.teams}))
        os.replace(tmp, self.config)

    def home(self, agent: str = "a1") -> Path:
        p = self.files_root / "homes" / agent
        p.mkdir(parents=True, exist_ok=True)
        return p

    def write_home(self, rel: str, text: str, agent: str = "a1") -> Path:
        p = self.home(agent) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def store(self, collection: str, agent: str = "a1") -> Path:
        p = self.storage_root / "stores" / agent / collection
        p.mkdir(parents=True, exist_ok=True)
        return p

    def team_folder(self, team: str) -> Path:
        p = self.files_root / self.teams[team]["folder"]
        p.mkdir(parents=True, exist_ok=True)
        return p

    def team_copy(self, team: str) -> Path:
        return self.storage_root / "teams" / team / "memory" / "lnkmem"

    def bound(self, agent: str = "a1", owner: str = "o1", key: str = KEY, files: bool = True,
              storage: bool = True, notes: Optional[str] = "4 KB", index: Optional[str] = None,
              places=("conversations", "memory")) -> dict:
        b: dict = {"owner": owner, "key": key}
        if files:
            b["files"] = str(self.files_sock)
        if storage:
            b["storage"] = {"socket": str(self.storage_sock), "places": {p: "bucket" for p in places}}
        if notes:
            b["notes"] = notes
        if index:
            b["index"] = index
        return {"agent": agent, "bound": b}

    def bound_and_flushed(self, m: Many, c, *searchable: tuple[str, str], agent: str = "a1",
                          timeout: float = 60) -> None:
        """Bound ``c`` (a connection to ``m``) as ``agent``, wait until each ``(ref, word)`` of
        ``searchable`` is searchable (the ref among the hits for the word), then a `flush`
        control: the copy holds them once it returns."""
        assert c.first(self.bound(agent=agent)) == {"ok": True}
        for ref, word in searchable:
            assert until(lambda: ref in hits(c, word), timeout=timeout), (ref, word)
        with m.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": agent}}) == {"ok": True}

    def changed_and_flushed(self, m: Many, c, rel: str, text: str, word: str, agent: str = "a1",
                            timeout: float = 60) -> None:
        """Write ``text`` to ``rel`` of ``agent``'s Home, tell ``m`` (a `changed` control), wait
        until a search of ``c`` for ``word`` finds it, then a `flush` control."""
        self.write_home(rel, text, agent=agent)
        ref = f"home/{rel}"
        with m.connect() as ctl:
            assert ctl.first({"changed": {"owner": "o1", "agent": agent, "path": ref}}) == {"ok": True}
        assert until(lambda: ref in hits(c, word), timeout=timeout), (ref, word)
        with m.connect() as ctl:
            assert ctl.first({"flush": {"owner": "o1", "agent": agent}}) == {"ok": True}

    def flags(self) -> list[str]:
        return ["--files-bridge", str(self.files_sock), "--storage-bridge", str(self.storage_sock)]

    def serve_many(self, base: Path, name: str = "m", *, agents: Optional[dict] = None,
                   env: Optional[dict] = None, extra=()) -> Many:
        """A `serve-many` of these bridges listening at ``base/name/mem.sock``, its cache in
        ``base/cache-<name>``, the write-back FAST_WRITEBACK's (``env`` adds or overrides),
        serving ``agents`` (none when not given), with ``extra`` flags."""
        return Many(base / name / "mem.sock", agents if agents is not None else {},
                    self.flags() + ["--cache", str(base / f"cache-{name}")] + list(extra),
                    env={**FAST_WRITEBACK, **(env or {})})

    def copy_dir(self, agent: str = "a1") -> Path:
        """Where ``agent``'s index copy is kept in the storage bridge."""
        return self.store("memory", agent) / "lnkmem"

    def copy_files(self, agent: str = "a1", team: Optional[str] = None) -> dict:
        """Every file of ``agent``'s copy (``team``'s, when given): name -> bytes (empty when
        there is none)."""
        d = self.team_copy(team) if team is not None else self.copy_dir(agent)
        out = {}
        for p in d.iterdir() if d.exists() else ():
            try:
                out[p.name] = p.read_bytes()
            except FileNotFoundError:  # deleted by a write-back's sweep since the listing: not there
                pass
        return out

    def copy_refs(self, agent: str = "a1", team: Optional[str] = None) -> set:
        """The refs the copy's file table holds (read straight from the copy's files, every
        file its manifest names present); ``team``: that team's copy."""
        files = self.copy_files(agent, team)
        m = json.loads(files["manifest.json"])
        named = [n for seg in m["segments"] for n in seg] + m["pages"] + m["vectors"] + [m["head"]]
        assert all(name in files for name in named + ([m["dict"]] if m.get("dict") else []))
        return {ref for name in m["pages"] for ref, _ in msgspec.msgpack.decode(zlib.decompress(files[name]))[0]}

    def stop(self) -> None:
        self.files.stop()
        self.storage.stop()


@dataclass(frozen=True)
class Layout:
    """What the fake bridges hold when a test starts. A test module sets ``BRIDGES =
    Layout(...)`` and takes the ``bridges`` fixture (tests/conftest.py), which starts them
    laid out so and stops them after the test."""

    bindings: Optional[dict] = None  # None: agent a1 of owner o1, with KEY
    teams: Optional[dict] = None
    homes: dict = field(default_factory=dict)  # agent -> {path in its Home: text}
    conversations: dict = field(default_factory=dict)  # name -> text, in agent a1's store
    team_files: dict = field(default_factory=dict)  # team -> {path in its folder: text}
    walkable: bool = False  # under a folder other uids may walk (pytest's tmp_path is 0700)

    @contextmanager
    def started(self, tmp_path: Path) -> Iterator[Bridges]:
        base = Path(tempfile.mkdtemp(prefix="lnkmem-sec-")) if self.walkable else tmp_path
        if self.walkable:
            os.chmod(base, 0o755)
        b = Bridges(base / "link", bindings=self.bindings, teams=self.teams)
        try:
            for agent, files in self.homes.items():
                for rel, text in files.items():
                    b.write_home(rel, text, agent=agent)
            for name, text in self.conversations.items():
                (b.store("conversations") / name).write_text(text)
            for team, files in self.team_files.items():
                for rel, text in files.items():
                    p = b.team_folder(team) / rel
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_text(text)
            yield b
        finally:
            b.stop()
            if self.walkable:
                shutil.rmtree(base, ignore_errors=True)
