"""Where one memory's things live and what it may do with them: its places (Home, chats,
skills, the notes as a place), its notes, its index's folder, its copy (a :class:`Layout`),
and how they are found for each kind of memory: an agent on this machine's
(:func:`local_layout`), a bound agent's behind its bridges (:func:`bound_layout`), a
team's as a member serves it (:func:`team_layout`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from lnkmem.bridges.local import LocalPlace
from lnkmem.core import atomic
from lnkmem.core.wire import Bound
from lnkmem.bridges.place import Entry, PlaceBase
from lnkmem.memory.config import AgentConfig, open_folder
from lnkmem.memory.notes import LocalNotes
from lnkmem.memory.spec import parse_size

if TYPE_CHECKING:  # (names only) the bridges' places are imported by the layouts that have them:
    # an agent's memory on this machine never imports httpx (~0.1 s of a restart's first answer)
    from lnkmem.bridges.remote import Collection
    from lnkmem.bridges.store_driver import DriverConversations


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
    from lnkmem.bridges.store_driver import DriverConversations, driver_env
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


def bound_layout(cfg: AgentConfig, b: Bound, agent: str, files, storage, has_memory_place: bool,
                 cache: str) -> Layout:
    """A bound agent's own memory (§5.4): its places behind the bridges its Bound line
    names (``files``, ``storage``: their clients, or None) or on this machine, its notes,
    its copy, its index in ``cache``. FolderRefused when an agent folder stands behind a
    link (§2.2 rev. 3). The embedding endpoint is the binding's to give (``embed``)."""
    from lnkmem.bridges.remote import Collection, FilesPlace
    from lnkmem.memory.bridgenotes import BridgeNotes
    from lnkmem.replica.sync import Replica
    places: dict[str, object] = {}
    if files is not None:
        # Home's memory/notes.md is the notes' place when no storage memory place is named
        places["home"] = FilesPlace(files, exclude=("memory/lnkmem",) + (() if has_memory_place else ("memory/notes.md",)),
                                    ignore=True)
    elif cfg.folder:
        places["home"] = LocalPlace(cfg.folder, exclude=[cfg.state] + ([cfg.agent] if cfg.agent else []), ignore=True)
    if storage is not None and "conversations" in b.storage.places:  # wins over a store driver (§3.5)
        places["chats"] = Collection(storage, "conversations")
    elif cfg.store_driver:
        places["chats"] = driver_chats(cfg, os.path.join(cache, "conversations"))
    # an agent's folders never through a link (§2.2 rev. 3)
    if cfg.agent and "chats" not in places:
        places["chats"] = LocalPlace(agent_folder(cfg, "chats"))
    if cfg.agent:
        places["skills"] = LocalPlace(agent_folder(cfg, "skills"))
    # §5.4 rev. 2, where the notes live: the storage memory place; else Home's
    # memory/notes.md through the files bridge; else the agent's local notes (--notes)
    notes = None
    if storage is not None and has_memory_place:
        notes = BridgeNotes(Collection(storage, "memory"), cache)
    elif files is not None:
        notes = BridgeNotes(FilesPlace(files, root="memory"), cache)
    elif cfg.notes_path:  # never through a link below the agent folder (§2.2 rev. 3)
        notes = LocalNotes(cfg.notes_path, cfg.state, cfg.agent)
    if notes is not None:
        places["notes"] = NotesPlace(notes)
    if b.index == "memory" and has_memory_place:
        replica = Replica(Collection(storage, "memory", root="lnkmem"), of=f"agent {b.owner}/{agent}")
    elif files is not None:
        replica = Replica(FilesPlace(files, root="memory/lnkmem"), of=f"agent {b.owner}/{agent}")
    else:  # memory and Home both on the machine: no copy; the local index is the memory's own
        replica = None
    return Layout(places, notes if b.notes else None, parse_size(b.notes) if b.notes else 0,
                  os.path.join(cache, "index"), replica, True, None, os.path.join(cache, "tmp"))


def team_copy(storage, team: str) -> Collection:
    """A team's copy: `lnkmem/` in the team's storage memory place (§5.5)."""
    from lnkmem.bridges.remote import Collection
    return Collection(storage, "memory", team=team, root="lnkmem")


def team_layout(files, copy: Collection, team: str, named: str, writes: bool, embed, cache: str) -> Layout:
    """A team's memory as one member serves it (§5.5): the team folder's `memory/`
    through the files bridge (its copy's folder left out), the team's copy
    (:func:`team_copy`), written back only by a member who ``writes``; no notes."""
    from lnkmem.bridges.remote import FilesPlace
    from lnkmem.replica.sync import Replica
    places = {"home": FilesPlace(files, folder=named, root="memory", exclude=("lnkmem",))}
    return Layout(places, None, 0, os.path.join(cache, "index"), Replica(copy, of=f"team {team}"), writes,
                  embed, os.path.join(cache, "tmp"))
