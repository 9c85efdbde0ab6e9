"""Linux inotify over ctypes, for folders whose names watchfiles cannot carry.

watchfiles hands paths to Python as text and fails for good at a name that is
not UTF-8 (§3.2 rev. 2: such a name is skipped, never a reason to stop
watching). This watcher keeps paths as bytes: one watch per folder, new
folders watched as they appear, an overflowed queue reported as None so that
the caller looks at everything again.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
from typing import Optional

from lnkmem.core.libc import libc as c_library

IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_CLOSE_WRITE = 0x8
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ISDIR = 0x40000000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)
MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF)
_EVENT = struct.Struct("iIII")

try:
    _libc = c_library()
    _init = _libc.inotify_init1
    _add = _libc.inotify_add_watch
    _add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
except (OSError, AttributeError):
    _init = _add = None


class Inotify:
    """Watches folders (bytes paths) and reads their events."""

    def __init__(self) -> None:
        if _init is None:
            raise OSError("inotify is not available here")
        fd = _init(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        self.fd = fd
        self.wds: dict[int, bytes] = {}

    def add(self, folder: bytes) -> None:
        wd = _add(self.fd, folder, MASK | IN_ONLYDIR | IN_DONT_FOLLOW)
        if wd < 0:
            e = ctypes.get_errno()
            if e == 28:  # ENOSPC: no watches left (max_user_watches)
                raise OSError(e, "no inotify watches left")
            return  # vanished meanwhile, or not a folder: nothing to watch
        self.wds[wd] = folder

    def add_tree(self, top: bytes) -> None:
        """Watch ``top`` and every folder below it (links not followed). A loop over the
        folders still to look in (os.walk recurses: a chain 1,000 deep was a RecursionError,
        and watching stopped)."""
        self.add(top)
        todo = [top]
        while todo:
            here = todo.pop()
            try:
                with os.scandir(here) as it:
                    dirs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
            except OSError:  # gone, unreadable, or a path longer than the kernel takes
                continue
            for d in dirs:
                path = os.path.join(here, d)
                self.add(path)
                todo.append(path)

    def read(self, timeout: float) -> Optional[list[tuple[int, bytes]]]:
        """(mask, path) of events within ``timeout`` seconds; None when events were lost."""
        r, _, _ = select.select([self.fd], [], [], timeout)
        if not r:
            return []
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        out = []
        lost = False
        off = 0
        while off + _EVENT.size <= len(data):
            wd, mask, _, n = _EVENT.unpack_from(data, off)
            name = data[off + _EVENT.size: off + _EVENT.size + n].rstrip(b"\0")
            off += _EVENT.size + n
            if mask & IN_Q_OVERFLOW:
                lost = True
                continue
            if mask & IN_IGNORED:
                self.wds.pop(wd, None)
                continue
            folder = self.wds.get(wd)
            if folder is None:
                continue
            path = os.path.join(folder, name) if name else folder
            if mask & IN_ISDIR and mask & (IN_CREATE | IN_MOVED_TO):
                self.add_tree(path)  # a new folder: watched from now on
            out.append((mask, path))
        return None if lost else out

    def close(self) -> None:
        os.close(self.fd)
