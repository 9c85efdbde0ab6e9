"""Where one memory's things live and what it may do with them: its places (Home, chats,
skills, the notes as a place), its notes, its index's folder, its copy (a :class:`Layout`),
and how an agent on this machine's are found (:func:`local_layout`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Optional

from lnkmem.bridges.local import LocalPlace
from lnkmem.core import atomic
from lnkmem.bridges.place import Entry, PlaceBase
from lnkmem.bridges.store_driver import DriverConversations, driver_env
from lnkmem.memory.config import AgentConfig, open_folder
from lnkmem.memory.notes import LocalNotes


class NotesPlace(PlaceBase):
    """The notes as a place holding one file, ref `notes` (wherever they live)."""

    def __init__(self, notes):
        self.notes = notes
        self.local = notes.local

    def list(self, prefix: str = "") -> list[Entry]:
        e = self.notes.entry()
        return [type(e)("", e.size, e.version)] if e else []  # (a local file's entry stays one)

    def read(self, path: str = "") -> tuple[bytes, str]:
        return self.notes.read_bytes()

    def stat(self, path: str = "") -> Optional[Entry]:
        e = self.list()
        return e[0] if e else None


@dataclass
class Layout:
    """Where one memory's things live and what it may do with them."""

    places: dict[str, object]
    notes: object = None  # LocalNotes / BridgeNotes, or None: no `remember`
    notes_limit: int = 0
    index_path: str = ""
    replica: object = None  # a sync.Replica: the cache is of this copy
    writes: bool = True  # writes the copy back (False: a team reader)
    embed: Optional[tuple[str, str, Callable[[], dict]]] = None  # (base url, model, headers)
    tmpdir: str = ""
    state_fd: Optional[int] = None  # the index's folder's parent, opened once never through a link
    agent: Optional[str] = None


def agent_folder(cfg: AgentConfig, name: str) -> str:
    """``<agent>/<name>``, refused (FolderRefused) when a link stands in its way: a
    place resolves its root once, so a link there at the start would serve another
    agent's folder (a link swapped in later is caught by the place's descriptor check)."""
    path = os.path.join(cfg.agent, name)
    fd = open_folder(path, cfg.agent, create=False)
    if fd is not None:
        os.close(fd)
    return path


def driver_chats(cfg: AgentConfig, folder: str) -> DriverConversations:
    """The `chats` place of an agent served with `--store-driver` (§3.5): its
    copies in ``folder`` (`<state>/conversations`, beside its index), the driver
    given the agent's names (its environment, the Bound line's owner)."""
    return DriverConversations(cfg.store_driver, folder, driver_env(cfg.env, cfg.owner))


def local_layout(cfg: AgentConfig, create: bool = True) -> Layout:
    """An agent on this machine: Home, chats, skills and notes in local folders.

    The state and the notes' folder are opened here, once, never through a link
    below the agent folder (FolderRefused; §2.2 rev. 3). ``create`` false (a
    person's `status`): nothing is made."""
    state_fd = open_folder(cfg.state, cfg.agent, create=create)
    try:
        notes = LocalNotes(cfg.notes_path, cfg.state, cfg.agent, create=create, state_fd=state_fd) if cfg.notes_path else None
        if cfg.agent:  # chats and skills never through a link either (FolderRefused)
            chats_dir, skills_dir = agent_folder(cfg, "chats"), agent_folder(cfg, "skills")
    except BaseException:
        if state_fd is not None:
            os.close(state_fd)
        raise
    # every name below <state> from here on is reached from the folder opened above, never
    # through what its name (or a folder above it) leads to later (atomic.pinned)
    state = atomic.pinned(state_fd, cfg.state) if state_fd is not None else cfg.state
    places: dict[str, object] = {}
    exclude = [cfg.state] + ([cfg.agent] if cfg.agent else [])
    places["home"] = LocalPlace(cfg.folder, exclude=exclude, ignore=True)
    if cfg.store_driver:  # §3.5: its conversations from the driver alone, through the engine's own copy
        places["chats"] = driver_chats(cfg, os.path.join(state, "conversations"))
    elif cfg.agent:
        places["chats"] = LocalPlace(chats_dir)
    if cfg.agent:
        places["skills"] = LocalPlace(skills_dir)
    if notes:
        places["notes"] = NotesPlace(notes)
    embed = (cfg.model_url, cfg.spec.model or "default", dict) if cfg.model_url else None
    return Layout(places, notes, cfg.notes_limit, os.path.join(state, "index"), embed=embed,
                  tmpdir=os.path.join(state, "tmp"), state_fd=state_fd, agent=cfg.agent)
