"""The one interface every place implements (after Litestream's ReplicaClient).

A place is a tree of files named by ``/``-separated relative paths, each with
an opaque version that changes whenever its content does. Listing is
recursive and cheap (no content read); reading returns bytes and the version
read; writing is conditional on the version last seen.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Protocol

MAX_FILE = 4 * 1024 * 1024  # §3.2: files over 4 MiB are not indexed


class Entry(NamedTuple):
    path: str  # relative, '/'-separated
    size: int
    version: str
    modified: Optional[str] = None  # RFC 3339, when the place lists it (the files bridge)


class NotFound(Exception):
    """The path names nothing (or nothing this place may serve)."""


class Forbidden(Exception):
    """The path escapes the place, or the place refuses it."""


class Conflict(Exception):
    """A conditional write found another version than the one expected."""


class Place(Protocol):
    def list(self, prefix: str = "") -> list[Entry]:
        """Every readable file below ``prefix``, recursively."""

    def read(self, path: str) -> tuple[bytes, str]:
        """The file's bytes and version (NotFound, Forbidden)."""

    def stat(self, path: str) -> Optional[Entry]:
        """The entry of one file, or None."""


def check_relpath(path: str) -> str:
    """A clean relative path, or Forbidden: no '..', no absolute, no NUL."""
    if not isinstance(path, str) or "\0" in path or path.startswith("/") or "\\" in path:
        raise Forbidden(f"not a relative path: {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise Forbidden(f"path leaves its root: {path!r}")
    return "/".join(parts)
