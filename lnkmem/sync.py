"""Writing the index copy back (§7.2, §7.3), after Litestream's replica loop.

:class:`Replica` is the copy as files in one writable place (the storage
bridge's memory collection under ``lnkmem/``, or Home's ``memory/lnkmem/``
through the files bridge). :class:`WriteBack` is a small loop with clear
states -- clean, dirty, writing, backing off -- that writes the cache back at
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
from typing import Callable, Optional

from lnkmem.bridges.http import BridgeDown, TooLarge
from lnkmem.bridges.place import Conflict, Forbidden, NotFound
from lnkmem.index import copy as copyfmt
from lnkmem.index.store import Store

log = logging.getLogger("lnkmem")


def _knob(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        v = float(raw) if raw else default
    except ValueError:
        v = default
    return max(v, 0.0) if v == v else default


def interval() -> float:
    """§2.6 `LNKMEM_WRITEBACK_S`: the write-back interval (60 s)."""
    return _knob("LNKMEM_WRITEBACK_S", 60.0)


def quiet() -> float:
    """§7.3 debounce: how long the index must be quiet before a write-back (5 s;
    `LNKMEM_QUIET_S` for tests)."""
    return _knob("LNKMEM_QUIET_S", 5.0)


def recheck() -> float:
    """§7.2: how often the copy's version is asked for again while serving (30 s;
    `LNKMEM_RECHECK_S` for tests)."""
    return _knob("LNKMEM_RECHECK_S", 30.0)


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
            data, version = self.place.get(copyfmt.MANIFEST, if_none_match)
        except TooLarge as e:
            bad = copyfmt.CopyDamaged(f"the manifest is larger than an answer may be ({e})")
            bad.version = e.version
            raise bad from None
        if data is None:
            return None, version
        try:
            return copyfmt.decode_manifest(data), version
        except copyfmt.CopyDamaged as e:
            e.version = version
            raise

    def fetch(self, name: str) -> bytes:
        size = copyfmt.blob_size(name)
        if size is not None and size > copyfmt.MAX_BLOB:  # refused before it is fetched
            raise copyfmt.CopyDamaged(f"{name} is {size} bytes, over {copyfmt.MAX_BLOB}")
        try:
            return self.place.read(name)[0]
        except TooLarge as e:  # no file of a copy this engine made is that large
            raise copyfmt.CopyDamaged(f"{name} is larger than an answer may be ({e})") from None

    def put_blob(self, name: str, data) -> None:
        """Create one content-addressed file (``data``: bytes, or an iterable of bytes
        chunks, joined here until the place takes a stream: one file is at most
        copyfmt.MAX_BLOB)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            data = b"".join(data)
        try:
            self.place.write(name, data, None)  # If-None-Match: *
        except Conflict:  # content-addressed: the same file is there, unless someone rewrote it
            try:
                there, version = self.place.read(name)
            except NotFound:
                there, version = None, None
            except TooLarge as e:  # rewritten into something huge: replace it
                there, version = None, e.version or None
            if there != data:
                try:
                    self.place.write(name, data, version)
                except Conflict:
                    pass  # changed again meanwhile: the next write-back's check sees it

    def names(self) -> set:
        """The names of the copy's files in its place, as far as they can be listed."""
        try:
            return {e.path for e in self.place.list() if copyfmt.is_copy_file(e.path)}
        except (NotFound, Forbidden, BridgeDown):
            return set()

    def put_manifest(self, data: bytes, expect: Optional[str]) -> str:
        return self.place.write(copyfmt.MANIFEST, data, expect)

    def delete(self, name: str) -> bool:
        """Delete one file; whether it is gone (False: to be tried again later)."""
        try:
            self.place.delete(name)
        except NotFound:
            pass
        except (Forbidden, BridgeDown, Conflict):
            return False
        return True


def attach(store: Store, replica: Replica, sources=None, width: Optional[tuple[str, int]] = None) -> str:
    """Make the cache one version of the copy (§7.2). Returns what happened:
    "reused" (same version), "loaded" (another version, verified), "missing"
    (no copy), "damaged" (the copy failed a check: the cache is kept, to be
    brought up to date from the sources, and the next write-back replaces the
    copy, conditionally on the version seen)."""
    state = copyfmt.copy_state(store)
    for _ in range(5):
        try:
            manifest, version = replica.manifest(state.version)
        except NotFound:
            return "missing"
        except copyfmt.CopyDamaged as e:
            log.warning("the index copy is damaged (%s); it will be replaced from the sources", e)
            copyfmt.damaged(store, e.version)
            return "damaged"
        if manifest is None:
            return "reused"
        try:
            copyfmt.load_copy(store, manifest, replica.fetch, version, replica.of, sources, width)
        except NotFound as e:  # vanished under a newer write, or never there
            try:
                again, _ = replica.manifest(version)
            except (NotFound, copyfmt.CopyDamaged):
                continue  # it changed: look again
            if again is None:  # unchanged (304): this version names a file that is not there
                log.warning("the index copy is damaged (a file it names is missing: %s); "
                            "it will be replaced from the sources", e)
                copyfmt.damaged(store, version)
                return "damaged"
            continue
        except copyfmt.CopyDamaged as e:
            log.warning("the index copy is damaged (%s); it will be replaced from the sources", e)
            copyfmt.damaged(store, version)
            return "damaged"
        return "loaded"
    raise BridgeDown("the copy kept changing while it was read")


class WriteBack:
    """The write-back loop of one cache and its copy."""

    def __init__(self, store_of: Callable[[], Store], replica: Replica, reload: Callable[[], None],
                 every: Optional[float] = None, name: str = "", quiet_s: Optional[float] = None):
        self.store_of = store_of
        self.replica = replica
        self.reload = reload  # load the copy's newer version and re-apply the sources
        self.every = interval() if every is None else every
        self.quiet = quiet() if quiet_s is None else quiet_s
        self.name = name
        self.state = "clean"
        self.last_write = 0.0
        self.writes = 0
        self.conflicts = 0
        self.error: Optional[str] = None
        self._cond = threading.Condition()
        self._dirty_since: Optional[float] = None  # the first unwritten change
        self._last_change = 0.0  # the latest change
        self._flush_waiters: list[threading.Event] = []
        self._stop = False
        self._thread: Optional[threading.Thread] = None
        self.lock = threading.RLock()  # one write-back (or look at the copy) at a time

    def start(self) -> "WriteBack":
        self._thread = threading.Thread(target=self._run, name=f"lnkmem-writeback{self.name}", daemon=True)
        self._thread.start()
        return self

    def changed(self) -> None:
        """The cache changed: write back once it has been quiet a while, within the interval."""
        with self._cond:
            now = time.monotonic()
            if self._dirty_since is None:
                self._dirty_since = now
            self._last_change = now
            self._cond.notify()

    def _due(self) -> float:
        """When the pending change is written (§7.3 rev. 2): once the index has been
        quiet for `quiet`, or `every` after the first unwritten change, whichever
        comes first -- and never sooner than `every` after the last write."""
        settled = min(self._last_change + self.quiet, self._dirty_since + self.every)
        return max(self.last_write + self.every, settled)

    def flush(self, timeout: float = 60.0) -> Optional[str]:
        """Write back now and wait for the bridge's acknowledgement; an error, or None."""
        if self._thread is None or not self._thread.is_alive():  # stopped: write here
            try:
                self.write()
                return None
            except Exception as e:
                return f"the copy could not be written: {e}"
        done = threading.Event()
        with self._cond:
            self._flush_waiters.append(done)
            self._cond.notify()
        if not done.wait(timeout):
            return "the write-back did not finish in time"
        return self.error

    def stop(self, timeout: float = 60.0) -> Optional[str]:
        err = self.flush(timeout)
        with self._cond:
            self._stop = True
            self._cond.notify()
        return err

    def _run(self) -> None:
        backoff = 0.5
        while True:
            with self._cond:
                while True:
                    if self._stop:
                        for w in self._flush_waiters:
                            w.set()
                        return
                    if self._flush_waiters:
                        break
                    if self._dirty_since is not None:
                        wait = self._due() - time.monotonic()
                        if wait <= 0:
                            break
                        self._cond.wait(wait)
                    else:
                        self._cond.wait(1.0)
                        if self._dirty_since is None and copyfmt.dirty(self.store_of()):
                            self._dirty_since = self._last_change = time.monotonic()
                waiters, self._flush_waiters = self._flush_waiters, []
                self._dirty_since = None
            try:
                self.write()
                self.error = None
                backoff = 0.5
            except Exception as e:  # keep it dirty and try again later
                self.error = f"the copy could not be written: {e}"
                log.warning("%s", self.error)
                with self._cond:
                    if self._dirty_since is None:
                        self._dirty_since = time.monotonic()
                    self._last_change = 0.0  # a retry waits for the backoff, not for quiet
                    self.last_write = time.monotonic() - self.every + backoff * (1 + random.random())
                backoff = min(backoff * 2, 30.0)
            for w in waiters:
                w.set()

    def write(self) -> bool:
        """One write-back, riding out 412s. True when something was written.

        The files the copy lacks are made, recorded and sent one at a time (the
        export is a generator: one file in memory, whatever the index's size), then
        the manifest swapped conditionally; once it has landed, every file it no
        longer names -- of the version it replaced, or sent by a write-back that
        never got to its manifest -- is deleted (:meth:`sweep`)."""
        with self.lock:
            store = self.store_of()
            for attempt in range(10):
                state = copyfmt.copy_state(store)
                if not copyfmt.dirty(store, state):
                    self.state = "clean"
                    self.sweep(store, state)
                    return False
                self.state = "writing"
                exp = copyfmt.export(store, state, self.replica.of)
                for name, blob in exp.blobs:
                    copyfmt.note_sent(store, [name])  # before it is: a kill leaves it known
                    self.replica.put_blob(name, blob)
                    del blob
                try:
                    version = self.replica.put_manifest(copyfmt.encode_manifest(exp.manifest), state.version)
                except Conflict:
                    # another engine wrote first: load its version, re-apply ours, again
                    self.conflicts += 1
                    self.state = "reloading"
                    self.reload()
                    continue
                new = copyfmt.written(store, exp, version)
                self.last_write = time.monotonic()
                self.writes += 1
                if state.sweep:  # the files of a damaged (or renumbered) version are not all known
                    named = set(new.named)
                    copyfmt.note_sent(store, sorted(n for n in self.replica.names() if n not in named))
                self.sweep(store, copyfmt.copy_state(store))
                self.state = "dirty" if copyfmt.dirty(store) else "clean"
                return True
            raise BridgeDown("gave up after 10 conflicting writes")

    def sweep(self, store: Store, state) -> None:
        """Delete the files no manifest names any more (``state.doomed``), once the copy is
        still the version this cache wrote or read -- or, when a newer one is there, those
        it does not name either (another engine may name a file again)."""
        if not state.doomed or state.version is None:
            return
        doomed = set(state.doomed)
        try:
            newer, _ = self.replica.manifest(state.version)
        except (NotFound, copyfmt.CopyDamaged, BridgeDown):
            return  # not now: at a later write-back
        if newer is not None:
            doomed -= set(newer.names())
        gone = [n for n in sorted(doomed) if self.replica.delete(n)]
        copyfmt.forget_doomed(store, gone + [n for n in state.doomed if n not in doomed])
