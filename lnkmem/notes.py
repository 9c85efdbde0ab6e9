"""The agent's notes file and `remember` (§2.2, §4.4).

A change is read-change-write under a lock, re-reading the file first and
checking just before the replace that nobody changed it meanwhile, then an
atomic rename of a temporary file written in ``<state>`` (never beside the
notes). Nothing of the notes is ever lost: a refused change changes nothing.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

from lnkmem.errors import ToolError


def _norm(line: str) -> str:
    s = line.strip()
    if s.startswith("- "):
        s = s[2:].strip()
    elif s == "-":
        s = ""
    return s


def count_entries(text: str) -> int:
    return sum(1 for line in text.splitlines() if _norm(line) and not line.lstrip().startswith("#"))


@dataclass
class Change:
    text: str  # the notes after the change
    bytes: int
    entries: int


def apply(current: str, add: Optional[str], remove: Optional[str], limit: int) -> Change:
    """The notes after removing ``remove`` and adding ``add``; ToolError if not possible."""
    if add is None and remove is None:
        raise ToolError("remember needs `add` or `remove` (or both)")
    lines = current.splitlines()
    if remove is not None:
        target = _norm(remove)
        if not target:
            raise ToolError("remove: empty text names no line")
        matches = [i for i, line in enumerate(lines) if _norm(line) == target]
        if len(matches) != 1:
            if matches:
                cands = [lines[i] for i in matches]
                why = f"remove: {len(matches)} lines equal {target!r}; nothing was changed. They are:"
            else:
                words = target.lower().split()
                cands = [ln for ln in lines if _norm(ln) and any(w in ln.lower() for w in words)][:20]
                why = f"remove: no line equals {target!r}; nothing was changed."
                if cands:
                    why += " Lines that look alike:"
            raise ToolError("\n".join([why] + [f"  {c}" for c in cands]))
        del lines[matches[0]]
    if add is not None:
        entry = " ".join(add.split())
        if not entry:
            raise ToolError("add: empty text")
        lines.append(f"- {entry}")
    text = "\n".join(lines) + ("\n" if lines else "")
    size = len(text.encode("utf-8"))
    if size > limit:
        raise ToolError(
            f"the notes would be {size} bytes, over their limit of {limit} bytes; "
            f"remove at least {size - limit} bytes of entries first (remember with `remove`)"
        )
    return Change(text, size, count_entries(text))


class LocalNotes:
    """The notes file on this machine."""

    def __init__(self, path: str, state: str):
        self.path = path
        self.state = state

    @contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(self.state, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.state, "notes.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> tuple[str, Optional[tuple]]:
        try:
            with open(self.path, "rb") as f:
                s = os.fstat(f.fileno())
                return f.read().decode("utf-8", "replace"), (s.st_ino, s.st_mtime_ns, s.st_size)
        except FileNotFoundError:
            return "", None

    def _mode(self) -> int:
        try:
            return os.stat(self.path).st_mode & 0o777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            return 0o666 & ~umask

    def read(self) -> str:
        return self._read()[0]

    def entry(self):
        from lnkmem.bridges.local import version_of
        from lnkmem.bridges.place import Entry
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return Entry("", st.st_size, version_of(st))

    def read_bytes(self) -> tuple[bytes, str]:
        from lnkmem.bridges.local import version_of
        with open(self.path, "rb") as f:
            return f.read(), version_of(os.fstat(f.fileno()))

    def change(self, add: Optional[str], remove: Optional[str], limit: int) -> Change:
        try:
            return self._change(add, remove, limit)
        except OSError as e:  # a full disk; <state> on another filesystem than the notes (EXDEV)
            raise ToolError(f"the notes could not be written: {e.strerror or e}; nothing was changed") from None

    def _change(self, add: Optional[str], remove: Optional[str], limit: int) -> Change:
        with self._locked():
            for _ in range(20):
                current, seen = self._read()
                result = apply(current, add, remove, limit)
                os.makedirs(os.path.dirname(self.path), exist_ok=True)
                fd, tmp = tempfile.mkstemp(prefix="notes-", dir=self.state)
                try:
                    os.fchmod(fd, self._mode())
                    with os.fdopen(fd, "wb") as f:
                        f.write(result.text.encode("utf-8"))
                        f.flush()
                        os.fsync(f.fileno())
                    if self._read()[1] != seen:  # someone else wrote meanwhile: start again
                        continue
                    os.replace(tmp, self.path)
                    tmp = None
                finally:
                    if tmp:
                        os.unlink(tmp)
                return result
            raise ToolError("the notes kept changing under us; nothing was changed, try again")


class BridgeNotes:
    """The notes as `notes.md` of the storage bridge's memory collection.

    A change is written through to the bridge before `remember` answers, as
    a conditional write on the version just read; on 412 (someone else wrote
    meanwhile) it reads again and re-applies, so two engines adding notes at
    once lose neither.
    """

    NAME = "notes.md"

    def __init__(self, collection):
        self.coll = collection

    def entry(self):
        return self.coll.stat(self.NAME)

    def read_bytes(self) -> tuple[bytes, str]:
        return self.coll.read(self.NAME)

    def read(self) -> str:
        from lnkmem.bridges.place import NotFound
        try:
            return self.read_bytes()[0].decode("utf-8", "replace")
        except NotFound:
            return ""

    def change(self, add: Optional[str], remove: Optional[str], limit: int) -> Change:
        from lnkmem.bridges.http import BridgeDown
        from lnkmem.bridges.place import Conflict, NotFound
        for _ in range(20):
            try:
                data, version = self.coll.read(self.NAME)
                current = data.decode("utf-8", "replace")
            except NotFound:
                current, version = "", None
            result = apply(current, add, remove, limit)
            try:
                self.coll.write(self.NAME, result.text.encode("utf-8"), version)
            except Conflict:
                continue
            except BridgeDown as e:
                raise ToolError(f"the notes could not be written: {e}; nothing was changed") from None
            return result
        raise ToolError("the notes kept changing under us; nothing was changed, try again")
