"""The engine's own files, written whole and never through anything found at their names.

<state> and a bound cache are the engine's alone, but what stands at a name there may
not be what the engine put: a link (to a file outside), a folder, a FIFO. Every file the
engine writes there by writing a temp file and renaming it goes through :func:`write_at`
(or :func:`write_file`): the temp file gets a name of its own (``.<name>.<pid>.<hex>.tmp``,
made with O_CREAT|O_EXCL|O_NOFOLLOW: nothing planted can occupy it), and the rename
replaces whatever is at the name (a link is replaced, never written through; a folder
there is removed first). Reads of such files (:func:`read_at`, :func:`read_file`) never
follow a link or wait on a FIFO. :func:`open_lock` opens a lock file the same way,
:func:`clear_non_file` removes what is not a plain file at a name another program opens
by path (LMDB's ``lock.mdb``), and :func:`exchange` swaps two names in one step
(renameat2 RENAME_EXCHANGE).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
import sys
import time
from typing import Optional

from lnkmem.core import procs

AT_FDCWD = -100
RENAME_EXCHANGE = 2  # renameat2(2)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC


def temp_name(name: str) -> str:
    """A temp file's name for ``name``: this process's and unguessable."""
    return f".{name}.{os.getpid()}.{secrets.token_hex(6)}.tmp"


def _temp_pid(name: str, tmp: str) -> Optional[int]:
    """The pid in ``tmp`` when it is one of :func:`temp_name`'s for ``name``."""
    stem = f".{name}."
    if not (tmp.startswith(stem) and tmp.endswith(".tmp")):
        return None
    parts = tmp[len(stem):-len(".tmp")].split(".")
    if len(parts) != 2 or not parts[0].isdigit() or len(parts[1]) != 12:
        return None
    return int(parts[0])


def identity(s: os.stat_result) -> tuple:
    """A file's identity, size and times: what changes when anyone writes it, renames
    another over its name or touches it (the notes' checks compare these)."""
    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)


def kind_of(mode: int) -> str:
    """What a file of ``mode`` is, in words (a log line's)."""
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return what
    return "a file"


def remove_at(dir_fd: int, name: str) -> None:
    """Remove what stands at ``name`` (a link unlinked, never followed; a folder removed
    whole, nothing below it followed); nothing there is fine."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass


def remove(path: str) -> None:
    """:func:`remove_at` by path (the folder it lies in opened as it is; none: nothing to do)."""
    try:
        opened = folder(path).__enter__()
    except (FileNotFoundError, NotADirectoryError):
        return
    fd, name = opened
    try:
        remove_at(fd, name)
    finally:
        os.close(fd)


def clear_leftovers_at(dir_fd: int, name: str) -> None:
    """Remove what earlier writes of ``name`` left: temp files of processes that have
    ended (a write killed between its temp file and its rename), and ``<name>.tmp``,
    the fixed temp name of older versions (whatever it is: never followed)."""
    try:
        names = os.listdir(dir_fd)
    except OSError:
        return
    for n in names:
        pid = _temp_pid(name, n)
        if (pid is not None and pid != os.getpid() and not procs.alive(pid)) or n == name + ".tmp":
            try:
                remove_at(dir_fd, n)
            except OSError:
                pass


def replace_at(dir_fd: int, src: str, dst: str) -> None:
    """Rename ``src`` over ``dst`` in the folder ``dir_fd``: whatever is at ``dst`` is
    replaced (a link: the link, never its target); a folder there is removed first."""
    try:
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
            raise
        st = os.stat(dst, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise
        shutil.rmtree(dst, dir_fd=dir_fd)
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def replace(src: str, dst: str) -> None:
    """:func:`replace_at` for two paths of one folder."""
    if os.path.dirname(os.path.abspath(src)) != os.path.dirname(os.path.abspath(dst)):
        raise ValueError("replace: the two names must be in one folder")
    with folder(dst) as (fd, name):
        replace_at(fd, os.path.basename(src), name)


def write_at(dir_fd: int, name: str, data: bytes, *, mode: int = 0o600, sync: bool = False,
             sync_folder: bool = False) -> None:
    """Write ``data`` as the file ``name`` of the folder ``dir_fd``, whole or not at all:
    to a temp file of its own (:func:`temp_name`), flushed to disk first when ``sync``,
    then renamed over ``name`` (:func:`replace_at`); the folder flushed after when
    ``sync_folder``. Leftovers of earlier writes of ``name`` are removed (:func:`clear_leftovers_at`)."""
    clear_leftovers_at(dir_fd, name)
    tmp = temp_name(name)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        replace_at(dir_fd, tmp, name)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    if sync_folder:
        os.fsync(dir_fd)


def write_file(path: str, data: bytes, **kw) -> None:
    """:func:`write_at` by path (the folder it lies in opened as it is)."""
    with folder(path) as (fd, name):
        write_at(fd, name, data, **kw)


def new_temp(path: str, mode: int = 0o600) -> str:
    """An empty temp file made for ``path`` (:func:`temp_name`, beside it), for a writer
    that can only write by path (a library's save); then :func:`replace` it over ``path``."""
    with folder(path) as (fd, name):
        clear_leftovers_at(fd, name)
        tmp = temp_name(name)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=fd))
    return os.path.join(os.path.dirname(path), tmp)


def read_at(dir_fd: Optional[int], name: str, limit: int = -1) -> Optional[bytes]:
    """The bytes of the plain file ``name`` (up to ``limit``, all when negative); None
    when there is none, or what is there is a link (never followed), a FIFO (never
    waited on), a folder or anything else."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC,
                     dir_fd=dir_fd if dir_fd is not None else None)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        out = []
        left = limit
        while left != 0:
            chunk = os.read(fd, 1 << 20 if left < 0 else min(left, 1 << 20))
            if not chunk:
                break
            out.append(chunk)
            if left > 0:
                left -= len(chunk)
        return b"".join(out)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_file(path: str, limit: int = -1) -> Optional[bytes]:
    """:func:`read_at` by path."""
    return read_at(None, path, limit)


def open_lock(path: str, mode: int = 0o600) -> int:
    """A descriptor (read-write) of the lock file ``path``, made when missing: never
    opened through a link, and never a FIFO or a folder (what is there instead is
    removed and a plain file made)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
    for _ in range(3):
        try:
            fd = os.open(path, flags, mode)
        except OSError as e:
            if e.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.EOPNOTSUPP):
                raise
            remove(path)
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.set_blocking(fd, True)
            return fd
        os.close(fd)
        remove(path)
    raise OSError(errno.EEXIST, f"{path} keeps being replaced by what is not a file")


def clear_non_file(path: str) -> Optional[str]:
    """Remove what stands at ``path`` when it is not a plain file (a link unlinked, never
    followed; a folder removed whole; a FIFO, a socket, a device unlinked): what it was,
    in words; None when it is a plain file or nothing."""
    return _clear_unless(path, stat.S_ISREG)


def clear_non_folder(path: str) -> Optional[str]:
    """Remove what stands at ``path`` when it is not a folder (a link -- to a folder too --
    unlinked, never followed; a file, a FIFO, a socket, a device unlinked): what it was, in
    words; None when it is a folder or nothing."""
    return _clear_unless(path, stat.S_ISDIR)


def _clear_unless(path: str, kind_ok) -> Optional[str]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if kind_ok(st.st_mode):
        return None
    remove(path)
    return kind_of(st.st_mode)


MOVED = ".moved-"  # what was found in a wrong shape at a name, moved aside: <name>.moved-<time>-<hex>
KEEP_MOVED = 2  # of each name, the newest this many moved aside are kept; older ones are removed


def move_aside_at(dir_fd: int, name: str) -> Optional[tuple[str, str]]:
    """Move what stands at ``name`` of the folder ``dir_fd`` aside, as it is, to
    ``<name>.moved-<time>-<hex>`` beside it (a link renamed, never followed; nothing in a
    folder read): (the name it got, what it was in words), or None when nothing is there.
    Of each name only the newest :data:`KEEP_MOVED` moved aside are kept, older ones
    removed (never followed): a tool that plants again and again never fills the disk,
    and the latest evidence stays for a person to look at (``status`` lists them)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    aside = f"{name}{MOVED}{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
    try:
        os.rename(name, aside, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    drop_moved_at(dir_fd, name)
    return aside, kind_of(st.st_mode)


def moved_names(dir_fd: int) -> list[str]:
    """The names moved aside in the folder ``dir_fd`` (:func:`move_aside_at`), sorted."""
    try:
        return sorted(n for n in os.listdir(dir_fd) if MOVED in n and not n.startswith("."))
    except OSError:
        return []


def drop_moved_at(dir_fd: int, name: str, keep: int = KEEP_MOVED) -> None:
    """Remove all but the newest ``keep`` moved aside of ``name`` (their names sort by time)."""
    mine = [n for n in moved_names(dir_fd) if n.startswith(name + MOVED)]
    for old in sorted(mine, key=lambda n: n[len(name) + len(MOVED):])[:-keep or None]:
        try:
            remove_at(dir_fd, old)
        except OSError:
            pass


def pinned(fd: int, path: str) -> str:
    """A path that names the folder the descriptor ``fd`` holds (opened once, never through
    a link), whatever ``path`` -- its name -- leads to later: ``/proc/<pid>/fd/<fd>`` (the
    kernel resolves it to the folder itself, moved, renamed or with a link at its old name).
    For what only takes paths (LMDB, a library's save, a child process: the pid is this
    process's, so a child reaches the same folder while this process holds it): every name
    below it is then reached from that folder, never through what stands at ``path`` now.
    ``path`` itself where there is no /proc. The descriptor must stay open while the path
    is used."""
    here = f"/proc/{os.getpid()}/fd/{fd}"
    return here if os.path.isdir(here) else path


def is_pinned(path: str) -> bool:
    """Whether ``path`` is one :func:`pinned` gave (a folder named by its descriptor)."""
    return _PINNED.match(path) is not None


_PINNED = re.compile(r"^/proc/\d+/fd/\d+$")


def open_folder_nofollow(path: str) -> int:
    """``path`` opened as a folder, never through a link at its last name (OSError otherwise)."""
    return os.open(path, _DIR_FLAGS | os.O_NOFOLLOW)


class folder:
    """``with folder(path) as (fd, name)``: the folder ``path`` lies in, opened, and its name there."""

    def __init__(self, path: str, inside: bool = False):
        self.dir, self.name = (path, None) if inside else os.path.split(os.path.abspath(path))
        self.fd = -1

    def __enter__(self):
        self.fd = os.open(self.dir, _DIR_FLAGS)
        return self.fd if self.name is None else (self.fd, self.name)

    def __exit__(self, *exc) -> None:
        os.close(self.fd)


_renameat2 = None


def exchange(a: str, b: str, dir_fd: Optional[int] = None) -> bool:
    """Swap the names ``a`` and ``b`` in one step (Linux's renameat2 RENAME_EXCHANGE;
    paths, or names in the folder ``dir_fd``): a process killed at any moment leaves each
    name to one whole file or folder. False, nothing done, where the kernel, libc or file
    system cannot (the caller does without); OSError for any other failure."""
    global _renameat2
    if _renameat2 is None:
        try:
            if not sys.platform.startswith("linux"):
                raise OSError("renameat2 is Linux's")
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.renameat2  # (glibc 2.28 and later)
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            _renameat2 = fn
        except (OSError, AttributeError):
            _renameat2 = False
    if not _renameat2:
        return False
    import ctypes
    at = AT_FDCWD if dir_fd is None else dir_fd
    if _renameat2(at, os.fsencode(a), at, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), b)
