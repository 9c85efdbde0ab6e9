"""A local folder as a place (§3.2 rules for what is listed and read).

Every open goes through :meth:`LocalPlace._open`, which no link swapped in
between a check and the open can lead outside the root (§3.2 rev. 2): the
path is opened beneath the root with ``openat2(RESOLVE_BENEATH)`` where the
kernel has it, and in every case the opened descriptor itself (its path in
``/proc/self/fd``) is checked to lie inside the root and outside the
excluded folders before anything is read from it. Folders are walked
through such descriptors too, so a folder swapped for a link mid-walk is
never entered. A name that is not valid UTF-8 is skipped and counted: it
has no ref (§3.1 refs are text), and it never stops a walk or a listing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat as st
from typing import Iterable, Optional

from lnkmem.core import atomic
from lnkmem.bridges.local_entry import LocalEntry, version_of
from lnkmem.bridges.place import MAX_FILE, Entry, Forbidden, NotFound, PlaceBase, check_relpath
from lnkmem.bridges.ignore import NAMES as IGNORE_NAMES, Ignorer
from lnkmem.core.libc import libc as c_library

O_PATH = getattr(os, "O_PATH", 0)
READ_FLAGS = os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


def _walk_fds() -> int:
    """How many folders' descriptors one walk holds at most (LocalPlace._walk): deep
    enough for any usual tree, few against the process's limit (serve-many walks the
    trees of many agents at once)."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 8
    if soft == resource.RLIM_INFINITY:
        return 32
    return max(2, min(32, soft // 64))


WALK_FDS = _walk_fds()
META_FLAGS = (O_PATH or os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY) | getattr(os, "O_CLOEXEC", 0)


def utf8(name: str) -> bool:
    """Whether a name from the filesystem is valid UTF-8 (no surrogate escapes)."""
    try:
        name.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def nameable(name: str) -> bool:
    """Whether a ref can name this file name: valid UTF-8, and no backslash (refs
    refuse it, §4.2)."""
    return "\\" not in name and utf8(name)


# --- openat2(RESOLVE_BENEATH) -------------------------------------------------------

_SYS_OPENAT2 = 437  # the same number on every Linux architecture
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
RESOLVE_NO_SYMLINKS = 0x04


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


try:
    _syscall = c_library().syscall
    _syscall.restype = ctypes.c_long
    _has_openat2 = os.uname().sysname == "Linux"
except (OSError, AttributeError):
    _syscall = None
    _has_openat2 = False


def _openat2(dirfd: int, rel: str, flags: int) -> Optional[int]:
    """``rel`` opened beneath ``dirfd``; None when the kernel (or a sandbox) lacks openat2.
    Raises OSError (EXDEV: a link or `..` would leave ``dirfd``)."""
    return _openat2_how(dirfd, rel, _OpenHow(flags, 0, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS))


def _openat2_how(dirfd: int, rel: str, how) -> Optional[int]:
    global _has_openat2
    if not _has_openat2:
        return None
    fd = _syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(rel)),
                  ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
    if fd >= 0:
        return int(fd)
    e = ctypes.get_errno()
    if e in (errno.ENOSYS, errno.EPERM, errno.E2BIG, errno.EINVAL):
        _has_openat2 = False  # seccomp or an old kernel: the descriptor check alone guards
        return None
    raise OSError(e, os.strerror(e), rel)


def _fd_path(fd: int) -> Optional[str]:
    """Where an open descriptor really is, or None without /proc."""
    return _fd_path_of(f"/proc/self/fd/{fd}")


def _fd_path_of(link: str) -> Optional[str]:
    try:
        p = os.readlink(link)
    except OSError:
        return None
    if p.endswith(" (deleted)"):
        p = p[: -len(" (deleted)")]
    return p


class LocalPlace(PlaceBase):
    """Files below ``root``; hidden names skipped; ``exclude`` folders skipped;
    a link followed only when its target stays inside ``root``."""

    def __init__(self, root: str, exclude: Iterable[str] = (), ignore: bool = False):
        self.root = os.path.abspath(root)
        # a folder opened once and named by its descriptor (core.atomic.pinned: the engine's
        # own copy of a driver's conversations): opened through that name, and checked
        # against where the folder is now (moved, or a link put at its old name: never
        # the link's)
        self._pin = self.root if atomic.is_pinned(self.root) else None
        self._real = os.path.realpath(self.root)
        self.exclude = {os.path.realpath(e) for e in exclude}
        self._exclude_in = {os.path.dirname(e) for e in self.exclude}  # folders holding an excluded path
        self.skipped = 0
        # ignore files (§3.2 rev. 2; Home only): honoured by list, listdir, stat
        self.ignore = Ignorer(self.root) if ignore else None
        self.skipped_by: dict[str, int] = {}  # why, for people (`lnk-lnkmem index`)

    local = True
    forkable = True

    @property
    def real(self) -> str:
        """Where the root is (a pinned one: where its folder is now)."""
        if self._pin is None:
            return self._real
        return _fd_path_of(self._pin) or self._real

    @property
    def opener(self) -> str:
        """The name the root is opened by (a pinned one: its descriptor's)."""
        return self._pin or self._real

    def _skip(self, why: str) -> None:
        self.skipped += 1
        self.skipped_by[why] = self.skipped_by.get(why, 0) + 1

    def _inside(self, real: str) -> bool:
        if real in self.exclude or any(real.startswith(e + os.sep) for e in self.exclude):
            return False
        return real == self.real or real.startswith(self.real + os.sep)

    def _rel(self, path: str) -> str:
        """A clean relative path that may be served; Forbidden otherwise."""
        rel = check_relpath(path)
        parts = [p for p in rel.split("/") if p]
        if any(p.startswith(".") for p in parts):
            raise Forbidden(f"hidden paths are not served: {path!r}")
        if not utf8(rel):
            raise Forbidden(f"not a UTF-8 path: {path!r}")
        return rel

    def _open(self, rel: str, flags: int) -> int:
        return self._open_where(rel, flags)[0]

    def _open_where(self, rel: str, flags: int) -> tuple[int, str]:
        """A descriptor of ``rel`` (already clean) that lies inside the root, and
        where it lies (checked).

        Opened beneath the root where the kernel allows it; whatever the kernel,
        the descriptor's own path is checked before it is handed out, so a link
        swapped in at any moment is never read through. Raises NotFound or
        Forbidden."""
        fd = None
        try:
            root = os.open(self.opener, O_PATH | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise NotFound(f"{rel or '.'}: {e.strerror}") from None
        try:
            try:
                fd = _openat2(root, rel or ".", flags)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    raise
                # a link on the way: absolute ones (even to inside) or one leaving the
                # root. Follow it by name, and open what it names beneath the root again.
                target = os.path.realpath(os.path.join(self.real, rel))
                if not self._inside(target):
                    raise Forbidden(f"path leaves its root: {rel!r}") from None
                fd = _openat2(root, os.path.relpath(target, self.real), flags)
            if fd is None:  # no openat2: the descriptor check below is the guard
                fd = os.open(os.path.join(self.real, rel) if rel else self.real, flags)
        except FileNotFoundError:
            raise NotFound(rel) from None
        except OSError as e:
            if e.errno == errno.EXDEV:
                raise Forbidden(f"path leaves its root: {rel!r}") from None
            raise NotFound(f"{rel}: {e.strerror}") from None
        finally:
            os.close(root)
        try:
            where = _fd_path(fd)
            if where is None:  # no /proc: the descriptor must be the file a checked path names now
                where = os.path.realpath(os.path.join(self.real, rel))
                s, t = os.fstat(fd), os.stat(where)
                if (s.st_dev, s.st_ino) != (t.st_dev, t.st_ino):
                    raise Forbidden(f"path changed while opened: {rel!r}")
            if not self._inside(where):
                raise Forbidden(f"path leaves its root: {rel!r}")
        except BaseException:
            os.close(fd)
            raise
        return fd, where

    def open_root(self) -> Optional[int]:
        """A descriptor of the root, for :meth:`advise` (the caller closes it); None when it
        cannot be opened or files cannot be opened beneath it (no openat2)."""
        if not _has_openat2 or not hasattr(os, "posix_fadvise"):
            return None
        try:
            return os.open(self.opener, O_PATH | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return None

    def advise(self, root: int, path: str) -> bool:
        """Have the kernel read the regular file ``path`` into memory now, in the
        background, ahead of its own read (``posix_fadvise`` WILLNEED): a build's thread
        asks it for the files it is about to read. Opened only beneath the root
        (``root``: :meth:`open_root`; openat2, never by name alone), non-blocking, read
        nothing of; False when it was not (no openat2, not there, not a regular file)."""
        try:
            fd = _openat2(root, path, READ_FLAGS)
        except OSError:
            return False
        if fd is None:
            return False
        try:
            if not st.S_ISREG(os.fstat(fd).st_mode):
                return False
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def _fstat(self, rel: str) -> os.stat_result:
        fd = self._open(rel, META_FLAGS)
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def list(self, prefix: str = "", share: bool = False) -> list[Entry]:
        """Every file below ``prefix`` that may be served, in walk order. ``share``: a large
        tree (the caller knows it from the index), listed with a second process when
        there are two cores (:mod:`lnkmem.bridges.shared_walk`: the same entries, in
        the same order)."""
        out: list[Entry] = []
        self.skipped = 0
        self.skipped_by = {}
        try:
            rel0 = self._rel(prefix)
            s = self._fstat(rel0)
        except (Forbidden, NotFound):
            return out
        if st.S_ISREG(s.st_mode):
            e = self.stat(rel0)
            return [e] if e else []
        stack = self.ignore.stack_to(rel0) if self.ignore else None
        if self.ignore and stack is None:
            return out
        if share:
            from lnkmem.bridges import shared_walk
            return shared_walk.walk(self, rel0, stack)
        seen: set[tuple[int, int]] = set()
        self._walk(rel0, out, seen, stack)
        return out

    def _entries(self, fd: int, rel: str, here: Optional[str] = None,
                 hidden: Optional[set] = None) -> list[tuple[str, Optional[os.stat_result]]]:
        """(name, its own stat; None for a link) of each entry of an open folder
        (``here``: where it lies, checked) that may be served: hidden names left
        out, names no ref can spell (not UTF-8, a backslash) skipped and counted,
        excluded folders left out. ``hidden``: the ignore files' names found are added to it."""
        if here is None:
            here = _fd_path(fd) or os.path.join(self.real, rel)
        excl = here in self._exclude_in  # else no name here is excluded: no path built per entry
        out = []
        with os.scandir(fd) as it:  # its entries stat through ``fd``: used while it is open
            for d in it:
                name = d.name
                if name[0] == ".":
                    if hidden is not None and name in IGNORE_NAMES:
                        hidden.add(name)
                    continue
                if not (name.isascii() and "\\" not in name or nameable(name)):  # no ref can name it
                    self._skip("name not UTF-8")
                    continue
                try:
                    if d.is_symlink():
                        out.append((name, None))
                    elif not excl or os.path.join(here, name) not in self.exclude:
                        out.append((name, d.stat(follow_symlinks=False)))
                except OSError:
                    self._skip("unreadable")
        return out

    def _walk(self, rel: str, out: list[Entry], seen: set, stack=None, enter: bool = False,
              opened: Optional[tuple[int, str]] = None, later: Optional[list] = None) -> None:
        """Files below ``rel`` into ``out``; ``stack``: the ignore levels in force in its
        parent (``enter``) or in it. ``opened``: its descriptor and where it lies, when
        the parent opened it (then this closes it). ``later``: its own folders are not
        walked but noted there, (place in ``out``, path), in order (a shared listing:
        :mod:`lnkmem.bridges.shared_walk` walks them, each as this would).

        Depth first, in each folder's order, with no recursion on the Python stack (a
        chain of folders as deep as a path allows: ~2,048): each folder being walked is a
        suspended generator (:meth:`_folder`). Only the top WALK_FDS of them hold their
        folder's descriptor while their subfolders are walked (a subfolder is opened
        beside it); below, a folder's descriptor is closed once it is listed and its
        subfolders are opened from the root (checked the same way)."""
        frames = [self._folder(rel, out, seen, stack, enter, opened, later, 0)]
        try:
            while frames:
                try:
                    child = next(frames[-1])
                except StopIteration:
                    frames.pop()
                    continue
                path, sub_stack, parent = child
                frames.append(self._folder(path, out, seen, sub_stack, True, None, None, len(frames), parent))
        finally:
            while frames:  # (an error: every folder's descriptor closed, deepest first)
                frames.pop().close()

    def _folder(self, rel: str, out: list[Entry], seen: set, stack, enter: bool,
                opened: Optional[tuple[int, str]], later: Optional[list], depth: int,
                parent: Optional[tuple[int, str]] = None):
        """Walk one folder: its files appended to ``out``, and for each of its subfolders,
        in order, (path, ignore stack, this folder's descriptor and place or None) yielded
        for :meth:`_walk` to walk before this goes on. ``parent``: the folder is opened
        beside that descriptor (no link followed), else from the root."""
        if opened is None and parent is not None:
            try:
                opened = self._open_below(parent[0], rel.rsplit("/", 1)[-1], parent[1])
            except OSError:  # a link swapped in since it was listed (ELOOP), or gone
                self._skip("unreadable")
                return
        if opened is None:
            try:
                opened = self._open_where(rel, DIR_FLAGS)
            except (NotFound, Forbidden, OSError):  # (OSError: a path longer than the kernel takes)
                self._skip("unreadable")
                return
        fd, here = opened
        try:
            try:
                s = os.fstat(fd)
                if (s.st_dev, s.st_ino) in seen:
                    return
                seen.add((s.st_dev, s.st_ino))
                hidden: set = set()
                found = self._entries(fd, rel, here, hidden)
            except OSError:
                self._skip("unreadable")
                return
            if depth >= WALK_FDS:  # deep: this folder's descriptor is let go of now
                os.close(fd)
                fd = -1
            ignore = self.ignore
            if enter and ignore and hidden:  # its own ignore files, read only where the folder has one
                stack = stack + ignore.level(rel, os.path.join(self.real, rel))
            S_ISDIR, S_ISREG = st.S_ISDIR, st.S_ISREG
            # only folder rules in force (the defaults, most trees): no file here can be ignored
            file_rules = ignore is not None and any(not r.dir_only for _, rules in stack for r in rules)
            pre = f"{rel}/" if rel else ""
            append = out.append
            for name, s in found:
                path = pre + name
                try:
                    link = s is None
                    if link:
                        s = self._fstat(path)  # a link: followed only inside the root
                    mode = s.st_mode
                    is_dir = S_ISDIR(mode)
                    # the full path only for a folder: the ignore rules need it there, a file's is never built
                    full = os.path.join(self.real, path) if is_dir and ignore else ""
                    if (is_dir or file_rules) and ignore and ignore.skip(stack, path, is_dir, full):
                        self._skip("ignored")
                        continue
                    if is_dir:
                        if later is not None:
                            later.append((len(out), path))
                            continue
                        # a folder that is no link is opened beside its parent's descriptor (no
                        # walk from the root, no look at /proc); a link, or below the descriptors
                        # held, by its path from the root
                        yield path, stack, None if link or fd < 0 else (fd, here)
                    elif S_ISREG(mode):
                        if s.st_size > MAX_FILE:
                            self._skip("too big")
                            continue
                        append(LocalEntry(path, s.st_size, version_of(s)))
                except Forbidden:
                    continue  # a link leaving the root (or into an excluded folder)
                except (OSError, NotFound):
                    self._skip("unreadable")
        finally:
            if fd >= 0:
                os.close(fd)

    def _open_below(self, fd: int, name: str, here: str) -> Optional[tuple[int, str]]:
        """The folder ``name`` of the open folder ``fd`` (which lies at ``here``, checked),
        opened with no link followed: it lies at ``here/name``. None where the kernel
        lacks openat2 (the caller opens it by path, checked). Raises OSError (a link
        swapped in since the folder was listed: ELOOP)."""
        how = _OpenHow(DIR_FLAGS, 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)
        sub = _openat2_how(fd, name, how)
        if sub is None:
            return None
        return sub, f"{here}/{name}"

    def stat(self, path: str) -> Optional[Entry]:
        try:
            rel = self._rel(path)
            s = self._fstat(rel)
        except (OSError, Forbidden, NotFound):
            return None
        if not st.S_ISREG(s.st_mode):
            return None
        if self.ignore and self.ignore.ignored(rel, False):
            return None
        return LocalEntry(rel, s.st_size, version_of(s))

    def open_file(self, path: str):
        """A binary file object of a regular file inside the root, and its stat."""
        rel = self._rel(path)
        fd = self._open(rel, READ_FLAGS)
        try:
            s = os.fstat(fd)
            if not st.S_ISREG(s.st_mode):
                raise NotFound(f"not a file: {path}")
            return os.fdopen(fd, "rb"), s
        except BaseException:
            os.close(fd)
            raise

    def read(self, path: str) -> tuple[bytes, str]:
        f, s = self.open_file(path)
        with f:
            # read(n) allocates n bytes up front: ask for what the file holds
            data = f.read(min(s.st_size, MAX_FILE) + 1)
        return data, version_of(s)

    def read_lines(self, path: str, first: int, last: Optional[int], limit: int) -> tuple[bytes, int, bool, bool]:
        """Lines ``first``..``last`` (1-based, inclusive; None: to the end) of a file
        of any size, streamed: (their bytes, at most ``limit`` + 4 of them; the
        file's total lines; whether bytes were left out; whether the file starts
        with a NUL in its first 8 KiB, i.e. is not text). Memory stays bounded."""
        f, _ = self.open_file(path)
        out = bytearray()
        more = False
        line = 1  # the line the next byte belongs to
        ended = True  # the last byte read was a newline (or nothing was read)
        head = b""
        with f:
            while True:
                chunk = f.read(1 << 20)
                if not chunk:
                    break
                if len(head) < 8192:
                    head += chunk[: 8192 - len(head)]
                ended = chunk.endswith(b"\n")
                if last is not None and line > last:
                    line += chunk.count(b"\n")
                    continue
                pos = 0
                while pos < len(chunk):
                    nl = chunk.find(b"\n", pos)
                    end = len(chunk) if nl < 0 else nl + 1
                    if line >= first and (last is None or line <= last):
                        take = chunk[pos:end]
                        room = limit + 4 - len(out)
                        if len(take) > room:
                            more = True
                            take = take[: max(room, 0)]
                        out += take
                    if nl < 0:
                        break
                    line += 1
                    pos = end
                    if last is not None and line > last:
                        line += chunk.count(b"\n", pos)
                        break
        total = line - 1 if ended else line
        return bytes(out), total, more, b"\0" in head

    def listdir(self, path: str) -> list[tuple[str, str, int]]:
        """(name, 'file'|'folder', size) directly under ``path`` (for `list`)."""
        rel = self._rel(path)
        stack = self.ignore.stack_to(rel) if self.ignore else None
        if self.ignore and stack is None:
            raise NotFound(f"ignored: {path}")
        try:
            fd = self._open(rel, DIR_FLAGS)
        except NotFound:
            if self.stat(rel) is not None:
                raise NotFound(f"not a folder: {path}") from None
            raise
        try:
            found = sorted(self._entries(fd, rel), key=lambda e: e[0])
        except OSError:
            raise NotFound(path) from None
        finally:
            os.close(fd)
        out = []
        for name, s in found:
            try:
                if s is None:
                    s = self._fstat(f"{rel}/{name}" if rel else name)
            except (OSError, NotFound, Forbidden):
                continue
            if self.ignore:
                child = f"{rel}/{name}" if rel else name
                if self.ignore.skip(stack, child, st.S_ISDIR(s.st_mode), os.path.join(self.real, child)):
                    continue
            if st.S_ISDIR(s.st_mode):
                out.append((name, "folder", 0))
            elif st.S_ISREG(s.st_mode):
                out.append((name, "file", s.st_size))
        return out
