"""The notes' aftercare (§2.2 rev. 3, issue 46): after a change made on notes someone had
emptied or held open for writing, the notes are watched for a while for that writer's
save, so that it loses nothing and neither does the change.

One concern, the watches and their thread; the notes themselves (reading, the lock, the
change that merges a late save in) are :class:`lnkmem.memory.notes.LocalNotes`', reached
through the public surface :class:`WatchedNotes` names.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from lnkmem.core.atomic import identity
from lnkmem.core.errors import ToolError
from lnkmem.core.knobs import knobs
from lnkmem.memory import leases, notesrules
from lnkmem.memory.notesrules import Change, count_entries

log = logging.getLogger("lnkmem")

LATE_QUIET_S = 0.5  # a file not held open for writing, quiet this long, is saved (no leases: judged by times)
HELD_MAX_S = 600.0  # how long a file replaced while held open for writing is watched beyond aftercare_s()
WATCH_STEP_S = 0.05


def aftercare_s() -> float:
    """How long the notes are watched after a change made on notes someone had emptied
    or held open for writing, for that writer's save (issue 46): 4 times the notes' wait
    (``LNKMEM_NOTES_WAIT_S``, :func:`lnkmem.memory.notes.wait_s`), at least a minute."""
    return max(60.0, 4 * knobs().notes_wait_s)


class WatchedNotes(Protocol):
    """What the aftercare uses of the notes (:class:`lnkmem.memory.notes.LocalNotes`)."""

    path: str
    folder: str
    state: str
    dir_fd: Optional[int]

    def lstat(self) -> Optional[os.stat_result]: ...

    def read_with_stat(self) -> tuple[str, Optional[os.stat_result]]: ...

    def cut_short(self, data: bytes, st: Optional[os.stat_result]) -> bool: ...

    def read_held(self, fd: int) -> Optional[bytes]: ...

    def keep_quietly(self, data: bytes, why: str) -> bool: ...

    def rewrite(self, make: Callable[[str], Change], why: str) -> Change: ...


@dataclass
class Watch:
    """One change's watch."""

    base: bytes  # what the change read (and replaced)
    ours: bytes  # what it wrote
    old_fd: Optional[int]  # the file replaced, watched for a save into it
    old_name: Optional[str]  # its name beside the notes meanwhile
    name_ident: Optional[tuple]  # the notes as last looked at (for a save over them by name)
    until: float
    name_until: float  # 0: the notes themselves are not watched
    old_ident: tuple = ()
    old_last: tuple = ((), 0.0)


class Aftercare:
    """The watches of one notes file, looked at by one thread while there are any."""

    def __init__(self, notes: WatchedNotes):
        self.notes = notes
        self._watches: list[Watch] = []
        self._mu = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def watch(self, base: bytes, ours: bytes, fd: Optional[int], old_name: Optional[str], name: bool) -> None:
        """Watch, for a while after a change, for the save of a writer that had emptied or
        held the notes when the change replaced them:

        - the file replaced (``fd``, kept under ``old_name`` beside the notes): once its
          writer has closed it (where leases work; else once it is quiet), what it saved
          there is kept in the history and its lines are merged into the notes;
        - with ``name``, the notes themselves: the first save over them that drops what
          the change did (an editor saving by name, over the change) gets the change
          merged back in.

        The watch ends after :func:`aftercare_s` (the old file, once nobody holds it
        open for writing, at most :data:`HELD_MAX_S`); a kill leaves the old file under
        its temporary name, kept at the next start
        (:meth:`lnkmem.memory.notes.LocalNotes.clean_temp`)."""
        now = time.monotonic()
        w = Watch(base, ours, os.dup(fd) if fd is not None else None, old_name, None, now + aftercare_s(),
                  now + aftercare_s() if name else 0.0)
        if w.old_fd is not None:
            w.old_ident = identity(os.fstat(w.old_fd))
            w.old_last = (w.old_ident, now)
        s = self.notes.lstat()
        w.name_ident = identity(s) if s is not None else None
        with self._mu:
            self._watches.append(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="lnkmem-notes-aftercare", daemon=True)
                self._thread.start()

    def rebase(self, written: bytes) -> None:
        """After each change of this engine: what the notes watches hold as the change is
        what was written last (a later change of the agent's, a removal say, is no save
        to undo), and the notes as written now are not someone else's save."""
        with self._mu:
            if not self._watches:
                return
            s = self.notes.lstat()
            for w in self._watches:
                if w.name_until:
                    w.ours = written
                    w.name_ident = identity(s) if s is not None else None

    def _loop(self) -> None:
        while True:
            with self._mu:
                ws = list(self._watches)
                if not ws:
                    self._thread = None
                    return
            for w in ws:
                try:
                    done = self._look(w)
                except Exception as e:  # never the end of the engine: the texts are in the history
                    log.warning("after a change of %s: %s", self.notes.path, e)
                    done = True
                if done:
                    try:
                        self._unwatch(w)
                    except OSError:
                        pass
                    with self._mu:
                        self._watches.remove(w)
            time.sleep(WATCH_STEP_S)

    def _unwatch(self, w: Watch) -> None:
        if w.old_fd is not None:
            if w.old_name is not None:
                named = self._lstat_name(w.old_name)
                held = os.fstat(w.old_fd)
                if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                    try:
                        os.unlink(w.old_name, dir_fd=self.notes.dir_fd)
                    except OSError:
                        pass
            os.close(w.old_fd)
            w.old_fd = None

    def _lstat_name(self, name: str) -> Optional[os.stat_result]:
        try:
            return os.stat(name, dir_fd=self.notes.dir_fd, follow_symlinks=False)
        except OSError:
            return None

    def _look(self, w: Watch) -> bool:
        """One look at a watch; True when it is over."""
        now = time.monotonic()
        if w.old_fd is not None:
            cur = identity(os.fstat(w.old_fd))
            if cur != w.old_last[0]:
                w.old_last = (cur, now)
            holds = leases.writer_holds(w.old_fd)
            quiet = now - w.old_last[1] >= LATE_QUIET_S
            if holds is False:  # its writer closed it: what it saved there is kept and merged, once
                if cur != w.old_ident:
                    self._late_save(w)
                self._unwatch(w)
            elif holds is None and quiet and cur != w.old_ident:  # no leases: each quiet save merged
                self._late_save(w)
                w.old_ident = cur
            elif now > w.until + (HELD_MAX_S if holds else 0):
                if holds:  # held open past all patience: left under its name, kept at the next start
                    log.warning("%s is still held open for writing since it was replaced; it stays as %s",
                                self.notes.path, os.path.join(self.notes.folder, w.old_name or "?"))
                    os.close(w.old_fd)
                    w.old_fd = None
                else:
                    self._unwatch(w)
        if w.name_until and now > w.name_until:
            w.name_until = 0.0
        if w.name_until:
            s = self.notes.lstat()
            ident = identity(s) if s is not None else None
            if ident is not None and ident != w.name_ident:
                current, st = self.notes.read_with_stat()
                if (st is not None and not self.notes.cut_short(current.encode("utf-8"), st)
                        and _stable_since(st)):
                    w.name_ident = identity(st)
                    base = w.base.decode("utf-8", "replace")
                    if notesrules.merge(base, w.ours.decode("utf-8", "replace"), current) != current:
                        # saved over, dropping the change: merged back (as the change is when the lock is
                        # held: a change of the agent's own since is no save to undo)
                        self._carry(lambda cur: notesrules.merge(base, w.ours.decode("utf-8", "replace"), cur),
                                    "the change was saved over")
                        w.name_until = 0.0
        return w.old_fd is None and not w.name_until

    def _late_save(self, w: Watch) -> None:
        data = self.notes.read_held(w.old_fd)
        if not data or data == w.base:
            return
        self.notes.keep_quietly(data, "late")
        base, theirs = w.base.decode("utf-8", "replace"), data.decode("utf-8", "replace")
        self._carry(lambda cur: notesrules.merge(base, cur, theirs), "saved into the file it replaced")

    def _carry(self, merged: Callable[[str], str], what: str) -> None:
        """Make the notes ``merged(current)`` (a change like `remember`'s), and say so in the log."""
        news = []

        def make(current: str) -> Change:
            t = merged(current)
            news.append(t != current)
            return Change(t, len(t.encode("utf-8")), count_entries(t))
        try:
            change = self.notes.rewrite(make, "replaced")
        except (ToolError, OSError) as e:
            log.warning("%s: a save after a change (%s) could not be merged in (%s); it is kept in %s",
                        self.notes.path, what, e, os.path.join(self.notes.state, "notes-history"))
            return
        if news and news[-1]:
            log.warning("%s: a save after a change (%s) was merged in; the notes hold %d entries",
                        self.notes.path, what, change.entries)


def _stable_since(st: os.stat_result) -> bool:
    return time.time_ns() - st.st_mtime_ns >= int(LATE_QUIET_S * 1e9)
