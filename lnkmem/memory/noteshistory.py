"""The notes' earlier versions, kept in ``<state>/notes-history/`` (§2.2 rev. 3).

No fixed wait closes every editor's window, so nothing is lost by design: before
`remember` (or a restore) replaces the notes, the text it replaces is kept here,
and so is the text it wrote (an editor that saves an older copy over it later
loses nothing either). A version equal to the newest kept one is not kept again.
The folder is bounded: the newest :func:`keep_count` versions, at most
:func:`keep_bytes` bytes together (the newest always kept). A person lists them
with `lnk-lnkmem status` or `lnk-lnkmem notes-history`, and restores one with
``notes-history --restore N`` (a change like `remember`'s: the text it replaces
is kept too).

Each version is one file, ``<nanoseconds>-<why>-<digest>.md``: its name says
when, why and what (the first 16 hex digits of its SHA-256), its content is the
text. It is written to a dot-name, synced and renamed, all beside the folder's
descriptor (opened once, never through a link).
"""

from __future__ import annotations

import errno
import functools
import hashlib
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass
from typing import Optional

from lnkmem.core import atomic
from lnkmem.core.knobs import knobs

log = logging.getLogger("lnkmem")

FOLDER = "notes-history"
WHY = {
    "replaced": "replaced by remember",
    "written": "written by remember",
    "seen": "seen before the notes were emptied or cut short",
    "restored": "replaced by a restore",
    "late": "saved into the notes remember had replaced (merged in)",
}


def keep_count() -> int:
    """How many versions are kept (``LNKMEM_NOTES_KEEP``, default 50)."""
    return knobs().notes_keep


def keep_bytes() -> int:
    """How many bytes the kept versions take at most together (``LNKMEM_NOTES_KEEP_BYTES``, 16 MiB)."""
    return knobs().notes_keep_bytes


@dataclass(frozen=True)
class Version:
    id: str  # the file's name without `.md`
    at: float  # seconds since the epoch
    why: str
    digest: str
    bytes: int

    @property
    def reason(self) -> str:
        return WHY.get(self.why, self.why)


def _parse(name: str, size: int) -> Optional[Version]:
    if not name.endswith(".md") or name.startswith("."):
        return None
    parts = name[:-3].split("-")
    if len(parts) != 3 or not parts[0].isdigit() or parts[1] not in WHY:
        return None
    return Version(name[:-3], int(parts[0]) / 1e9, parts[1], parts[2], size)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class HistoryRefused(Exception):
    """The history folder has a wrong shape (a file, a FIFO, a link) where a person only
    looks (:meth:`History.at`): it is reported, never followed nor changed."""


def shape(s: Optional[os.stat_result]) -> str:
    """What stands at a path, in words: "nothing", "a folder", "a file", "a symbolic link", ..."""
    if s is None:
        return "nothing"
    m = s.st_mode
    for test, words in ((stat.S_ISDIR, "a folder"), (stat.S_ISREG, "a file"), (stat.S_ISLNK, "a symbolic link"),
                        (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(m):
            return words
    return "a device"


def lstat_at(dir_fd: int, name: str) -> Optional[os.stat_result]:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def move_aside(dir_fd: int, name: str, where: str, wanted: str) -> Optional[str]:
    """Move what stands at ``name`` (below ``dir_fd``; ``where`` names it for the log)
    aside (:func:`atomic.move_aside_at`: ``<name>.moved-<time>-<hex>`` beside it, as it
    is: a link is renamed, never followed; the newest two of a name kept). The name it got,
    or None when the thing went meanwhile. One line in the log says what it was and where
    it is now."""
    s = lstat_at(dir_fd, name)
    moved = atomic.move_aside_at(dir_fd, name)
    if moved is None:
        return None
    log.warning("%s was %s where %s belongs: moved aside to %s (not followed; nothing in it was read, "
                "written or deleted), and %s made anew", where, shape(s), wanted, moved[0], name)
    return moved[0]


def _serialized(method):
    """One thread at a time in a :class:`History` (the engine's aftercare keeps from its own thread)."""
    @functools.wraps(method)
    def run(self, *args, **kw):
        with self.mu:
            return method(self, *args, **kw)
    return run


class History:
    """The versions kept below one ``<state>`` descriptor.

    The folder is opened beside ``<state>``'s descriptor, never through a link,
    and checked again before each use: removed, or swapped for anything else while
    the engine runs, it is made anew. Where something else stands at its name (a
    file, a FIFO, a link: a confused person or tool), that is moved aside
    (:func:`move_aside`) and the folder made; with ``recover`` false (a person's
    command, which only looks) :class:`HistoryRefused` says so instead."""

    FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

    def __init__(self, state_fd: int, recover: bool = True, where: str = "<state>"):
        self.mu = threading.RLock()
        self.state_fd = os.dup(state_fd)
        self.recover = recover
        self.where = os.path.join(where, FOLDER)
        self.fd = -1
        try:
            self.fd = self._open()
        except BaseException:
            os.close(self.state_fd)
            raise

    def _open(self) -> int:
        for _ in range(5):
            try:
                return os.open(FOLDER, self.FLAGS, dir_fd=self.state_fd)
            except FileNotFoundError:
                if not self.recover:
                    raise
                try:
                    os.mkdir(FOLDER, 0o700, dir_fd=self.state_fd)
                except FileExistsError:
                    pass
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                s = lstat_at(self.state_fd, FOLDER)
                if s is not None and stat.S_ISDIR(s.st_mode):
                    continue  # made a folder meanwhile
                if not self.recover:
                    raise HistoryRefused(f"{self.where} is {shape(s)}, not a folder: it is not followed; the engine "
                                         f"moves it aside and makes the folder anew at its next `remember`") from None
                move_aside(self.state_fd, FOLDER, self.where, "the notes history folder")
        raise OSError(errno.ENOTDIR, "kept changing shape", self.where)

    def _check(self) -> None:
        """Open the folder again where what stands at its name is no longer the one held."""
        if not self.recover:
            return
        s = lstat_at(self.state_fd, FOLDER)
        held = os.fstat(self.fd)
        if s is not None and (s.st_dev, s.st_ino) == (held.st_dev, held.st_ino):
            return
        if s is None:
            log.warning("%s was removed while the engine ran: made anew", self.where)
        fd = self._open()
        os.close(self.fd)
        self.fd = fd

    @classmethod
    def at(cls, state: str) -> Optional["History"]:
        """The history of the state folder ``state`` as named (a person's command); None when
        none; :class:`HistoryRefused` when something else stands at its name."""
        try:
            fd = os.open(state, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ENOTDIR:
                raise HistoryRefused(f"{state} is not a folder (give the memory's state folder)") from None
            raise
        try:
            return cls(fd, recover=False, where=state)
        except FileNotFoundError:
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.state_fd)

    @_serialized
    def versions(self) -> list[Version]:
        """Newest first (only plain files named as versions: a link, a FIFO or a folder
        under such a name is no version, and never opened)."""
        self._check()
        out = []
        for name in os.listdir(self.fd):
            try:
                s = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except OSError:
                continue
            v = _parse(name, s.st_size) if stat.S_ISREG(s.st_mode) else None
            if v is not None:
                out.append(v)
        out.sort(key=lambda v: v.id, reverse=True)
        return out

    @_serialized
    def text(self, v: Version) -> bytes:
        fd = os.open(v.id + ".md", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO or a folder since listed
                raise OSError(errno.EINVAL, "not a plain file", v.id + ".md")
            return f.read()

    def _holds(self, v: Version, data: bytes) -> bool:
        try:
            return self.text(v) == data
        except OSError:
            return False

    @_serialized
    def find(self, which: str) -> Version:
        """A version by its number in the listing (1: the newest) or its id; KeyError if none."""
        vs = self.versions()
        if which.isdigit() and 1 <= int(which) <= len(vs):
            return vs[int(which) - 1]
        for v in vs:
            if v.id == which:
                return v
        raise KeyError(which)

    @_serialized
    def keep(self, data: bytes, why: str, sync: bool = True, source: Optional[tuple[int, str]] = None
             ) -> Optional[Version]:
        """Keep ``data`` unless the newest version holds it already; then prune.

        ``source`` (a folder's descriptor and a name in it) is a file holding
        exactly ``data``: moved in by a rename where it is on the same filesystem
        (nothing copied), else copied. ``sync``: synced before this returns (the
        text replaced, before its last other name goes); a version the notes
        file itself still holds needs no sync of its own."""
        d = digest(data)
        vs = self.versions()
        if vs and vs[0].digest == d and self._holds(vs[0], data):
            return None
        now = time.time_ns()
        if vs and int(vs[0].id.split("-")[0]) >= now:  # the clock went back: still newest
            now = int(vs[0].id.split("-")[0]) + 1
        name = f"{now:019d}-{why}-{d}"
        moved = False
        if source is not None:
            try:
                os.rename(source[1], name + ".md", src_dir_fd=source[0], dst_dir_fd=self.fd)
                moved = True
            except OSError:  # another filesystem (EXDEV): copied below
                moved = False
        if not moved:
            atomic.write_at(self.fd, name + ".md", data, sync=sync)  # (a temp file of its own, renamed over)
        if sync:
            os.fsync(self.fd)
        v = Version(name, now / 1e9, why, d, len(data))
        self.prune([v] + vs)
        return v

    def prune(self, vs: list[Version]) -> None:
        """Drop the oldest versions beyond the count or the bytes (the newest always stays)."""
        total, count, limit_n, limit_b = 0, 0, keep_count(), keep_bytes()
        for v in vs:
            count += 1
            total += v.bytes
            if count > 1 and (count > limit_n or total > limit_b):
                _unlink(v.id + ".md", self.fd)
        for name in os.listdir(self.fd):  # dot-names left by a kill mid-keep
            if name.startswith(".") and name.count(".") >= 2:
                try:
                    if time.time() - os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mtime > 60:
                        _unlink(name, self.fd)
                except OSError:
                    pass


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def rfc3339(t: float) -> str:
    import datetime
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")
