"""What the protocol layer is handed: a memory, and the way to it while it is made.

A session (``lnkmem.protocol.mcp``) is handed a :class:`MemoryHandle`: calling it
gives the memory (None where none is served: a team member refused the team's
memory), waiting until it is made. What a session must know before that is the
handle's, with its defaults here, those of a memory that exists already: it is
built, its tools are those of the memory, and its config is the memory's.
``serve`` makes its memory on a thread after `initialize` is answered, and its
handle says these things from the agent's config alone.

Before a call, a session reads the memory itself only through
:class:`ServedMemory`, which :class:`lnkmem.memory.memory.Memory` declares.
This module imports nothing heavy: a session answers `tools/list` before the
index (numpy, LMDB) is imported.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional, Protocol

from lnkmem.memory.config import AgentConfig

if TYPE_CHECKING:  # (names only: nothing heavy is imported for them)
    from lnkmem.bridges.place import PlaceBase
    from lnkmem.index.store import Store
    from lnkmem.bridges.embed import Embedder
    from lnkmem.memory.layout import Layout


class ServedMemory(Protocol):
    """What a session reads of a memory before it runs a tool on it."""

    cfg: AgentConfig
    refused: Optional[str]  # why this memory is not served (its folders reached through a link), or None
    opened: threading.Event  # its index open (or given up on): a search waits for it
    ready: threading.Event  # its first full pass done
    fresh: bool  # its index held nothing when opened: a first search waits for the first pass
    error: Optional[str]  # why its index cannot be searched, or None
    store: Optional["Store"]  # its index, once open
    places: dict[str, "PlaceBase"]  # its sources by name (home, chats, skills, notes)
    layout: "Layout"  # where they are, and its copy (``layout.replica``) when bound
    embedder: Optional["Embedder"]  # its model, when Link serves one

    def conversations_idle(self) -> bool:
        """No store driver listing under way (a search waits for one, briefly)."""
        ...


class Searches:
    """The searches a memory's sessions received and have not answered yet: a session holds
    one (``with``) from the moment a search arrives, before its memory is even made, until
    its answer is made. A memory that serves an index as it was left (not a fresh one) looks
    at its sources (the watch placed, the Home listed and compared) only once none waits
    (:meth:`none_waiting`): that look shares the GIL with the search, and placing the watch
    holds it for the whole walk of the tree's folders (watchfiles' Rust), so a first search
    that ran beside it waited for all of it (issue 47)."""

    def __init__(self) -> None:
        self._waiting = 0
        self._cond = threading.Condition()

    def __enter__(self) -> "Searches":
        with self._cond:
            self._waiting += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._waiting -= 1
            self._cond.notify_all()

    def none_waiting(self, timeout: float) -> bool:
        """Wait (at most ``timeout``) until no search waits for its answer; whether none does."""
        with self._cond:
            return self._cond.wait_for(lambda: self._waiting == 0, timeout)


class MemoryHandle:
    """How a session reaches its memory; the defaults are those of a memory made already."""

    serves_notes: Optional[bool] = None  # whether `remember` is served; None: as the memory says
    searches: Optional[Searches] = None  # the searches waiting for it, where its memory looks at them

    def __call__(self) -> Optional[ServedMemory]:
        """The memory, once made (waiting for it); None where none is served."""
        raise NotImplementedError

    def is_built(self) -> bool:
        """Whether the memory is made (calling the handle would not wait)."""
        return True

    def greeted(self) -> None:
        """A session answered its first message (`initialize`, say) or began its first call:
        a memory made after that may be made now."""

    def config(self) -> Optional[AgentConfig]:
        """The memory's config: its budget, and whether a call must name its thread."""
        memory = self()
        return memory.cfg if memory is not None else None


class Made(MemoryHandle):
    """A memory made already (or none: a session refused at its first call)."""

    def __init__(self, memory: Optional[ServedMemory]):
        self.memory = memory

    def __call__(self) -> Optional[ServedMemory]:
        return self.memory
