"""The agent's notes file and `remember` (§2.2, §4.4).

A change is read-change-write under a lock, re-reading the file first and
checking just before the replace that nobody changed it meanwhile, then an
atomic rename of a temporary file written in the notes' own folder (§2.2
rev. 2: ``<state>`` may be another mount). Nothing of the notes is ever lost: a refused change changes nothing.

One concern, a local notes file kept whole against editors that write it meanwhile (the
read and the change); the watch for a late writer's save after a change is
:mod:`notesaftercare`', what a change does to the text :mod:`notesrules`', the kernel's
word on writers :mod:`leases`', the notes of a bound agent :mod:`bridgenotes`'.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import sys
import secrets
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from lnkmem.core import atomic
from lnkmem.core.atomic import identity
from lnkmem.core.errors import ToolError
from lnkmem.core.knobs import knobs
from lnkmem.memory import leases, notesrules
from lnkmem.memory.notesaftercare import Aftercare, aftercare_s
from lnkmem.memory.notesrules import Change, apply, count_entries

log = logging.getLogger("lnkmem")


NOTES_MAX = 4 << 20  # a notes file larger than this is never read whole (§2.2)
TMP_PREFIX = ".notes.md.lnkmem-"
SETTLE_NS = 30_000_000  # a file changed more recently than this may be mid-write: read it again later
STABLE_TRIES = 200
LATE_WRITER_S = 0.05  # after a replace, how long the old file is watched for a writer that had it open
CHANGE_PATIENCE_S = 15.0  # how long `remember` keeps trying while someone else keeps writing
BUSY_S = 1.0  # a read for the index: a file held open for writing longer than this is judged by its times
SHORTER = 2  # a file that lost more than half its bytes ...
LOCK = "notes.lock"  # in <state>: one change of the notes at a time, among all engines of the agent


def wait_s() -> float:
    """How long `remember` waits for a notes file held open for writing to be closed,
    and for an emptied or much shorter one to be written (``LNKMEM_NOTES_WAIT_S``, 15 s)."""
    return knobs().notes_wait_s


class LocalNotes:
    """The notes file on this machine.

    Its folder and ``<state>`` are opened once (below the agent folder, one
    component at a time, never through a link: :func:`lnkmem.memory.config.open_folder`)
    and every later step works beside those descriptors, so a folder swapped for
    a link afterwards changes nothing.

    Read with care (§2.2 rev. 2): never through a symbolic link, never more
    than :data:`NOTES_MAX` bytes, and only once the file is stable (the same
    identity, size and times before and after the read, and not changed in the
    last few milliseconds, so a file caught between an editor's truncate and
    its write is read again). Replaced through a temporary file in the notes'
    own folder (Link's sandbox mounts ``<state>`` and that folder separately,
    so a rename from ``<state>`` fails with EXDEV), re-checked just before the
    rename; a writer that still had the old file open when it was replaced has
    its edit carried over to the new one.

    Nothing lost by design (§2.2 rev. 3): the text a change replaces, and the
    text it writes, are kept in ``<state>`` (:mod:`lnkmem.memory.noteshistory`); a
    change waits (:func:`wait_s`) for a file someone holds open for writing to
    be closed, and for an emptied or much shorter file that changed within that
    time to be written; the rename is an exchange, so a file renamed over the
    notes between the re-check and the replace is read, kept and merged.
    """

    local = True  # a file on this machine (watched)

    def __init__(self, path: str, state: str, agent: Optional[str] = None, create: bool = True,
                 state_fd: Optional[int] = None):
        from lnkmem.memory.config import open_folder
        self.path = path
        self.state = state
        self.agent = agent
        self.folder = os.path.dirname(path) or "."
        self.name = os.path.basename(path)
        self.tmp_prefix = f".{self.name}.lnkmem-"
        self.dir_fd = open_folder(self.folder, agent, create=create, mode=0o777)  # FolderRefused
        self._state_fd = state_fd
        self._history = None
        self._last_seen: Optional[bytes] = None  # the last text read that was not cut short
        self._last_seen_at = 0.0
        self.aftercare = Aftercare(self)  # a late writer's save watched for, after a change (issue 46)
        self.clean_temp()

    # --- the folders ---------------------------------------------------------------

    def state_fd(self) -> int:
        from lnkmem.memory.config import open_folder
        if self._state_fd is None:
            self._state_fd = open_folder(self.state, self.agent, create=True, mode=0o700)
        return self._state_fd

    def history(self):
        from lnkmem.memory.noteshistory import History
        if self._history is None:
            self._history = History(self.state_fd(), where=self.state)
        return self._history

    def lstat(self) -> Optional[os.stat_result]:
        if self.dir_fd is None:
            return None
        try:
            return os.stat(self.name, dir_fd=self.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def clean_temp(self) -> int:
        """Remove temporary files a killed engine left in the notes' folder (not one
        that another engine of this agent is writing now: under the lock, or not at all)."""
        if self.dir_fd is None:
            return 0
        try:
            names = [x for x in os.listdir(self.dir_fd) if x.startswith(self.tmp_prefix)]
        except OSError:
            return 0
        if not names:
            return 0
        try:
            lock = self._lock(block=False)
        except OSError:
            return 0
        if lock is None:
            return 0
        try:
            return self._clean(names)
        finally:
            os.close(lock)

    def _clean(self, names: list[str]) -> int:
        """Each temp file is kept as a version first: a kill right after an exchange
        leaves the text it replaced under the temp name (§2.2 rev. 3)."""
        n = 0
        for name in names:
            if name.startswith(self.tmp_prefix):
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.dir_fd)
                except OSError:
                    continue
                try:
                    s = os.fstat(fd)
                    if not stat.S_ISREG(s.st_mode):
                        continue
                    data = self._read_fd(fd) if s.st_size <= NOTES_MAX else b""
                    if data:
                        self._keep(data, "replaced", source=name)
                    self._unlink(name)
                    n += 1
                except OSError:
                    pass
                finally:
                    os.close(fd)
        return n

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = self._lock(block=True)
        try:
            yield
        finally:
            os.close(fd)

    def _lock(self, block: bool) -> Optional[int]:
        """A descriptor holding the notes lock: a plain file ``<state>/notes.lock``, never
        reached through a link. Anything else standing there (a folder, a FIFO, a link: a
        confused person or tool) is moved aside as it is, with a line in the log, and the
        file made anew: the next change works without a restart. The file locked is still
        the one at that name once held (else it is taken again). None when ``block`` is
        false and another holds it."""
        from lnkmem.memory.noteshistory import lstat_at, move_aside
        sfd = self.state_fd()
        where = os.path.join(self.state, LOCK)
        for _ in range(10):
            named = lstat_at(sfd, LOCK)
            if named is not None and not stat.S_ISREG(named.st_mode):  # never opened: a FIFO, a device
                move_aside(sfd, LOCK, where, "the notes lock file")
                continue
            try:
                fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                             0o600, dir_fd=sfd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENOTDIR):  # changed shape meanwhile
                    continue
                raise
            try:
                held = os.fstat(fd)
                if stat.S_ISREG(held.st_mode):
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | (0 if block else fcntl.LOCK_NB))
                    except BlockingIOError:
                        os.close(fd)
                        return None
                    named = lstat_at(sfd, LOCK)
                    if named is not None and (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
                        return fd
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)  # not a file, or moved aside or replaced while we waited: take the one there now
        raise OSError(errno.EAGAIN, "the notes lock kept changing shape", where)

    # --- reading ---------------------------------------------------------------

    def _open(self) -> Optional[int]:
        """A descriptor on the notes file itself (never a link's target); None when missing."""
        if self.dir_fd is None:
            return None
        try:
            fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
                         dir_fd=self.dir_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ToolError(f"the notes file {self.path} is a symbolic link; it is not followed "
                                f"(make it a plain file); nothing was changed") from None
            raise
        s = os.fstat(fd)
        if not stat.S_ISREG(s.st_mode):
            os.close(fd)
            raise ToolError(f"the notes file {self.path} is not a plain file; nothing was changed")
        if s.st_size > NOTES_MAX:
            os.close(fd)
            raise ToolError(f"the notes file {self.path} holds {s.st_size} bytes, over the {NOTES_MAX} bytes "
                            f"that are ever read; shorten it by hand; nothing was changed")
        return fd

    @staticmethod
    def _read_fd(fd: int) -> bytes:
        os.lseek(fd, 0, os.SEEK_SET)
        chunks, left = [], NOTES_MAX + 1
        while left > 0:
            b = os.read(fd, min(left, 1 << 20))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)

    def read_held(self, fd: int) -> Optional[bytes]:
        """What an open descriptor of a notes file holds now (the file replaced, watched by
        the aftercare); None where it is no longer a plain file or over :data:`NOTES_MAX`."""
        s = os.fstat(fd)
        if not stat.S_ISREG(s.st_mode) or s.st_size > NOTES_MAX:
            return None
        return self._read_fd(fd)

    def _stable(self, hold: bool = False, writers_s: float = BUSY_S
                ) -> tuple[bytes, Optional[os.stat_result], Optional[int], bool]:
        """(content, its stat, an open descriptor on it, leased) once the file is
        not being written; (b"", None, None, False) when there is none.

        Stable means: the same identity, size and times before and after the
        read, the file still under its name and, where leases work, nobody
        holding it open for writing during the read (an editor between its
        truncate and its write: waited for until it closes, at most
        ``writers_s``); elsewhere, not changed in the last few milliseconds.
        With ``hold`` the lease is kept (the caller drops it); the caller
        closes the descriptor."""
        use_lease = leases.usable()
        deadline = time.monotonic() + CHANGE_PATIENCE_S + writers_s
        busy_since = None
        while True:
            fd = self._open()
            if fd is None:
                return b"", None, None, False
            keep = leased = False
            try:
                if use_lease:
                    got = leases.try_lease(fd)
                    if got == "busy":  # open for writing right now: read it once it is closed
                        busy_since = busy_since or time.monotonic()
                        if time.monotonic() - busy_since > writers_s:  # held open that long: judge by times
                            use_lease = False
                        continue
                    leased = got == "ok"
                before = os.fstat(fd)
                data = self._read_fd(fd)
                after = os.fstat(fd)
                named = self.lstat()
                if len(data) > NOTES_MAX:
                    raise ToolError(f"the notes file {self.path} grew over the {NOTES_MAX} bytes that are "
                                    f"ever read; nothing was changed")
                quiet = leased or time.time_ns() - after.st_mtime_ns >= SETTLE_NS
                if (identity(before) == identity(after) and len(data) == after.st_size and quiet
                        and (not leased or leases.held(fd) == fcntl.F_RDLCK)
                        and named is not None and (named.st_dev, named.st_ino) == (after.st_dev, after.st_ino)):
                    keep = True
                    if leased and not hold:
                        leases.drop(fd)
                    return data, after, fd, leased and hold
            finally:
                if not keep:
                    if leased:
                        leases.drop(fd)
                    os.close(fd)
                    if time.monotonic() > deadline:
                        raise ToolError("the notes kept changing while they were read; nothing was changed, "
                                        "try again")
                    time.sleep(0.002 if busy_since is None else 0.01)

    def cut_short(self, data: bytes, st: Optional[os.stat_result]) -> bool:
        """Whether the notes look like a write in progress: gone, empty or much shorter
        than the last text seen, and changed within :func:`wait_s` (§2.2 rev. 3)."""
        ref = self._last_seen
        if not ref:
            return False
        if st is None:  # gone: an editor that deletes, then writes
            return time.monotonic() - self._last_seen_at < wait_s()
        if data and len(data) * SHORTER >= len(ref):
            return False
        return time.time() - st.st_mtime < wait_s()

    def _seen(self, data: bytes, st: Optional[os.stat_result]) -> None:
        if st is not None and not self.cut_short(data, st):
            self._last_seen, self._last_seen_at = data, time.monotonic()

    def read_with_stat(self) -> tuple[str, Optional[os.stat_result]]:
        """The notes once stable, and their stat (None: there are none)."""
        data, st, fd, _ = self._stable()
        if fd is not None:
            os.close(fd)
        self._seen(data, st)
        return data.decode("utf-8", "replace"), st

    def _mode(self, st: Optional[os.stat_result]) -> int:
        if st is not None:
            return st.st_mode & 0o777
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask

    def read(self) -> str:
        return self.read_with_stat()[0]

    def entry(self):
        """The notes as an index entry; None when missing, a link, or too large (not indexed)."""
        from lnkmem.bridges.local_entry import LocalEntry, version_of
        st = self.lstat()
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size > NOTES_MAX:
            return None
        return LocalEntry("", st.st_size, version_of(st))

    def read_bytes(self) -> tuple[bytes, str]:
        from lnkmem.bridges.local import version_of
        from lnkmem.bridges.place import Forbidden, NotFound
        try:
            data, st, fd, _ = self._stable()
        except ToolError as e:
            raise Forbidden(str(e).replace("; nothing was changed", "")) from None
        if fd is None:
            raise NotFound("notes")
        os.close(fd)
        self._seen(data, st)
        return data, version_of(st)

    # --- changing --------------------------------------------------------------

    def change(self, add: Optional[str], remove: Optional[str], limit: int) -> Change:
        try:
            return self.rewrite(lambda current: apply(current, add, remove, limit), "replaced")
        except OSError as e:  # a full disk, a read-only folder
            raise ToolError(f"the notes could not be written: {e.strerror or e}; nothing was changed") from None

    def restore(self, text: bytes) -> Change:
        """Make the notes ``text`` (a kept version), keeping the text this replaces."""
        t = text.decode("utf-8", "replace")
        return self.rewrite(lambda current: Change(t, len(t.encode("utf-8")), count_entries(t)), "restored")

    def _write_temp(self, text: str, mode: int) -> str:
        for _ in range(100):
            tmp = self.tmp_prefix + secrets.token_hex(6)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=self.dir_fd)
                break
            except FileExistsError:
                continue
        else:
            raise FileExistsError(errno.EEXIST, "no free temporary name", self.folder)
        try:
            os.fchmod(fd, mode)
            view = memoryview(text.encode("utf-8"))
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            self._unlink(tmp)
            raise
        os.close(fd)
        return tmp

    def _unlink(self, name: str) -> None:
        try:
            os.unlink(name, dir_fd=self.dir_fd)
        except OSError:
            pass

    def _unchanged(self, fd: Optional[int], st: Optional[os.stat_result], base: bytes, leased: bool) -> bool:
        """Whether the notes are still exactly what was read (identity, size, times, content)."""
        if leased and leases.held(fd) != fcntl.F_RDLCK:  # someone is opening it for writing
            return False
        now = self.lstat()
        if now is None:
            return fd is None
        if fd is None:
            return False
        if identity(now) != identity(st) or identity(os.fstat(fd)) != identity(st):
            return False
        return self._read_fd(fd) == base

    def _replace(self, tmp: str, fd: int, st: os.stat_result, base: bytes, leased: bool, why: str,
                 keep_old: bool = False) -> tuple[bool, Optional[bytes], Optional[str]]:
        """Put ``tmp`` in the notes' place, keeping the text it replaces (§2.2 rev. 3):
        (False, None) when someone wrote meanwhile (start over; ``tmp`` not used), else
        (True, what was replaced when it is not what was read, for the caller to merge).

        The file is re-checked first (identity, size, times, content, the lease).
        With an exchange (renameat2), the file it swaps out is what was replaced,
        whoever put it there in the moment since the re-check: it is kept, then
        removed. Without one (the filesystem), the text read is kept and a rename
        replaces.

        With ``keep_old`` (someone may still write into the file replaced: it was held
        open for writing, or emptied lately) that file keeps a temporary name beside
        the notes, returned third, for the aftercare to watch (:mod:`notesaftercare`)."""
        if not self._unchanged(fd, st, base, leased):  # (a lease broken: someone opening it for writing)
            return False, None, None
        if not atomic.exchange(tmp, self.name, dir_fd=self.dir_fd):
            old_name = None
            if keep_old:
                old_name = self.tmp_prefix + secrets.token_hex(6)
                try:
                    os.link(self.name, old_name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd, follow_symlinks=False)
                except OSError:
                    old_name = None
            os.rename(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)  # ``base``: kept already
            return True, None, old_name
        try:  # from here on the notes are changed: nothing below refuses the change
            return (True,) + self._swapped_out(tmp, st, base, why, keep_old)
        except OSError as e:
            log.warning("the text a change of %s swapped out could not be read (%s); it stays in %s",
                        self.path, e.strerror or e, os.path.join(self.folder, tmp))
            return True, None, None

    def _swapped_out(self, tmp: str, st: os.stat_result, base: bytes, why: str, keep_old: bool
                     ) -> tuple[Optional[bytes], Optional[str]]:
        """The file an exchange swapped out of the notes' name (now named ``tmp``): (None, ...)
        when it is what was read (kept already), else its text, kept (moved or copied in)
        before its last name goes; where it cannot be kept it stays at ``tmp`` (kept at the
        next start, :meth:`clean_temp`). Second: ``tmp`` where the file read stays there
        (``keep_old``), else None."""
        try:
            out_fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except OSError:  # a link put there meanwhile: never notes
            self._unlink(tmp)
            return None, None
        try:
            out = os.fstat(out_fd)
            if not stat.S_ISREG(out.st_mode) or out.st_size > NOTES_MAX:
                self._unlink(tmp)
                return None, None
            data = self._read_fd(out_fd)
        finally:
            os.close(out_fd)
        if (out.st_dev, out.st_ino) == (st.st_dev, st.st_ino) and data == base:
            if keep_old:
                return None, tmp
            self._unlink(tmp)
            return None, None
        if data and not self.keep_quietly(data, why, source=tmp):
            return data, None
        self._unlink(tmp)
        return data, None

    def _keep(self, data: bytes, why: str, sync: bool = True, source: Optional[str] = None) -> None:
        self.history().keep(data, why, sync, (self.dir_fd, source) if source else None)

    def keep_quietly(self, data: bytes, why: str, sync: bool = True, source: Optional[str] = None) -> bool:
        """:meth:`_keep` once the notes are changed already: a failure is a line in the log,
        never a refusal of a change that was made (whether it was kept)."""
        try:
            self._keep(data, why, sync, source)
            return True
        except OSError as e:
            log.warning("a version of %s could not be kept in %s (%s)", self.path,
                        os.path.join(self.state, "notes-history"), e.strerror or e)
            return False

    def rewrite(self, make, why: str) -> Change:
        """Make the notes ``make(current).text`` under the lock, keeping what it replaces
        (``why``): what `remember`, a restore and the aftercare's merges do."""
        with self._locked():
            result: Optional[Change] = None
            carry: Optional[tuple[bytes, bytes, bytes]] = None  # (base, what another writer made of it, ours)
            patience = wait_s()
            deadline = time.monotonic() + CHANGE_PATIENCE_S + 2 * patience
            while time.monotonic() < deadline:
                data, st, fd, leased = self._stable(hold=True, writers_s=patience)
                try:
                    if self.cut_short(data, st):  # an editor between its truncate and its write: wait
                        if leased:
                            leases.drop(fd)
                        time.sleep(0.02)
                        continue
                    suspect = False  # emptied or cut short lately: its writer may save later (issue 46)
                    if self._last_seen and (st is None or not data or len(data) * SHORTER < len(self._last_seen)):
                        self._keep(self._last_seen, "seen")  # cut short long enough: the text before it, kept
                        suspect = True
                    elif st is not None and not data and time.time() - st.st_mtime < aftercare_s():
                        # emptied lately, before this engine saw what it held: its writer may
                        # still save (judged over the watch's span, not the wait's: a start
                        # slowed by a busy machine is no sign the emptying was meant)
                        suspect = True
                    current = data.decode("utf-8", "replace")
                    if carry is None:
                        result = make(current)
                        text = result.text
                        if text == current and fd is not None:  # nothing to change (a merge with nothing new)
                            if leased:
                                leases.drop(fd)
                            return result
                    else:  # carry the other writer's edit over, and ours where it was saved over since
                        base, theirs, ours = (x.decode("utf-8", "replace") for x in carry)
                        text = notesrules.merge(base, ours, notesrules.merge(base, theirs, current))
                        if text == current:
                            if leased:
                                leases.drop(fd)
                            self.keep_quietly(data, "written")
                            return result
                    if data:  # the history first: where the text replaced cannot be kept, nothing changes
                        self._keep(data, why)
                    held = None if fd is None else False if leased else leases.writer_holds(fd)
                    keep_old = held is True or (held is None and suspect and fd is not None)
                    tmp = self._write_temp(text, self._mode(st))
                    swapped = old_name = None
                    try:
                        if fd is None:
                            os.link(tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd,
                                    follow_symlinks=False)  # create only: a file made meanwhile is never replaced
                        else:
                            done, swapped, old_name = self._replace(tmp, fd, st, data, leased, why, keep_old)
                            if not done:  # someone wrote meanwhile: start over
                                if leased:
                                    leases.drop(fd)
                                continue
                            tmp = None
                    except BaseException:
                        if leased:
                            leases.drop(fd)
                        if isinstance(sys.exc_info()[1], (FileExistsError, FileNotFoundError)):
                            continue  # made or removed meanwhile: start over
                        raise
                    finally:
                        if tmp:
                            self._unlink(tmp)
                    try:  # changed: nothing below refuses it
                        os.fsync(self.dir_fd)
                    except OSError:
                        pass
                    written = text.encode("utf-8")
                    self._last_seen, self._last_seen_at = written, time.monotonic()
                    self.keep_quietly(written, "written", sync=False)  # an editor saving over it later loses nothing
                    self.aftercare.rebase(written)
                    if old_name is not None or suspect:  # its writer may save later: watched (issue 46)
                        self.aftercare.watch(data, written, fd if old_name is not None else None, old_name, suspect)
                    if swapped is not None:  # a file renamed over the notes after the read: kept, merged
                        if leased:
                            leases.drop(fd)
                        carry = (data, swapped, written)
                        continue
                    late = self._late_writer(fd, st, data, leased) if fd is not None and old_name is None else None
                    if late is None:
                        if carry is not None:
                            result = Change(text, len(written), count_entries(text))
                        return result
                    carry = (data, late, written)
                finally:
                    if fd is not None:
                        os.close(fd)
            if carry is not None:  # ours landed, then another writer saved over it: say what is there now
                raise self._saved_over(carry)
            raise ToolError("the notes kept changing under us; nothing was changed, try again")

    def _saved_over(self, carry: tuple[bytes, bytes, bytes]) -> ToolError:
        """The error of a change that was written, then saved over until the change gave up:
        whether the notes hold it now (another writer may have saved it again), never
        "nothing was changed"."""
        base, _, ours = (x.decode("utf-8", "replace") for x in carry)
        try:
            data, _, fd, _ = self._stable()
            if fd is not None:
                os.close(fd)
            current = data.decode("utf-8", "replace")
            held = notesrules.merge(base, ours, current) == current
        except ToolError:
            held = None
        now = {True: "the notes hold it now", False: "the notes do not hold it now",
               None: "the notes could not be read again to tell whether they hold it"}[held]
        return ToolError("the notes kept changing under us: your change was written, then saved over by "
                         f"another writer ({now}; every version is kept: `lnk-lnkmem notes-history`); "
                         "read the notes before trying again")

    def _late_writer(self, fd: int, st: os.stat_result, base: bytes, leased: bool) -> Optional[bytes]:
        """After the replace: what a writer that had the old file open wrote to it (None: nothing).

        With a lease (taken before the re-check) this is exact: a writer opening
        the old file breaks it, and the lease can be taken again only once no
        one holds the old file open for writing. Without one, the old file is
        watched until it has been quiet for a moment."""
        if leased:
            if leases.held(fd) == fcntl.F_RDLCK:
                leases.drop(fd)
                return None
            leases.drop(fd)  # let the writer go on, into the old file; wait until it is done
            deadline = time.monotonic() + 10
            while not leases.take(fd) and time.monotonic() < deadline:
                time.sleep(0.002)
            leases.drop(fd)
        else:
            deadline = time.monotonic() + LATE_WRITER_S
            last = identity(os.fstat(fd))
            while True:
                time.sleep(0.004)
                cur = identity(os.fstat(fd))
                if cur != last:  # still being written: wait until it is quiet
                    last = cur
                    deadline = time.monotonic() + LATE_WRITER_S
                    continue
                if time.monotonic() >= deadline:
                    break
        if identity(os.fstat(fd)) == identity(st):
            return None
        data = self._read_fd(fd)
        return None if data == base else data
