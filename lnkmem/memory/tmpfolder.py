"""A memory's temp folder: documents are converted through temp files there (§7.1).

Each process writes in a folder of its own below it, ``p<pid>``; what a killed process
left there (and a `remember` cut short left beside the notes) is removed at the next
start (:func:`clean_tmp`). The temp folder is opened once, never through a link, and
this process's folder in it is reached from that descriptor (``atomic.pinned``),
whatever the folder's name leads to later.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Optional

from lnkmem.core import atomic, procs

log = logging.getLogger("lnkmem")

STALE_S = 60.0  # a loose temp file older than this is no writer's any more


class TempFolder:
    """This process's folder below a memory's temp folder (``parent``; "": none)."""

    def __init__(self, parent: str):
        self.parent = parent
        self.path = os.path.join(parent, f"p{os.getpid()}") if parent else ""
        self._fd: Optional[int] = None

    def open(self, state: Optional[str] = None) -> None:
        """At the index's open: what killed processes left removed (and ``notes-*`` temps in
        ``state``, the local notes' folder), then the temp folder held."""
        if not self.parent:
            return
        n = clean_tmp(self.parent, state)
        if n:
            log.info("removed %d temp files left by a process that was killed", n)
        self._hold()

    def _hold(self) -> None:
        """The temp folder opened once (made when missing), never through a link: this
        process's folder in it, and everything a conversion writes there, is reached from
        it (atomic.pinned), whatever the folder's name leads to later."""
        if self._fd is not None:
            return
        try:
            try:
                os.mkdir(self.parent, 0o700)
            except FileExistsError:
                pass
            fd = atomic.open_folder_nofollow(self.parent)
        except OSError as e:
            log.debug("the temp folder could not be opened: %s", e)
            return
        self._fd = fd
        self.path = os.path.join(atomic.pinned(fd, self.parent), f"p{os.getpid()}")

    def remove(self) -> None:
        """This process's folder removed (at a stop)."""
        if self.path:
            try:  # (from the temp folder as opened: a link put at its name is never followed)
                atomic.remove(self.path)
            except OSError:
                pass

    def let_go(self) -> None:
        """The temp folder's descriptor closed (no thread writes through it any more)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def clean_tmp(tmpdir: str, state: Optional[str] = None) -> int:
    """Remove temp files that processes killed mid-write left behind (§7.1): the
    per-process folders ``p<pid>`` under ``tmpdir`` of processes gone, loose
    files there, and ``notes-*`` temps in ``state``, once older than STALE_S.
    Only regular files and those folders are touched, never through a link.
    Returns how many were removed."""
    import shutil
    removed = 0
    now = time.time()
    mine = f"p{os.getpid()}"
    if tmpdir:
        was = atomic.clear_non_folder(tmpdir)  # (a link there -- to another agent's folder -- is never followed)
        if was is not None:
            log.warning("%s was %s, not a folder: removed (never followed)", tmpdir, was)
    for folder, pattern in ((tmpdir, None), (state, "notes-")):
        if not folder:
            continue
        try:
            fd = atomic.open_folder_nofollow(folder)  # each entry reached from this folder, as it was opened
        except OSError:
            continue
        try:
            for d in list(os.scandir(fd)):
                try:
                    s = d.stat(follow_symlinks=False)
                    if pattern is None and d.is_dir(follow_symlinks=False) and d.name[:1] == "p" and d.name[1:].isdigit():
                        if d.name != mine and not procs.alive(int(d.name[1:])):
                            shutil.rmtree(d.name, dir_fd=fd, ignore_errors=True)
                            removed += 1
                        continue
                    if not d.is_file(follow_symlinks=False) or now - s.st_mtime < STALE_S:
                        continue
                    if pattern is not None and not (d.name.startswith(pattern) and len(d.name) == len(pattern) + 8):
                        continue
                    os.unlink(d.name, dir_fd=fd)
                    removed += 1
                except OSError:
                    continue
        finally:
            os.close(fd)
    return removed
