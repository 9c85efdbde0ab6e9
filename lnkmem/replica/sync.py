"""Writing the index copy back (§7.2, §7.3), after Litestream's replica loop.

:class:`Replica` is the copy as files in one writable place (the storage
bridge's memory collection under ``lnkmem/``, or Home's ``memory/lnkmem/``
through the files bridge). :class:`WriteBack` is a small loop with clear
states -- clean, dirty, writing, reloading, backing off, stopped -- that writes the cache back at
most once per interval, within that interval after a change, and at once
when asked (flush, end, end of input, SIGTERM). Every write is conditional;
a 412 means another engine wrote first: the loop loads that version,
re-indexes the sources over it and tries again, so nothing is lost and no
version it has not seen is overwritten.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import weakref
from typing import Callable, NamedTuple, Optional

from lnkmem.bridges.place import BridgeDown, Conflict, Forbidden, NotFound, TooLarge
from lnkmem.core import atomic, memtrim
from lnkmem.core.knobs import knobs
from lnkmem.replica.checks import blob_size
from lnkmem.replica.export import export, written
from lnkmem.replica.load import damaged, load_copy
from lnkmem.replica.manifest import CopyDamaged, MANIFEST, MAX_BLOB, decode_manifest, encode_manifest, is_copy_file, variant
from lnkmem.replica.state import copy_state, dirty, forget_doomed, note_orphans, note_sent, ripe_orphans
from lnkmem.replica.apply import apply_change
from lnkmem.index.store import Store

log = logging.getLogger("lnkmem")


def interval() -> float:
    """§2.6 `LNKMEM_WRITEBACK_S`: the write-back interval (60 s)."""
    return knobs().writeback_s


def quiet() -> float:
    """§7.3 debounce: how long the index must be quiet before a write-back (5 s;
    `LNKMEM_QUIET_S` for tests)."""
    return knobs().quiet_s


def recheck() -> float:
    """§7.2: how often the copy's version is asked for again while serving (30 s;
    `LNKMEM_RECHECK_S` for tests)."""
    return knobs().recheck_s


class Replica:
    """The copy in a place with conditional writes (a Collection or FilesPlace rooted at the copy).

    ``of`` names whose memory the copy is ("agent <owner>/<agent>", "team <id>"):
    written into the copy and checked when it is loaded, so another memory's
    copy placed here is never served (§7.2)."""

    def __init__(self, place, of: Optional[str] = None):
        self.place = place
        self.of = of

    def manifest(self, if_none_match: Optional[str] = None):
        """(manifest, version); (None, version) when unchanged; NotFound when there is none;
        CopyDamaged (with ``.version``) when the manifest is not one."""
        try:
            data, version = self.place.get(MANIFEST, if_none_match)
        except TooLarge as e:
            bad = CopyDamaged(f"the manifest is larger than an answer may be ({e})")
            bad.version = e.version
            raise bad from None
        if data is None:
            return None, version
        try:
            return decode_manifest(data), version
        except CopyDamaged as e:
            e.version = version
            raise

    def fetch(self, name: str) -> bytes:
        size = blob_size(name)
        if size is not None and size > MAX_BLOB:  # refused before it is fetched
            raise CopyDamaged(f"{name} is {size} bytes, over {MAX_BLOB}")
        try:
            return self.place.read(name)[0]
        except TooLarge as e:  # no file of a copy this engine made is that large
            raise CopyDamaged(f"{name} is larger than an answer may be ({e})") from None

    def put_blob(self, name: str, data) -> str:
        """Create one content-addressed file (``data``: bytes, or an iterable of bytes
        chunks, joined here until the place takes a stream: one file is at most
        MAX_BLOB); the name it was created under.

        Only a file this write-back made is relied on: one already there under the name
        (412; a lost answer of this very write is told apart by the place) is no version's
        this writer read, so another writer may be deleting it as an orphan or a doomed
        file. The same content goes under another name instead (:func:`manifest.variant`)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            data = b"".join(data)
        for _ in range(8):
            try:
                self.place.write(name, data, None)  # If-None-Match: *
                return name
            except Conflict:
                name, data = variant(name, bytes(data))
        raise BridgeDown(f"{name}: every name tried for it was taken")

    def listed(self) -> set:
        """The names of the copy's files in its place (NotFound, Forbidden, BridgeDown)."""
        return {e.path for e in self.place.list() if is_copy_file(e.path)}

    def put_manifest(self, data: bytes, expect: Optional[str]) -> str:
        """Swap the manifest, conditionally on ``expect``; its new version. A lost answer is
        checked by the place (§7.3 rev. 3); a 412 is checked here too before it is called a
        conflict (a bridge may turn away a retry of a write it had done): the manifest there
        being exactly ``data`` is this write, landed."""
        try:
            return self.place.write(MANIFEST, data, expect)
        except Conflict:
            try:
                there, version = self.place.get(MANIFEST)
            except (NotFound, TooLarge):
                raise Conflict(MANIFEST) from None
            if there == data:
                log.info("the manifest written was there already (a lost answer): no conflict")
                return version
            raise

    def delete(self, name: str) -> bool:
        """Delete one file; whether it is gone (False: to be tried again later)."""
        try:
            self.place.delete(name)
        except NotFound:
            pass
        except (Forbidden, BridgeDown, Conflict):
            return False
        return True


class Attached(NamedTuple):
    """What :func:`attach` did (``how``), the store that now holds the cache, and the files
    the cache had changed itself that a version applied as a change changed too (their
    sources to be looked at again)."""
    how: str
    store: Store
    touched: tuple = ()


def attach(store: Store, replica: Replica, sources=None, width: Optional[tuple[str, int]] = None,
           beside: bool = False, changes: bool = False) -> Attached:
    """Make the cache one version of the copy (§7.2). Returns what happened:
    "reused" (same version), "loaded" (another version, verified), "applied" (another
    version, taken as a change: ``changes``), "missing"
    (no copy), "damaged" (the copy failed a check: the cache is kept, to be
    brought up to date from the sources, and the next write-back replaces the
    copy, conditionally on the version seen); and the store that now holds the
    cache. ``beside``: a cache that holds files has a newer version loaded into an
    index beside it, in steps of bounded memory, and put in its place
    (``Store.replaced_by``: the store returned; ``store`` is retired), its searches
    answering from the version it held until then; else it is replaced in one
    write transaction, which LMDB holds in memory whole. ``changes``: a newer version is
    first applied as a change (:func:`apply.apply_change`: only the files the cache lacks
    fetched, one commit; the cache's own commits since its version kept, the files both
    changed in ``touched``), and loaded whole only where that cannot be done."""
    state = copy_state(store)
    for _ in range(5):
        try:
            manifest, version = replica.manifest(state.version)
        except NotFound:
            return Attached("missing", store)
        except CopyDamaged as e:
            log.warning("the index copy is damaged (%s); it will be replaced from the sources", e)
            damaged(store, e.version)
            return Attached("damaged", store)
        if manifest is None:
            return Attached("reused", store)
        if changes and store.file_count() and not manifest.partial:
            applied = apply_change(store, manifest, replica.fetch, version, replica.of, sources)
            if applied is not None:
                log.info("the copy's newer version applied as a change: %d files written, %d removed, "
                         "%d bytes fetched", applied.changed, applied.removed, applied.fetched)
                return Attached("applied", store, applied.touched)
        side = store.open_beside() if beside and store.file_count() else None
        try:
            if side is None:
                load_copy(store, manifest, replica.fetch, version, replica.of, sources, width)
            else:
                with store.merges_held():  # (its merges would be thrown away, and add to the load's peak)
                    load_copy(side, manifest, replica.fetch, version, replica.of, sources, width,
                                      was=state)
                placed, side = store.replaced_by(side), None
                return Attached("loaded", placed)
        except NotFound as e:  # vanished under a newer write, or never there
            try:
                again, _ = replica.manifest(version)
            except (NotFound, CopyDamaged):
                continue  # it changed: look again
            if again is None:  # unchanged (304): this version names a file that is not there
                log.warning("the index copy is damaged (a file it names is missing: %s); "
                            "it will be replaced from the sources", e)
                damaged(store, version)
                return Attached("damaged", store)
            continue
        except CopyDamaged as e:
            log.warning("the index copy is damaged (%s); it will be replaced from the sources", e)
            damaged(store, version)
            return Attached("damaged", store)
        finally:
            if side is not None:  # not loaded, or not put in place: nothing of it is kept
                side.close()
                Store.discard_beside(store.path)
        return Attached("loaded", store)
    raise BridgeDown("the copy kept changing while it was read")


def _none() -> None:
    """What ``WriteBack._seen`` gives back before any store was looked at (a weak reference's call, in shape)."""
    return None


class StateFile:
    """Shows a write-back's state in a small JSON file of the cache's own folder (written
    whole and renamed at each transition), for `lnk-lnkmem status`: ``state``, ``since``
    (RFC 3339), ``error``, ``writes``, ``conflicts``, ``failures`` and the process's ``pid``."""

    NAME = "writeback.json"

    def __init__(self, folder: str):
        self.path = os.path.join(folder, self.NAME)

    def __call__(self, wb: "WriteBack") -> None:
        import json
        wall = time.time() - (time.monotonic() - wb.since)
        shown = {"state": wb.state, "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall)),
                 "error": wb.error, "writes": wb.writes, "conflicts": wb.conflicts,
                 "failures": wb.failures, "pid": os.getpid()}
        atomic.write_file(self.path, json.dumps(shown).encode())  # (never through a link at its name)

    def read(self) -> Optional[dict]:
        import json
        raw = atomic.read_file(self.path, 1 << 16)
        try:
            shown = json.loads(raw) if raw is not None else None
        except ValueError:
            return None
        return shown if isinstance(shown, dict) else None


class WriteBack:
    """The write-back loop of one cache and its copy: a state machine.

    States (``state``; ``since``, when it was entered; ``error``, the last failure):

    - ``clean``: the copy holds everything the cache does;
    - ``dirty``: a change is waiting for its write-back (debounced, §7.3);
    - ``writing``: a write-back is under way; ``reloading``: it met a newer copy
      (412) and loads it before writing again;
    - ``backing off``: the last write-back failed (``error`` says why); still dirty,
      tried again after a jittered backoff (0.5 s doubling to 30 s);
    - ``stopped``: ``stop`` was called.

    Every change of state goes through ``_to`` (assigning ``state`` calls it). The
    loop is told of changes, never polls: the store's commits call ``changed``, and
    ``look`` asks it to see whether the cache holds anything unwritten (after the
    copy was looked at, a rebuild, a damaged copy). Every exception in the loop is
    caught and shown in its state; a new store (``store_of()`` after a rebuild) is
    looked at afresh. ``on_state(self)`` is told of each transition (``StateFile``).
    """

    NEXT = {  # the transitions the loop makes
        "clean": ("dirty", "writing", "stopped"),
        "dirty": ("writing", "clean", "backing off", "stopped"),
        "writing": ("clean", "dirty", "reloading", "backing off", "stopped"),
        "reloading": ("writing", "clean", "dirty", "backing off", "stopped"),
        "backing off": ("writing", "dirty", "clean", "stopped"),
        "stopped": ("writing",),  # a flush after stop writes on the caller's thread
    }
    BACKOFF_FIRST, BACKOFF_MAX = 0.5, 30.0
    HELD_LOOK_S = 0.5  # a write-back due but held: looked at again this often

    def __init__(self, store_of: Callable[[], Store], replica: Replica, reload: Callable[[], None],
                 every: Optional[float] = None, name: str = "", quiet_s: Optional[float] = None,
                 on_state: Optional[Callable[["WriteBack"], None]] = None,
                 held: Optional[Callable[[], bool]] = None):
        self.store_of = store_of
        self.replica = replica
        self.reload = reload  # load the copy's newer version and re-apply the sources
        self.every = interval() if every is None else every
        self.quiet = quiet() if quiet_s is None else quiet_s
        self.name = name
        self.on_state = on_state
        # while it says so (its memory's first look at the sources under way) no write-back is
        # made unasked: a first build writes one copy, not partial ones; a flush still writes,
        # its manifest saying it is partial
        self.held = held
        self._state = "clean"
        self.since = time.monotonic()
        self.last_write = 0.0
        self.writes = 0
        self.conflicts = 0
        self.failures = 0  # write-backs (or looks at the cache) that failed
        self.error: Optional[str] = None
        self._cond = threading.Condition()
        self._dirty_since: Optional[float] = None  # the first unwritten change
        self._last_change = 0.0  # the latest change
        self._look = True  # look at the cache for unwritten changes (first: at start)
        self._seen = _none  # the store last looked at, weakly (one put in another's place is let go of)
        self._backoff = self.BACKOFF_FIRST
        self._flush_waiters: list[threading.Event] = []
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self.lock = threading.RLock()  # one write-back (or look at the copy) at a time

    # --- the state ----------------------------------------------------------

    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, new: str) -> None:
        self._to(new)

    def _to(self, new: str, error: Optional[str] = None) -> None:
        """The one transition function: every change of state, its time, its error."""
        with self._cond:
            old = self._state
            if new == old:
                return
            if new not in self.NEXT:
                raise ValueError(f"no write-back state {new!r}")
            if new not in self.NEXT[old]:  # said, never a reason to fail a write-back
                log.warning("write-back%s: %s -> %s is no transition of its loop", self.name, old, new)
            self._state = new
            self.since = time.monotonic()
            if new == "backing off":
                self.error = error
            elif new == "clean":
                self.error = None
            self._cond.notify_all()
        if self.on_state is not None:
            try:
                self.on_state(self)
            except Exception as e:  # a display's failure is no write-back's
                log.debug("write-back state not shown: %s", e)

    # --- told from outside --------------------------------------------------

    def start(self) -> "WriteBack":
        self._thread = threading.Thread(target=self._run, name=f"lnkmem-writeback{self.name}", daemon=True)
        self._thread.start()
        return self

    def changed(self) -> None:
        """The cache changed (a commit): write back once it has been quiet a while, within the interval."""
        with self._cond:
            now = time.monotonic()
            if self._dirty_since is None:
                self._dirty_since = now
            self._last_change = now
            if self._state == "clean":
                self._to("dirty")
            self._cond.notify_all()

    def look(self) -> None:
        """Something other than a commit may have left the cache unlike the copy (the copy
        looked at, found damaged or missing; a rebuilt index): the loop looks at it."""
        with self._cond:
            self._look = True
            self._cond.notify_all()

    def _due(self) -> float:
        """When the pending change is written (§7.3 rev. 2): once the index has been
        quiet for `quiet`, or `every` after the first unwritten change, whichever
        comes first -- and never sooner than `every` after the last write."""
        settled = min(self._last_change + self.quiet, self._dirty_since + self.every)
        return max(self.last_write + self.every, settled)

    def flush(self, timeout: float = 60.0) -> Optional[str]:
        """Write back now and wait for the bridge's acknowledgement; an error, or None.
        ``timeout`` is for a write-back that moves no byte: one still sending is waited for."""
        if self._thread is None or not self._thread.is_alive():  # stopped: write here
            was = self._state
            try:
                self.write()
                return None
            except Exception as e:
                return f"the copy could not be written: {e}"
            finally:
                if was == "stopped":
                    self._to("stopped")
        done = threading.Event()
        with self._cond:
            self._flush_waiters.append(done)
            self._cond.notify_all()
        moved = self._moved()
        while not done.wait(timeout):  # a write-back still moving bytes is waited for
            now = self._moved()
            if self._state not in ("writing", "reloading") or now is None or now == moved:
                return "the write-back did not finish in time"
            moved = now
        return self.error

    def _moved(self) -> Optional[int]:
        """Bytes the copy's place has moved so far (None: it does not say)."""
        return self.replica.place.moved

    def stop(self, timeout: float = 60.0) -> Optional[str]:
        err = self.flush(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        return err

    # --- the loop -------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._step():
                pass
        except BaseException as e:  # not an Exception (the loop catches those): shown all the same
            self.error = f"the write-back stopped: {type(e).__name__}: {e}"
            self._to("stopped")
            raise
        finally:
            with self._cond:
                waiters, self._flush_waiters = self._flush_waiters, []
            for w in waiters:
                w.set()

    def _step(self) -> bool:
        """Wait for what is next, do it; False once stopped. Nothing raised escapes it."""
        waiters: list[threading.Event] = []
        try:
            what = self._next()
            if what is None:
                return False
            waiters = what
            self.write()
            self._backoff = self.BACKOFF_FIRST
            with self._cond:
                self.error = None
                if self._state == "dirty" and self._dirty_since is None:  # left dirty, no commit said so
                    self._dirty_since = self._last_change = time.monotonic()
        except Exception as e:
            self._failed(e)
        finally:
            for w in waiters:
                w.set()
        return True

    def _next(self) -> Optional[list]:
        """Wait until a write-back is due (or asked for); the flushes waiting on it, or None at stop."""
        while True:
            look = False
            with self._cond:
                if self._stop:
                    self._to("stopped")
                    return None
                if not self._flush_waiters:
                    store = self.store_of()
                    if store is not self._seen():  # the first, or a new one (rebuilt, or another's place taken)
                        self._look = True
                        self._seen = weakref.ref(store) if store is not None else _none
                    look = self._look
                    self._look = False
                    if not look:
                        if self._dirty_since is None:
                            self._cond.wait()
                            continue
                        wait = self._due() - time.monotonic()
                        if wait > 0:
                            self._cond.wait(wait)
                            continue
                        if self.held is not None and self.held():
                            self._cond.wait(self.HELD_LOOK_S)
                            continue
            if look:
                self._look_at(self._seen())
                continue
            with self._cond:
                waiters, self._flush_waiters = self._flush_waiters, []
                self._dirty_since = None
            return waiters

    def _look_at(self, store) -> None:
        """Whether the cache holds anything the copy lacks (an LMDB read, off the lock)."""
        if store is None:
            return
        if dirty(store):
            with self._cond:
                if self._dirty_since is None:
                    self._dirty_since = self._last_change = time.monotonic()
                if self._state == "clean":
                    self._to("dirty")
        elif self._state == "dirty":
            with self._cond:
                if self._dirty_since is not None and not self._flush_waiters:
                    return  # a commit said so meanwhile
                self._to("clean")

    def _failed(self, e: Exception) -> None:
        """A write-back (or a look at the cache) failed: kept dirty, tried again after the backoff.

        Not tenacity's ``Retrying`` (which the bridges' client uses for one request): the
        backoff is a state of this loop -- a later due time that a flush, a stop or a new
        change meets, shown by ``status`` as "backing off" -- not a call held until it works."""
        why = f"the copy could not be written: {e}" if not isinstance(e, CopyDamaged) else str(e)
        log.warning("%s", why)
        self.failures += 1
        with self._cond:
            if self._dirty_since is None:
                self._dirty_since = time.monotonic()
            self._last_change = 0.0  # a retry waits for the backoff, not for quiet
            self.last_write = time.monotonic() - self.every + self._backoff * (1 + random.random())
            self._look = False
            self._to("backing off", why)
        self._backoff = min(self._backoff * 2, self.BACKOFF_MAX)

    def write(self) -> bool:
        """One write-back, riding out 412s. True when something was written.

        The files the copy lacks are made, recorded and sent one at a time (the
        export is a generator: one file in memory, whatever the index's size), then
        the manifest swapped conditionally; once it has landed, every file it no
        longer names -- of the version it replaced, or sent by a write-back that
        never got to its manifest -- is deleted (:meth:`delete_unnamed`)."""
        with self.lock:
            for attempt in range(10):
                store = self.store_of()  # (a reload puts a newer version's index in the old one's place)
                state = copy_state(store)
                if (state.unknown or state.named_incomplete) and state.version is not None:
                    self.find_orphans(store, state)  # before this write-back's own files are there
                    state = copy_state(store)
                if not dirty(store, state):
                    self.state = "clean"
                    self.delete_unnamed(store, state)
                    return False
                self.state = "writing"
                # what the indexing left (its heap, the map's pages it read) goes back first:
                # the write-back's peak is what it holds on top of what is left (at 10x the
                # re-index left hundreds of MiB)
                with store.merges_held():  # no merge beside it: its peak is its own
                    store.let_go_of_map()
                    memtrim.trim()
                    exp = export(store, state, self.replica.of)
                    renamed = {}
                    for name, blob in exp.blobs:
                        note_sent(store, [name])  # before it is: a kill leaves it known
                        sent = self.replica.put_blob(name, blob)
                        if sent != name:
                            note_sent(store, [sent])
                            renamed[name] = sent
                        del blob
                    exp.renamed(renamed)
                    memtrim.trim()  # (the export's heap)
                exp.manifest.partial = self.held is not None and self.held()
                try:
                    version = self.replica.put_manifest(encode_manifest(exp.manifest), state.version)
                except Conflict:
                    # another engine wrote first: load its version, re-apply ours, again
                    self.conflicts += 1
                    self.state = "reloading"
                    self.reload()
                    continue
                written(store, exp, version)
                self.last_write = time.monotonic()
                self.writes += 1
                self.delete_unnamed(store, copy_state(store))
                self.state = "dirty" if dirty(store) else "clean"
                return True
            raise BridgeDown("gave up after 10 conflicting writes")

    def find_orphans(self, store: Store, state) -> None:
        """List the place once: the files no version this cache knows names (a cold cache,
        or a version damaged, renumbered or of the previous format, whose files are not all
        known here) are orphans, found at the copy's version read after the listing
        (:func:`state.note_orphans`): another writer's files for a manifest on its way
        among them, deleted only once no manifest that may still land can name them."""
        try:
            listed = self.replica.listed()
            _, seen = self.replica.manifest(state.version)
        except (NotFound, Forbidden, BridgeDown):
            return  # not now: at a later write-back
        except CopyDamaged as e:
            seen = e.version
        if seen is None:
            return
        note_orphans(store, sorted(listed), seen or "")

    def delete_unnamed(self, store: Store, state) -> None:
        """Delete the files no manifest names any more: those doomed (of a version this cache
        replaced or moved past, or sent by a write-back whose manifest never landed) once the
        copy there does not name them (another engine may name a file again), and the
        orphans once the copy is another version than the one they were found at."""
        if (not state.doomed and not state.orphans) or state.version is None:
            return
        try:
            newer, current = self.replica.manifest(state.version)
        except (NotFound, CopyDamaged, BridgeDown):
            return  # not now: at a later write-back
        named = set(newer.names()) if newer is not None else set(state.named)
        current = current or state.version
        doomed = [n for n in state.doomed if n not in named]
        gone = [n for n in doomed + ripe_orphans(state, current, named) if self.replica.delete(n)]
        forget_doomed(store, gone + [n for n in state.doomed if n in named]  # (named again: the copy's)
                              + [n for n, _ in state.orphans if n in named])
