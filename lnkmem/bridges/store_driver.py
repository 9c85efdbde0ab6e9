"""Conversations kept by a store driver (§3.5, contract revision 3).

Link's seed names the clause ("Link Memory makes its own copy of such a
conversation, and of a compact one, for its search") but not the driver's
interface; the contract defines one, and this module is the only place that
knows it, so that only this module changes when Link publishes the real one.

The source is one conversation place beside the agent's local `chats/` folder
and the storage bridge's `conversations` collection:

- :func:`run` calls the driver as a harness does: the program itself (no
  shell), standard input empty and closed to it, the engine's environment plus
  the agent's names (`LNK_AGENT`, `LNK_AGENT_ID`, `LNK_OWNER`, where it has
  them), at most :data:`TIMEOUT_S` and :data:`MAX_OUTPUT` bytes of standard
  output a call (its process group killed past either); exit 0 is success,
  anything else a failure whose reason is the last line of standard error.
- :class:`CopyFolder` is the engine's own copy, `<state>/conversations/`:
  `<thread>.jsonl` and `<thread>.compact.jsonl`, named by thread only (an ID,
  checked: the driver's output never names a path the engine opens), written
  through a temporary dot-file and a rename beside them, with the versions
  they are of in `.versions.json`.
- :class:`DriverConversations` is the place the index reads (the copy, through
  a :class:`~lnkmem.bridges.local.LocalPlace`) and the loop that keeps the copy:
  a listing at start, every `LNKMEM_DRIVER_S` (30 s) and at a `changed`
  control naming `chats/...`; a conversation fetched again only when its
  listed version changes, a thread no longer listed dropped. A listing or a
  fetch that fails leaves every copy as it was and says why
  (`status()`: ``"unavailable: <why>"``, ``"refreshing"`` while one is under
  way); the next interval tries again.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import selectors
import signal
import stat
import subprocess
import threading
import time
from typing import Callable, Mapping, NamedTuple, Optional

from lnkmem.bridges.local import LocalPlace
from lnkmem.bridges.place import Entry, PlaceBase
from lnkmem.core import atomic, ownenv
from lnkmem.core.knobs import knobs

log = logging.getLogger("lnkmem")

TIMEOUT_S = 30.0  # a call's time (§3.5)
MAX_OUTPUT = 64 * 1024 * 1024  # a call's standard output (§3.5)
INTERVAL_S = 30.0  # LNKMEM_DRIVER_S: a listing this often while serving
INDEX_WAIT_S = 60.0  # a refresh waits this long at most for its copies to be indexed
TELL_EVERY_S = 2.0  # a long refresh has the copies made so far indexed this often
MAX_VERSION = 1024  # characters of an opaque version
ERR_KEPT = 8192  # the tail of standard error kept, for its last line
NAMES = ("LNK_AGENT", "LNK_AGENT_ID", "LNK_OWNER")  # the agent's names, given to the driver
VERSIONS = ".versions.json"  # hidden: never listed as a conversation
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
COMPACT = ".compact"


class DriverFailed(Exception):
    """The driver could not answer: why, in a line (no secret: its own stderr)."""


def interval() -> float:
    v = knobs().driver_s
    return INTERVAL_S if v is None else v


def timeout() -> float:
    """A call's limit; LNKMEM_DRIVER_TIMEOUT_S lowers it for tests."""
    v = knobs().driver_timeout_s
    return TIMEOUT_S if v is None else v


def driver_env(agent_env: Mapping[str, str], owner: str = "") -> dict[str, str]:
    """The engine's own environment plus the agent's names where it has them (its
    environment for `serve`, its `Agents` env in `serve-many`); another agent's
    names, inherited by a shared engine, are never passed on; nor what the engine set for
    its own processes (:func:`ownenv.for_others`)."""
    env = {k: v for k, v in ownenv.for_others().items() if k not in NAMES}
    for k in NAMES:
        v = agent_env.get(k)
        if isinstance(v, str) and v:
            env[k] = v
    if owner and "LNK_OWNER" not in env:  # a bound agent's owner is the Bound line's
        env["LNK_OWNER"] = owner
    return env


def _last_line(err: bytes) -> str:
    lines = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    if not lines:
        return ""
    line = "".join(c if c.isprintable() else "?" for c in lines[-1])
    return line if len(line) <= 300 else line[:300] + "…"


def run(program: str, args: list[str], env: Mapping[str, str], limit_s: Optional[float] = None,
        max_output: int = MAX_OUTPUT, running: Optional[Callable[[Optional[subprocess.Popen]], None]] = None) -> bytes:
    """The driver's standard output for one call; DriverFailed saying why not.
    ``running`` is told of the process while it runs (and of None after), so
    that an engine that stops can end a call under way."""
    limit_s = timeout() if limit_s is None else limit_s
    what = " ".join([os.path.basename(program)] + args[:1])
    try:
        proc = subprocess.Popen([program, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(env), close_fds=True, shell=False,
                                start_new_session=True)  # its own group: killed whole past a limit
    except OSError as e:
        raise DriverFailed(f"cannot run the store driver {program}: {e.strerror or e}") from None
    if running is not None:
        running(proc)
    out, err = bytearray(), bytearray()
    why = None
    deadline = time.monotonic() + limit_s
    sel = selectors.DefaultSelector()
    try:
        for f in (proc.stdout, proc.stderr):
            os.set_blocking(f.fileno(), False)
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map() and why is None:
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"`{what}` took longer than {limit_s:g}s"
                break
            for key, _ in sel.select(min(left, 1.0)):
                try:
                    chunk = os.read(key.fileobj.fileno(), 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    out += chunk
                    if len(out) > max_output:
                        why = f"`{what}` printed more than {max_output >> 20} MiB"
                        break
                else:
                    err += chunk
                    del err[:-ERR_KEPT]
        if why is None:
            try:
                code = proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                why = f"`{what}` took longer than {limit_s:g}s"
    finally:
        sel.close()
        if why is not None or proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        if running is not None:
            running(None)
    if why is not None:
        raise DriverFailed(why)
    if code != 0:
        reason = _last_line(bytes(err))
        raise DriverFailed(f"`{what}` failed (exit {code})" + (f": {reason}" if reason else ""))
    return bytes(out)


class Listed(NamedTuple):
    version: str
    compact: Optional[str]


def nameable(thread: object) -> bool:
    """A thread the copy can be named by: an ID (§Words; `x.compact` is one too: its copy
    is `x.compact.jsonl`, which is also `x`'s compact copy's name -- :func:`parse_listing`
    keeps the two apart)."""
    return isinstance(thread, str) and ID_RE.match(thread) is not None


def json_lines(out: bytes, what: str):
    """(line number, object) of each non-blank line of a driver's JSONL answer;
    DriverFailed naming ``what`` and the line when one is not a JSON object."""
    for n, raw in enumerate(out.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            raise DriverFailed(f"{what} line {n} is not JSON") from None
        if not isinstance(obj, dict):
            raise DriverFailed(f"{what} line {n} is not an object")
        yield n, obj


def parse_listing(out: bytes) -> tuple[dict[str, Listed], list[str]]:
    """`conversations`' answer: {thread: Listed} and the threads skipped (not IDs).
    A line that is not `{"thread", "version", "compact"?}` makes the whole
    listing untrustworthy: DriverFailed (nothing is dropped on its word)."""
    listed: dict[str, Listed] = {}
    skipped: list[str] = []
    for n, obj in json_lines(out, "`conversations`"):
        thread, version, compact = obj.get("thread"), obj.get("version"), obj.get("compact")
        if not isinstance(thread, str):
            raise DriverFailed(f"`conversations` line {n}: thread is not a string")
        for key, v, need in (("version", version, True), ("compact", compact, False)):
            if (v is None and need) or (v is not None and (not isinstance(v, str) or len(v) > MAX_VERSION)):
                raise DriverFailed(f"`conversations` line {n}: {key} is not a string of at most {MAX_VERSION} characters")
        if not nameable(thread):
            skipped.append(thread)
            continue
        listed[thread] = Listed(version, compact)
    # thread `x.compact` and `x`'s compact version would both be kept as `x.compact.jsonl`
    # (§3.5's names): the thread is kept, a whole conversation; `x`'s compact version (a
    # summary of a conversation served whole) is skipped and said
    for thread in list(listed):
        base = thread[: -len(COMPACT)] if thread.endswith(COMPACT) else None
        if base in listed and listed[base].compact is not None:
            listed[base] = Listed(listed[base].version, None)
            skipped.append(f"{base}'s compact version (its copy's name is thread {thread}'s)")
    return listed, skipped


def check_conversation(out: bytes, thread: str, compact: bool) -> None:
    """A conversation's answer is JSONL: every line a JSON object (a message the
    index may still not understand: skipped and counted there); anything else
    keeps the copy as it was (DriverFailed)."""
    for _ in json_lines(out, f"`conversation {thread}{' --compact' if compact else ''}`"):
        pass


class CopyFolder:
    """The engine's own copy of a driver's conversations: files named by thread
    only, in one folder of `<state>`, opened as a descriptor (never through a link)."""

    def __init__(self, path: str):
        self.path = path
        self.fd: Optional[int] = None
        self.here = path  # the folder as opened (atomic.pinned): what reads of the copies go through
        self._hold()

    def _hold(self) -> int:
        """The copies' folder, opened once, never through a link: a link (or what is not a
        folder) at its name is moved aside and the folder made anew; a link swapped in later
        changes nothing (the folder held is used). Opened again only once the folder held
        is gone (removed by a person: made again, the copies fetched again)."""
        fd = self.fd
        if fd is not None and os.fstat(fd).st_nlink > 0:
            return fd
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        with atomic.folder(self.path) as (parent, name):
            for _ in range(3):
                try:
                    fd = os.open(name, flags, dir_fd=parent)
                    break
                except FileNotFoundError:
                    try:
                        os.mkdir(name, 0o700, dir_fd=parent)
                    except FileExistsError:
                        pass
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    moved = atomic.move_aside_at(parent, name)
                    if moved:
                        log.warning("the store driver's copies' folder %s was %s: moved aside to %s (never "
                                    "followed), and made anew", self.path, moved[1], moved[0])
            else:
                raise OSError(errno.EEXIST, f"{self.path} keeps being replaced by what is not a folder")
        # (one held before, gone, is left open: a reader may still name it, and its number
        # must not name another file meanwhile)
        self.fd, self.here = fd, atomic.pinned(fd, self.path)
        return fd

    def _dir(self) -> int:
        return os.dup(self._hold())

    @staticmethod
    def name(thread: str, compact: bool = False) -> str:
        assert nameable(thread)
        return f"{thread}{COMPACT if compact else ''}.jsonl"

    def versions(self) -> dict[str, Listed]:
        """What the copies are of (a record that cannot be read: none known, all fetched again)."""
        try:
            fd = self._dir()
            try:
                raw = json.loads(atomic.read_at(fd, VERSIONS, 16 << 20) or b"{}")  # (no link, no FIFO's wait)
            finally:
                os.close(fd)
            return {t: Listed(v[0], v[1]) for t, v in raw.items()
                    if nameable(t) and isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
                    and (v[1] is None or isinstance(v[1], str))}
        except (OSError, ValueError, AttributeError, TypeError):
            return {}

    def files(self) -> set[str]:
        """The names of the copies kept (whatever the record says)."""
        try:
            fd = self._dir()
        except OSError:
            return set()
        try:
            return {n for n in os.listdir(fd) if n.endswith(".jsonl") and not n.startswith(".")}
        except OSError:
            return set()
        finally:
            os.close(fd)

    def threads(self, names: Optional[set] = None) -> set[str]:
        """The threads a copy may be kept of (whatever the record says): `x.compact.jsonl`
        is thread `x.compact`'s or `x`'s compact one, so both are named."""
        out: set[str] = set()
        for n in self.files() if names is None else names:
            if n.endswith(".jsonl"):
                stem = n[: -len(".jsonl")]
                for thread in (stem, stem[: -len(COMPACT)] if stem.endswith(COMPACT) else None):
                    if thread and nameable(thread):
                        out.add(thread)
        return out

    def _write(self, name: str, data: bytes) -> None:
        fd = self._dir()
        try:
            atomic.write_at(fd, name, data, sync=True)  # (a temp name of its own, renamed over the copy)
        finally:
            os.close(fd)

    def same(self, name: str, data: bytes) -> bool:
        """Whether the copy already holds exactly ``data`` (then it is left as it is)."""
        try:
            fd = self._dir()
            try:
                f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            finally:
                os.close(fd)
            with open(f, "rb") as fh:
                st = os.fstat(fh.fileno())
                if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):  # (a FIFO: never waited on)
                    return False
                return fh.read() == data
        except OSError:
            return False

    def put(self, thread: str, compact: bool, data: bytes) -> bool:
        """Keep ``data`` as the copy; True when the copy changed."""
        name = self.name(thread, compact)
        if self.same(name, data):
            return False
        self._write(name, data)
        return True

    def drop(self, thread: str, compact: bool) -> bool:
        fd = self._dir()
        try:
            os.unlink(self.name(thread, compact), dir_fd=fd)
            return True
        except FileNotFoundError:
            return False
        finally:
            os.close(fd)

    def record(self, versions: dict[str, Listed]) -> None:
        self._write(VERSIONS, json.dumps({t: [v.version, v.compact] for t, v in versions.items()}).encode())

    def remove_leftover_temps(self) -> None:
        """Temporary files a killed process left beside the copies."""
        try:
            fd = self._dir()
        except OSError:
            return
        try:
            for n in os.listdir(fd):
                if n.startswith(".") and n != VERSIONS and n.count(".") >= 2:
                    try:
                        os.unlink(n, dir_fd=fd)
                    except OSError:
                        pass
        finally:
            os.close(fd)


class DriverConversations(PlaceBase):
    """The `chats` source of an agent whose conversations a store driver keeps:
    read from the engine's own copy, which a loop of its own keeps (§3.5)."""

    def __init__(self, program: str, folder: str, env: Mapping[str, str]):
        self.program = program
        self.env = dict(env)
        self.copies = CopyFolder(folder)
        self.copies.remove_leftover_temps()
        self._place: Optional[LocalPlace] = None
        self.skipped = 0
        # no listing a search should wait for (briefly) is under way: the first one, and
        # one a `changed` control asked for; a periodic one never holds a search up
        self.idle = threading.Event()
        self.idle.set()
        self.listing = False  # a listing is under way ("refreshing")
        self._proc: Optional[subprocess.Popen] = None
        self._problem: Optional[str] = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._waiting: list[Callable[[], None]] = []  # called once the next refresh is done
        self._memory = None
        self._thread: Optional[threading.Thread] = None

    # --- the place the index reads: the copy ---------------------------------------

    @property
    def place(self) -> LocalPlace:
        """Reads beneath the copy's folder as held (:meth:`CopyFolder._hold`), like any local folder."""
        here = self.copies.here
        if self._place is None or self._place.root != here:
            self._place = LocalPlace(here)
        return self._place

    def list(self, prefix: str = "", share: bool = False) -> list[Entry]:
        out = self.place.list(prefix)  # local files' entries: their times read from their versions
        self.skipped = self.place.skipped
        return out

    def stat(self, path: str) -> Optional[Entry]:
        return self.place.stat(path)

    def read(self, path: str) -> tuple[bytes, str]:
        return self.place.read(path)

    def listdir(self, path: str) -> list[tuple[str, str, int]]:
        return self.place.listdir(path)

    # --- the loop that keeps it --------------------------------------------------------

    def serve(self, memory) -> None:
        """Keep the copy while ``memory`` serves: a listing now, then every interval."""
        self._memory = memory
        if self._thread is None:
            if not self.copies.versions():  # nothing kept yet: a search waits (2 s at most) for the first
                self.idle.clear()  # listing, under way from now; with copies kept, it answers from them
            self._thread = threading.Thread(target=self._loop, name="lnkmem-driver", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        proc = self._proc
        if proc is not None:  # a call under way ends with the engine
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def _running(self, proc: Optional[subprocess.Popen]) -> None:
        self._proc = proc
        if proc is not None and self._stop.is_set():
            self.stop()

    def _run(self, args: list[str]) -> bytes:
        return run(self.program, args, self.env, running=self._running)

    def listing_idle(self) -> bool:
        return self.idle.is_set()

    def status(self) -> Optional[str]:
        """For a search (§4.1): "refreshing", "unavailable: <why>", or None."""
        if self.listing:
            return "refreshing"
        why = self._problem
        return f"unavailable: {why}" if why else None

    def before_change(self, then: Callable[[], None]) -> None:
        """A `changed` control named a conversation: list again now, then ``then()``."""
        with self._lock:
            self._waiting.append(then)
        self.idle.clear()
        self._wake.set()

    def _loop(self) -> None:
        every = interval()
        while not self._stop.is_set():
            self._wake.clear()
            with self._lock:
                waiting, self._waiting = self._waiting, []
            self.listing = True
            try:
                changed = self.refresh()
            except Exception as e:  # (the copy's folder, say): never the end of the loop; said, tried again
                self._fail(f"{type(e).__name__}: {e}")
                changed = False
            done = threading.Event()
            if changed and self._memory is not None and not self._stop.is_set():
                self._memory.changed("chats", wait=False, done=done)
                done.wait(INDEX_WAIT_S)  # "refreshing" until the copies are in the index
            self.listing = False
            for then in waiting:
                then()
            with self._lock:
                if not self._waiting:
                    self.idle.set()
            if not self._waiting:
                self._wake.wait(every)

    def _fail(self, why: str) -> None:
        if why != self._problem:
            log.warning("the store driver's conversations are unavailable: %s (the copies kept are searched; "
                        "tried again in %gs)", why, interval())
        self._problem = why

    def refresh(self) -> bool:
        """List, fetch what changed, drop what is no longer listed; True when a copy changed."""
        try:
            listed, skipped = parse_listing(self._run(["conversations"]))
        except DriverFailed as e:
            self._fail(str(e))
            return False
        if skipped:
            log.warning("the store driver listed %d thread(s) that cannot be served (not IDs, or a compact "
                        "version whose copy's name is another thread's); skipped: %s", len(skipped),
                        ", ".join(ascii(t) for t in skipped[:3]))
        self.skipped = len(skipped)
        have = self.copies.versions()
        files = self.copies.files()
        kept = self.copies.threads(files)
        changed = False
        problem = None
        told = time.monotonic()
        # the copies' names the listing holds: never dropped for another thread (`x.compact.jsonl`)
        owned = {self.copies.name(t, c) for t, now in listed.items() for c in (False, True)
                 if not c or now.compact is not None}

        def drop(thread: str, compact: bool) -> bool:
            return self.copies.name(thread, compact) not in owned and self.copies.drop(thread, compact)

        for thread in sorted(kept | set(have)):
            if thread not in listed:  # no longer listed: the copy and (at the next look) the index let go of it
                changed |= drop(thread, False)
                changed |= drop(thread, True)
                have.pop(thread, None)
        for thread, now in listed.items():
            if self._stop.is_set():
                break
            was = have.get(thread)
            version = was.version if was is not None and self.copies.name(thread) in files else None
            compact = was.compact if was is not None and self.copies.name(thread, True) in files else None
            try:
                if version != now.version:
                    data = self._run(["conversation", thread])
                    check_conversation(data, thread, False)
                    changed |= self.copies.put(thread, False, data)
                    version = now.version
                if now.compact is None:
                    changed |= drop(thread, True)
                    compact = None
                elif compact != now.compact:
                    data = self._run(["conversation", thread, "--compact"])
                    check_conversation(data, thread, True)
                    changed |= self.copies.put(thread, True, data)
                    compact = now.compact
            except DriverFailed as e:  # this thread's copy stays as it was; fetched again next time
                problem = problem or str(e)
            if version is not None:
                have[thread] = Listed(version, compact)
            if changed and self._memory is not None and time.monotonic() - told >= TELL_EVERY_S:
                told = time.monotonic()  # many threads to fetch: those fetched so far are searchable meanwhile
                self._memory.changed("chats", wait=False)
        try:
            self.copies.record(have)
        except OSError as e:
            problem = problem or f"cannot record the copies' versions: {e.strerror}"
        if problem:
            self._fail(problem)
        else:
            if self._problem:
                log.warning("the store driver answers again; its conversations are served")
            self._problem = None
        return changed

