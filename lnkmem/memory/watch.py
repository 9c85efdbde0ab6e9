"""A memory's local folders watched: each change told to its memory as a ref.

A :class:`Watcher` is owned by a :class:`lnkmem.memory.memory.Memory` and given what it
needs: the memory's places (the local ones are watched), where its notes, state and agent
folders are, a callback that brings a ref up to date (``Memory.changed``), the memory's
stop event, and a wait for its index to be opened. It watches through watchfiles (its
``RustNotify``: :meth:`Watcher._watch_loop` says why), through inotify itself where a name
is not UTF-8 (``lnkmem.memory.inotify``), and by looking every ``POLL_S`` or more where
neither can watch. A watched folder removed, replaced or made later is watched again (each
looked at by device and inode every ``REARM_S``). The state of each folder's watch is kept
in ``<state>/watch.json`` for ``status``.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
import time
from typing import Callable, Mapping, Optional

from lnkmem.core import atomic

log = logging.getLogger("lnkmem")

WATCH_DEBOUNCE_MS = 100
IGNORE_FILES = (".gitignore", ".lnkmemignore")
POLL_S = 1.0  # local sources looked at this often when they cannot be watched
REWATCH_S = 30.0  # and watching tried again after this long
REARM_S = 1.0  # how often the watched folders are looked at (gone, replaced, back): watched again
WATCH_FILE = "watch.json"  # in <state>: each watched folder's state, for `status`
WATCHED, POLLING, REARMING = "watched", "polling", "re-arming (gone or replaced: watched again once it is back)"


class Watcher:
    """One memory's local folders watched on a thread of their own, each change told as a ref.

    ``changed(ref, wait=..., timeout=...)`` brings a ref up to date (the memory's indexing
    thread does); ``opened()`` waits for the memory's index and says whether there is one to
    keep up to date (no watch is made otherwise); ``stop`` ends the watch."""

    def __init__(self, places: Mapping, changed: Callable[..., bool], stop: threading.Event,
                 opened: Callable[[], bool], state: str, agent: str = "", notes_path: Optional[str] = None,
                 state_fd: Optional[int] = None):
        self.places = places
        self.changed = changed
        self.stop = stop
        self.opened = opened
        self.state = state  # (never watched for: the engine's own files)
        self.agent = agent  # (below Home: the agent's folder is no part of Home's source)
        self.notes_path = notes_path  # a local notes file: its changes are the "notes" ref
        self.state_fd = state_fd  # <state> as opened: where WATCH_FILE is kept (a local memory only)
        # set once the watch is in place, or the watcher gave up or was never started: the
        # first look at the tree waits for it, so what changes meanwhile sends events
        self.settled = threading.Event()
        self.listed_unwatched = False  # the first look began before the watch was in place
        self.thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._watch, name="lnkmem-watch", daemon=True)
        self.thread.start()

    def wait_in_place(self, timeout: float) -> None:
        """Wait (at most ``timeout``) for the watch to be in place before the first look at the
        tree; a look that begins before it is made again once it is."""
        self.settled.wait(timeout)
        self.listed_unwatched = not self.settled.is_set()

    def _roots(self) -> list[tuple[str, str]]:
        """(absolute folder, source) of each local place to watch, most specific first."""
        roots = []
        for source in ("chats", "skills", "home"):
            place = self.places.get(source)
            if place is not None and place.local:
                roots.append((place.root, source))
        return roots

    def ref_for(self, path: str) -> Optional[str]:
        """The ref of a changed local path, or None when it is not indexed."""
        if self.notes_path is not None and path == self.notes_path:
            return "notes"
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:  # no ref names it (§3.2: skipped)
            return None
        state = self.state
        if path == state or path.startswith(state + os.sep):
            return None
        for root, source in self._roots():
            if path == root or path.startswith(root + os.sep):
                if source == "home" and self.agent and (path == self.agent or path.startswith(self.agent + os.sep)):
                    continue
                rel = os.path.relpath(path, root)
                if rel == ".":
                    return source
                parts = rel.split(os.sep)
                ignorer = self.places[source].ignore
                if ignorer is not None and parts[-1] in IGNORE_FILES:  # its folder's listing changes
                    folder = "/".join(parts[:-1])
                    return f"{source}/{folder}" if folder else source
                if ignorer is not None and parts[-1] == "pyvenv.cfg" and len(parts) > 1:
                    folder = "/".join(parts[:-2])  # a folder became a virtual environment: its parent's listing changes
                    return f"{source}/{folder}" if folder else source
                if any(p.startswith(".") for p in parts):
                    return None
                if ignorer is not None and ignorer.ignored("/".join(parts), os.path.isdir(path)):
                    return None
                return f"{source}/{rel.replace(os.sep, '/')}"
        return None

    def _watch(self) -> None:
        try:
            if self.opened():
                self._watch_sources()
        finally:
            self.settled.set()

    def _watch_sources(self) -> None:
        try:
            import watchfiles  # noqa: F401  (a help, not a need)
        except ImportError:
            return
        wanted = [r for r, _ in self._roots()]
        if self.notes_path is not None:
            d = os.path.dirname(self.notes_path)
            if not any(d == p or d.startswith(p + os.sep) for p in wanted):
                wanted.append(d)
        if not wanted:
            return
        from watchfiles._rust_notify import WatchfilesRustInternalError  # noqa: PLC2701 (watchfiles exports no public name for it)
        told = retry = False
        rewatch = REWATCH_S
        while not self.stop.is_set():
            # the folders there now, each as it is (a folder removed, or replaced, while watched:
            # its watch ends with it, so the watch is made again once it is there)
            self._watched = {p: _identity(p) for p in wanted}
            paths = [p for p, ident in self._watched.items() if ident is not None]
            self._watch_state({p: WATCHED if ident is not None else REARMING for p, ident in self._watched.items()})
            if not paths:
                self.stop.wait(REARM_S)
                retry = True
                continue
            try:
                if self._watch_loop(paths, retry) == "again" or self.stop.is_set():
                    if not self.stop.is_set():
                        self._rearming(wanted)
                    retry = True
                    continue
                return
            except WatchfilesRustInternalError as e:
                # a name that is not UTF-8 below a root (§3.2: skipped, never a reason
                # to stop watching) makes watchfiles fail at every turn: watch with
                # inotify itself, which keeps names as bytes
                log.info("watching with inotify: %s", e)
                try:
                    if self._inotify_loop(paths, retry) == "again":
                        self._rearming(wanted)
                        retry = True
                        continue
                    return
                except OSError as e2:
                    e = e2
                # no inotify (or no watches left): look at every local source
                # instead, every POLL_S or five times as long as a look takes (at
                # most a fifth of a core), and try watching again later
                (log.debug if told else log.info)("watching by looking every %gs or more: %s", POLL_S, e)
                told = True
                self._watch_state(dict.fromkeys(wanted, POLLING))
                until = time.monotonic() + rewatch
                rewatch = min(rewatch * 2, 600.0)
                while not self.stop.is_set() and time.monotonic() < until:
                    t0 = time.monotonic()
                    self._rescan_local(wait=True)
                    self.stop.wait(max(POLL_S, 4 * (time.monotonic() - t0)))
                retry = True
            except Exception as e:  # the watcher is a help, not a need
                log.warning("watching stopped: %s", e)
                self._watch_state(dict.fromkeys(wanted, f"not watched ({type(e).__name__}: {e})"))
                return

    watching: dict = {}  # each folder watched: WATCHED, POLLING, REARMING or why not (status)

    def _watch_state(self, folders: dict) -> None:
        """What the watch of each folder is now, kept for ``status`` (another process) in
        <state>'s WATCH_FILE, written from <state> as opened (a local memory only)."""
        if folders == self.watching:
            return
        self.watching = dict(folders)
        fd = self.state_fd
        if fd is None:
            return
        try:
            atomic.write_at(fd, WATCH_FILE, json.dumps({"pid": os.getpid(), "folders": folders}).encode())
        except OSError as e:
            log.debug("the watch's state could not be kept: %s", e)

    def _rearming(self, wanted: list[str]) -> None:
        """A watched folder went or came: said, and every folder re-arming until watched again."""
        log.info("a watched folder was removed or replaced: watched again")
        self._watch_state(dict.fromkeys(wanted, REARMING))

    def _rescan_local(self, wait: bool = False) -> None:
        """Look once more at every local source (events may have been missed)."""
        for source, place in self.places.items():
            if self.stop.is_set():
                return
            if place.local:
                self.changed(source, wait=wait, timeout=60)

    _watched: dict = {}  # each folder watched (or to be, once there): its identity when the watch began

    def _watched_moved(self) -> bool:
        """Whether a watched folder is gone, replaced, or there now though it was not."""
        return any(_identity(p) != ident for p, ident in self._watched.items())

    def _inotify_loop(self, paths: list[str], retry: bool = False) -> Optional[str]:
        """Watch with inotify directly (bytes names), until stopped ("again": a watched
        folder went or came: watch again). ``retry``: watching again after a time
        unwatched (what changed meanwhile is looked for)."""
        from lnkmem.memory.inotify import Inotify
        ino = Inotify()
        try:
            for p in paths:
                ino.add_tree(os.fsencode(p))
            # what changed while nothing watched: after another watcher failed, or when the
            # first look at the tree began before any watch
            if retry or self.settled.is_set() or self.listed_unwatched:
                self._rescan_local()
            self.settled.set()
            looked = time.monotonic()
            while not self.stop.is_set():
                events = ino.read(0.3)
                if events is None:  # events were lost: look at everything
                    self._rescan_local()
                    continue
                if time.monotonic() - looked >= REARM_S:
                    looked = time.monotonic()
                    if self._watched_moved():
                        return "again"
                if not events:
                    continue
                deadline = time.monotonic() + WATCH_DEBOUNCE_MS / 1000
                while (left := deadline - time.monotonic()) > 0:
                    more = ino.read(left)
                    if more is None:
                        self._rescan_local()
                        break
                    events += more
                refs = {self.ref_for(os.fsdecode(p)) for _, p in events}
                for r in refs:
                    if r:
                        self.changed(r, wait=False)
        finally:
            ino.close()

    def _watch_loop(self, paths: list[str], retry: bool = False) -> Optional[str]:
        """Watch with watchfiles until stopped ("again": a watched folder went or came:
        watch again). Its ``RustNotify``, not the public ``watchfiles.watch`` (issue 48): that
        generator makes its watches at its first ``next()`` and gives nothing back until a
        change or its timeout, so ``settled`` (and the look at what changed unwatched)
        would come a timeout late; and the error that sends us to inotify is public nowhere."""
        from watchfiles._rust_notify import RustNotify  # noqa: PLC2701 (watchfiles exports no public name for it)
        caught_up = False
        t0 = time.monotonic()
        looked = t0
        with RustNotify(paths, False, False, 300, True, True) as watcher:
            log.debug("watching %s: in place after %.2fs", ", ".join(paths), time.monotonic() - t0)
            self.settled.set()
            while not self.stop.is_set():
                raw = watcher.watch(WATCH_DEBOUNCE_MS, 20, 300, self.stop)
                if raw == "stop" or raw == "signal":
                    return None
                if time.monotonic() - looked >= REARM_S:
                    looked = time.monotonic()
                    if self._watched_moved():
                        return "again"
                if raw == "timeout" or not raw:
                    if not caught_up:  # watching now: look once more at what changed before,
                        caught_up = True  # when the first look began unwatched (or this watch is a retry)
                        if self.listed_unwatched or retry:
                            self._rescan_local()
                        log.debug("watching %s: caught up (its first quiet spell)", ", ".join(paths))
                    continue
                changes = {p for _, p in raw}
                refs = {self.ref_for(p) for p in changes}
                for r in refs:
                    if r:
                        self.changed(r, wait=False)
                # files made in a new folder before the watch on it began send no
                # event of their own: look at new folders once more a little later
                for p in changes:
                    r = self.ref_for(p)
                    if r and os.path.isdir(p):
                        t = threading.Timer(0.5, self.changed, (r,), {"wait": False})
                        t.daemon = True
                        t.start()


def _identity(path: str) -> Optional[tuple[int, int]]:
    """A folder's device and inode (None: no folder there)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
