"""Fake bridges for bound-session tests: a files bridge and a storage bridge
over real Unix sockets, with on-disk stores and request logs (fakes/)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from fakes.harness import FakeServer

KEY = "a1" * 32
OTHER_KEY = "b2" * 32


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

    def flags(self) -> list[str]:
        return ["--files-bridge", str(self.files_sock), "--storage-bridge", str(self.storage_sock)]

    def stop(self) -> None:
        self.files.stop()
        self.storage.stop()
