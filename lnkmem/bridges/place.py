"""The one interface every place implements (after Litestream's ReplicaClient).

A place is a tree of files named by ``/``-separated relative paths, each with
an opaque version that changes whenever its content does. Listing is
recursive and cheap (no content read); reading returns bytes and the version
read; writing is conditional on the version last seen. :class:`Place` is the
whole protocol; :class:`PlaceBase` gives what a place that has no more to say
answers, so that no caller probes a place for what it is.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple, Optional, Protocol

MAX_FILE = 4 * 1024 * 1024  # §3.2: files over 4 MiB are not indexed


class Entry(NamedTuple):
    """One file of a place, as listed. ``modified``: its modification time (RFC 3339,
    UTC) for the date filters, always filled where the place knows it: the files
    bridge lists it, a local file's comes from its version (``local.LocalEntry``);
    "" where the place has none (the storage bridge's collections)."""

    path: str  # relative, '/'-separated
    size: int
    version: str
    modified: str = ""


class NotFound(Exception):
    """The path names nothing (or nothing this place may serve)."""


class Forbidden(Exception):
    """The path escapes the place, or the place refuses it."""


class Conflict(Exception):
    """A conditional write found another version than the one expected."""


class BridgeDown(Exception):
    """The bridge cannot be reached or keeps failing (raised by :mod:`lnkmem.bridges.http`;
    here, below it, so that what only catches it -- the copy's write-back, ``status`` --
    imports no HTTP client)."""


class TooLarge(BridgeDown):
    """An answer over the client's limit (``LNKMEM_MAX_BODY``, 256 MiB): what was asked for is
    no file this engine will hold -- for the copy, a damaged copy, not a bridge that is down.
    ``version``: the file's version from the answer's ETag, when it named one."""

    def __init__(self, why: str, version: str = ""):
        super().__init__(why)
        self.version = version


class Place(Protocol):
    """What the index, the tools and a memory ask of a place."""

    local: bool  # its files are on this machine under a folder (watched, walked, read line by line)
    skipped: int  # files the last listing passed over
    skipped_by: Mapping[str, int]  # ... by why, for people (`lnk-lnkmem index`)
    ignore: Any  # its ignore rules (Home's: `ignore.Ignorer` or `ignore.Listed`), or None

    def list(self, prefix: str = "") -> list[Entry]:
        """Every readable file below ``prefix``, recursively."""

    def stat(self, path: str) -> Optional[Entry]:
        """The entry of one file, or None."""

    def read(self, path: str) -> tuple[bytes, str]:
        """The file's bytes and version (NotFound, Forbidden)."""

    def listdir(self, path: str) -> list[tuple[str, str, int]]:
        """(name, "file" or "folder", size) of a folder's children (NotFound)."""

    def serve(self, memory) -> None:
        """Start what keeps the place while ``memory`` serves (a store driver's loop)."""

    def stop(self) -> None:
        """Stop it."""

    def status(self) -> Optional[str]:
        """For a search: "refreshing", "unavailable: <why>", or None (all is well)."""

    def listing_idle(self) -> bool:
        """No listing of its own under way (a search may wait for one)."""

    def before_change(self, then: Callable[[], None]) -> None:
        """A `changed` control named one of its paths: ``then()`` once it may be looked at."""


class Writable(Place, Protocol):
    """A place the engine writes (the storage bridge's collections: the copy, the notes)."""

    def get(self, path: str, if_none_match: Optional[str] = None) -> tuple[Optional[bytes], str]:
        """(bytes, version), or (None, version) when unchanged since ``if_none_match``."""

    def write(self, path: str, data, expect: Optional[str], length: Optional[int] = None) -> str:
        """Write if the file is still at ``expect`` (None: only if absent); the new version (Conflict)."""

    def delete(self, path: str, expect: Optional[str] = None) -> None:
        """Delete if still at ``expect`` (Conflict)."""


class PlaceBase:
    """What a place with no more to say answers: not local, nothing skipped, no
    ignore rules, no loop of its own."""

    local = False
    skipped = 0
    skipped_by: Mapping[str, int] = MappingProxyType({})
    ignore: Any = None
    moved: Optional[int] = None  # bytes moved through it so far (a bridge's: progress, for waiters)
    forkable = False  # its files may be read by a build's forked worker (system calls beneath a root)

    def open_root(self) -> Optional[int]:
        """A descriptor of its root for a build's read-ahead (:meth:`advise`); None: none."""
        return None

    def advise(self, root: int, path: str) -> bool:
        """Ask the kernel to read ``path`` ahead (beneath ``root``); whether it was asked."""
        return False

    def serve(self, memory) -> None:
        pass

    def stop(self) -> None:
        pass

    def status(self) -> Optional[str]:
        return None

    def listing_idle(self) -> bool:
        return True

    def before_change(self, then: Callable[[], None]) -> None:
        """A `changed` control named a path of this place: ``then()`` once the place is ready
        to be looked at (a place with a listing of its own to refresh first says so later)."""
        then()


def check_relpath(path: str) -> str:
    """A clean relative path, or Forbidden: no '..', no absolute, no NUL."""
    if not isinstance(path, str) or "\0" in path or path.startswith("/") or "\\" in path:
        raise Forbidden(f"not a relative path: {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise Forbidden(f"path leaves its root: {path!r}")
    return "/".join(parts)
