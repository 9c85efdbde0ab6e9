"""One agent's memory: its places, its index, its notes, its indexing loop.

A :class:`Memory` is shared by every session of its agent in a process. The
index is opened and brought up to date on a background thread, so sessions
answer at once; searches read whatever is committed so far. Changes found by
the watcher, told by a `changed` control or made by `remember` go through
one queue to that same thread, the index's only writer.

A memory owns, each in a room of its own: its watcher (``memory/watch.py``),
its embedding loop (``memory/embedloop.py``), its copy's attach and re-check
(``memory/copysync.py``, a bound or team memory) and its temp folder
(``memory/tmpfolder.py``); it hands each what it needs, and they tell it back
through the callbacks it gave them.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from lnkmem.core import memtrim
from lnkmem.memory.config import AgentConfig, FolderRefused
from lnkmem.index.build import indexer
from lnkmem.index.store import Store
from lnkmem.memory.layout import Layout, local_layout
from lnkmem.memory.notes import LocalNotes
from lnkmem.memory import copysync
from lnkmem.memory.embedloop import EmbedLoop
from lnkmem.memory.served import ServedMemory
from lnkmem.memory.tmpfolder import TempFolder
from lnkmem.memory.watch import Watcher

log = logging.getLogger("lnkmem")

CANDIDATES = 100  # each ranking's depth before fusion
RETRY_S = 5.0  # a first pass that failed is tried again after this long
BURST_GATHER_S = 0.02  # more than one change queued: wait this long for the rest of the burst
IDLE_LET_GO_S = 2.0  # no change for this long: the map's pages that searches touched are let go
WATCH_WAIT_S = 10.0  # the first look at the tree waits this long at most for the watch to be in place
ANSWERS_FIRST_S = 5.0  # the first look at the sources waits this long at most for the searches waiting then


class Command(enum.Enum):
    """What the indexing thread is asked besides bringing refs up to date (its queue holds
    refs, :class:`ChangedPath` and these)."""

    WAKE = "wake"  # nothing to do: look at the stop flag (a close)
    LET_GO = "let go"  # let go of the map's pages searches touched
    REBUILD = "rebuild"  # the index was found damaged: made anew
    RELIST_ALL = "relist all"  # every source looked at again (after a failure)
    ATTACH = "attach"  # the copy's version asked for again (and a newer one loaded)
    RELOAD = "reload"  # the write-back met a newer version (412): loaded, the sources re-applied, here


@dataclass(frozen=True)
class ChangedPath:
    """A `changed` control's path as Link names it, resolved on the indexing thread."""

    path: str


class Memory(ServedMemory):
    """One agent's (or team's) memory; what the protocol layer reads of it before a
    call is :class:`ServedMemory`'s."""

    def __init__(self, cfg: AgentConfig, layout: Optional[Layout] = None):
        self.cfg = cfg
        self.refused: Optional[str] = None  # why this memory is not served (a folder through a link)
        if layout is None:
            try:
                layout = local_layout(cfg)
            except FolderRefused as e:
                self.refused = str(e)
                layout = Layout({})
        self.layout = layout
        self.notes = self.layout.notes
        self.notes_limit = self.layout.notes_limit
        self.places = self.layout.places
        self.store: Optional[Store] = None
        self.opened = threading.Event()
        self.ready = threading.Event()  # first full pass done
        self.progress = (0, 0)
        self.fresh = False  # the index held nothing when opened: a first search waits for the first pass
        self.error: Optional[str] = None
        self._queue: "queue.Queue[tuple[str | Command | ChangedPath, Optional[threading.Event]]]" = queue.Queue()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.watcher: Optional[Watcher] = None  # its local folders watched (start)
        # documents are converted through temp files in a folder of this process's
        # own: what a killed process left there is removed at the next start
        self.tmp = TempFolder(self.layout.tmpdir)
        self.embedder = None
        self.vindex = None
        self.writeback = None
        self._embed_wake = threading.Event()
        if self.layout.embed and self.layout.writes:  # a team reader embeds nothing
            from lnkmem.bridges.embed import Embedder
            from lnkmem.index.rank.vectors import VectorIndex
            url, model, headers = self.layout.embed
            try:
                self.embedder = Embedder(url, model, headers=headers)
                # its approximate index, past a threshold, is a cache beside the LMDB
                # environment (never in a bound memory's copy)
                self.vindex = VectorIndex(os.path.join(os.path.dirname(self.layout.index_path), "vectors.ann"))
            except ValueError as e:
                log.warning("no ranking by meaning: %s", e)
        # passages embedded in the background, a query's vector
        self.embeds = (EmbedLoop(self.embedder, self.vindex, lambda: self.store, self._stop, self._embed_wake)
                       if self.embedder is not None else None)
        # the cache kept one version of the copy (a bound or team memory)
        self.copy_sync = (copysync.CopySync(self.layout.replica, self.places, self._stop)
                          if self.layout.replica is not None else None)
        if self.layout.replica is not None and self.layout.writes:
            from lnkmem.replica.sync import StateFile, WriteBack
            # (held back while the first look at the sources is under way: one copy is written
            # once it is done, not a partial one after another; a flush then says it is partial)
            self.writeback = WriteBack(lambda: self.store, self.layout.replica, self.reload_from_copy,
                                       on_state=StateFile(os.path.dirname(self.layout.index_path)),
                                       held=lambda: not self.ready.is_set())

    # --- life ----------------------------------------------------------------

    def start(self, watch: bool = True) -> "Memory":
        if self.refused:
            self.error = self.refused
            self.opened.set()
            self.ready.set()
            return self
        if self._thread is None:
            if watch:  # (made before the indexing thread, which waits for it to be in place)
                self.watcher = Watcher(self.places, self.changed, self._stop, self._opened_well, self.cfg.state,
                                       self.cfg.agent, self.notes.path if isinstance(self.notes, LocalNotes) else None,
                                       self.layout.state_fd)
            self._thread = threading.Thread(target=self._run, name="lnkmem-index", daemon=True)
            self._thread.start()
            if self.watcher is not None:
                self.watcher.start()
            for place in self.places.values():  # a source kept by a loop of its own (a store driver, §3.5)
                place.serve(self)
        return self

    answers_first = None  # a served.Searches: the first look at the sources waits until none of them does

    def _after_answers(self) -> None:
        """Wait (at most ANSWERS_FIRST_S) for the searches waiting on an index opened as it was
        left: they are answered from it before the watch is placed and the sources are looked at
        (both share the GIL with them; placing the watch holds it for the whole walk of the
        folders). A fresh index's first search waits for that look: nothing is waited for then."""
        if self.answers_first is not None and not self.fresh and self.error is None:
            self.answers_first.none_waiting(ANSWERS_FIRST_S)

    def _opened_well(self) -> bool:
        """Wait for the index to be opened, and for the searches waiting on it; whether it was
        opened (the watch keeps it up to date)."""
        self.opened.wait()
        self._after_answers()
        return self.error is None

    closing = False  # stop() began: an LMDB error from here on is the close's, not damage

    def stop(self) -> None:
        self.closing = True
        for place in self.places.values():
            place.stop()
        if self.writeback is not None and self.store is not None:
            err = self.writeback.stop()
            if err:
                log.warning("%s", err)
        self._stop.set()
        self._embed_wake.set()
        self._queue.put((Command.WAKE, None))
        if self.store:
            self.store.stop_merger()  # a merge under way stops at its next step
        if self._thread:
            self._thread.join(timeout=10)
        if self.vindex is not None:
            self.vindex.close()
        if self.store:
            self.store.close()
        if self.embedder:
            self.embedder.close()
        self.tmp.remove()
        if self._thread is None or not self._thread.is_alive():
            self.tmp.let_go()  # (a thread still running may still write through it: then kept)

    @property
    def tmpdir(self) -> str:
        """This process's folder for conversions' temp files ("": none)."""
        return self.tmp.path

    def _open_when_let_go(self) -> Store:
        """The index opened; while another memory of this process still holds it (one whose
        binding ended and is still stopping: a write-back held by a stalled bridge), waited
        for, up to INDEX_HELD_WAIT_S, rather than refused for good."""
        from lnkmem.index.store import IndexInUse
        deadline = time.monotonic() + INDEX_HELD_WAIT_S
        told = False
        while True:
            try:
                return Store.open(self.layout.index_path)
            except IndexInUse:
                if time.monotonic() >= deadline or self._stop.is_set():
                    raise
                if not told:
                    log.info("the index is still held by a memory that is stopping: waiting for it")
                    told = True
                self._stop.wait(0.2)

    def open_store(self) -> Store:
        os.makedirs(os.path.dirname(self.layout.index_path), mode=0o700, exist_ok=True)
        self.tmp.open(getattr(self.notes, "state", None) if isinstance(self.notes, LocalNotes) else None)
        t = time.monotonic()
        # the index's folder: opened by Store once, never through a link (a link or what is
        # not a folder found there is removed and the index made anew, never followed)
        store = self._open_when_let_go()
        Store.discard_beside(self.layout.index_path)  # a load beside it cut short, or the version it replaced
        if store.rebuilt_because:
            log.warning("index was damaged (%s); rebuilding", store.rebuilt_because)
        elif store.opened_as == "checked":
            log.info("index opened in %.2fs: not closed cleanly, so read whole and its tables cross-checked",
                     time.monotonic() - t)
        elif store.opened_as == "sealed":
            log.info("index opened in %.2fs: closed cleanly, not checked again%s", time.monotonic() - t,
                     "; its snapshot as saved at that close" if store.snapshot_saved else "")
        store.events.damaged = self._damaged
        store.events.allocated = self._forget_vectors
        store.events.map_grown = self._map_grown
        return store

    _letting_go = False  # a let-go of the map is queued

    def _map_grown(self) -> None:
        """Searches mapped many of the map's pages: let go of them on the indexing thread."""
        if not self._letting_go:
            self._letting_go = True
            self._queue.put((Command.LET_GO, None))

    def _forget_vectors(self, pids: list[int]) -> None:
        """Ids given to new passages (ids are reused): no vector held for them is theirs."""
        if self.vindex is not None:
            self.vindex.forget(pids)

    def _damaged(self, why: str) -> None:
        """The index was found damaged while serving: rebuild it on the indexing thread."""
        if self.closing:  # a call still under way met the index being closed: no damage
            log.debug("an index call met the close: %s", why)
            return
        log.warning("the index is damaged (%s); rebuilding it from the sources", why)
        self._queue.put((Command.REBUILD, None))

    def _rebuild(self) -> None:
        """Start the index anew from the sources (and the copy, for a bound memory)."""
        from lnkmem.index.lmdbfile import wipe
        old = self.store
        if old is not None and old.damaged is None:
            return  # already rebuilt
        self.ready.clear()
        on_commit = old.events.committed if old is not None else None
        if old is not None:
            try:
                old.close()
            except Exception as e:  # its file may be unreadable: it is wiped anyway
                log.debug("closing the damaged index: %s", e)
        wipe(self.layout.index_path)
        store = self.open_store()
        if self.vindex is not None:
            if self.embedder is not None:
                store.use_vector_model(self.embedder.model)
            self.vindex.load(store)
        self.store = store
        if self.layout.replica is not None:
            self._attach()
        store.events.committed = on_commit
        store.start_merger()
        try:
            self.refresh_all()
        finally:
            self.ready.set()

    def _committed(self) -> None:
        """The index changed: embed what is new, and write the copy back in time."""
        self._embed_wake.set()
        if self.writeback is not None:
            self.writeback.changed()

    def _drain(self, refs: set, events: list) -> None:
        """Add what waits in the queue to ``refs`` and ``events``, without waiting."""
        try:
            while True:
                r, d = self._queue.get_nowait()
                refs.add(r)
                if d:
                    events.append(d)
        except queue.Empty:
            pass

    def _run(self) -> None:
        from lnkmem.memory import changes
        try:
            self.store = self.open_store()
            self.fresh = self.store.snapshot.live == 0
            if self.embedder:
                self.vindex.load(self.store)
            self.opened.set()  # searches answer from the cache while the copy is looked at
            self._after_answers()  # (those waiting now first: then the copy, the merger, the sources)
            how = self._attach() if self.layout.replica is not None else None
            self.store.events.committed = self._committed
            # merges off this thread: a change never waits behind one. After a load of the
            # copy, from the first look at the sources on: the copy's segments merged while
            # the Home is listed made the first answer later (10x: seconds of merging) and the
            # peak the sum of both
            merging_later = how == "loaded"
            self.store.start_merger(look=not merging_later)
            if self.writeback is not None:
                self.writeback.start()
            if self.layout.replica is not None:
                self.copy_sync.start(lambda: self.store, lambda: self._queue.put((Command.ATTACH, None)))
            if self.embedder:
                if self.store.use_vector_model(self.embedder.model):
                    log.warning("the model changed to %s: passages are embedded again", self.embedder.model)
                self.vindex.load(self.store)
                self.embeds.start()
            # the watch first (it takes a while on a large tree), so nothing changed during the first look is
            # missed and no second look over the whole tree is needed after it
            if self.watcher is not None:
                self.watcher.wait_in_place(WATCH_WAIT_S)
            try:
                self.refresh_all()
            except Exception as e:  # a source failing (a bridge down or talking nonsense): serve, retry
                log.warning("indexing failed: %s; trying again in %gs", e, RETRY_S)
                self._retry_all()
            self.ready.set()
            if merging_later:
                self.store.maybe_merge()  # (wakes the merger)
            self._embed_wake.set()
            while not self._stop.is_set():
                try:
                    ref, done = self._queue.get(timeout=IDLE_LET_GO_S)
                except queue.Empty:
                    # quiet: the pages searches mapped (the kernel maps 64 KiB of neighbours
                    # with each one read) go back, so a serve at rest holds what it needs
                    self.store.let_go_of_map()
                    self._trim_at_rest()
                    continue
                if self._stop.is_set():
                    break
                refs = {ref}
                events = [done] if done else []
                self._drain(refs, events)  # take everything queued so far together
                refs.discard(Command.WAKE)
                if Command.LET_GO in refs:  # (first: it is no change to gather a burst of)
                    refs.discard(Command.LET_GO)
                    self._letting_go = False
                    self.store.let_go_of_map()
                if len(refs) > 1 and not self._stop.is_set():  # a burst: let the rest of it arrive
                    self._stop.wait(BURST_GATHER_S)
                    self._drain(refs, events)
                if Command.REBUILD in refs:
                    refs.discard(Command.REBUILD)
                    try:
                        self._rebuild()
                    except Exception as e:  # the disk, say: try again a little later
                        log.exception("rebuilding the index failed: %s", e)
                        t = threading.Timer(RETRY_S, self._queue.put, ((Command.REBUILD, None),))
                        t.daemon = True
                        t.start()
                retry = Command.RELIST_ALL in refs
                if retry:
                    refs.discard(Command.RELIST_ALL)
                    refs.update(self.places)
                reload = Command.RELOAD in refs  # (the write-back waits for it, holding its lock)
                attach = reload or Command.ATTACH in refs
                refs.discard(Command.ATTACH)
                refs.discard(Command.RELOAD)
                paths = {r.path for r in refs if isinstance(r, ChangedPath)}
                refs = {r for r in refs if isinstance(r, str)}  # the refs left
                try:
                    if attach:
                        # a reader told of changes the copy may not hold yet (§5.5: it searches
                        # the copy plus what changed in the folder since) lists them again over a
                        # newer version; one that was not lists nothing
                        told = not self.layout.writes and copysync.committed_since_copy(self.store)
                        how = self._attach(for_write_back=reload)
                        if how == "damaged" or (how == "loaded" and (self.layout.writes or told
                                                                     or copysync.partial(self.store))):
                            refs.update(self.places)  # the sources over the version now held
                        elif how == "applied" and told:
                            refs.update(self.places)
                        elif how == "applied":  # the files both changed: their sources say which is right
                            refs.update(self.copy_sync.touched)
                        elif how == "missing" and not self.layout.writes:
                            refs.add("home")  # a reader with no copy to read: the folder itself
                        # (a reader's copy unchanged (304) or a newer one loaded: nothing listed;
                        # the copy is what its writers indexed, and a `changed` is looked at; a
                        # writer's newer version applied as a change keeps its own changes)
                    told = {p: changes.candidates(p, self.places) for p in paths}
                    before = {p for p, cands in told.items() if any(changes.known(self.store, c) for c in cands)}
                    for cands in told.values():
                        refs.update(cands)
                    failed = None
                    looked = changes.coalesce(refs, [s for s, p in self.places.items() if p.local])
                    for r in looked:
                        try:  # one source failing (its bridge down) does not hold back the others
                            self.refresh(r)
                        except Exception as e:
                            failed = failed or e
                    # a path that named nothing known, before or now: its folder, else its source, again
                    wider = set()
                    for p, cands in told.items():
                        if not cands or p in before or any(changes.known(self.store, c) for c in cands):
                            continue
                        for c in cands:
                            folder = changes.parent(c)  # a source's root needs no look at what is known
                            wider.add(folder if "/" not in folder or changes.known(self.store, folder)
                                      else folder.split("/", 1)[0])
                    for r in _outermost(wider):
                        if not any(r == o or r.startswith(o + "/") for o in looked):
                            try:
                                self.refresh(r)
                            except Exception as e:
                                failed = failed or e
                    if failed is not None:
                        raise failed
                except Exception as e:  # keep serving; the next change retries
                    if self.store.damaged is None:  # (a damaged index is rebuilt: queued already)
                        log.exception("indexing failed: %s", e)
                        if retry:
                            self._retry_all()
                for d in events:
                    d.set()
                self._embed_wake.set()
        except Exception as e:
            self.error = f"the index could not be opened: {e}"
            log.exception("index thread failed")
            self.opened.set()
            self.ready.set()

    def _attach(self, for_write_back: bool = False) -> Optional[str]:
        """Make the cache one version of the copy before indexing the sources (§7.2,
        :meth:`copysync.CopySync.attach`). ``for_write_back``: asked by the write-back, which holds its
        lock and waits (:meth:`reload_from_copy`)."""
        lock = self.writeback.lock if self.writeback is not None and not for_write_back else None
        width = (self.embedder.model, self.embedder.dim) if self.embedder and self.embedder.dim else None
        how = self.copy_sync.attach(self.store, width, self._serve_loaded, lock)
        if how is None:
            return None
        if how == "loaded" and self.vindex is not None:
            self.vindex.load(self.store)  # passage ids now name the copy's passages
        if how != "reused" and self.writeback is not None:
            self.writeback.look()  # (no commit said so: a copy missing, damaged or loaded)
        return how

    def _serve_loaded(self, store: Store) -> None:
        """A newer version of the copy, loaded beside the index, served in its place."""
        if self.closing:  # stop() closed, or is closing, the store it knew: this one too
            store.close()
        else:
            self.store = store

    def check_copy(self, timeout: float = 5.0) -> None:
        """A team reader, before a search: look at the copy again when the last look is
        older than the re-check interval, and wait (a while) for a newer version."""
        if self.layout.replica is None or self.layout.writes or not self.ready.is_set():
            return  # (before the copy's code is imported: a local memory's first search needs none of it)
        if not self.copy_sync.due():
            return
        done = threading.Event()
        self._queue.put((Command.ATTACH, done))
        done.wait(timeout)

    def reload_from_copy(self) -> None:
        """Another engine wrote the copy first (the write-back met a 412): its version taken and
        the sources re-applied over it by the indexing thread, the one writer of the index (the
        write-back waits); here only when that thread is gone (a close)."""
        done = threading.Event()
        self._queue.put((Command.RELOAD, done))
        while not done.wait(0.5):
            if self._thread is None or not self._thread.is_alive():
                self._attach(for_write_back=True)
                self.refresh_all()
                return

    def _retry_all(self) -> None:
        """Look at every source again a little later."""
        t = threading.Timer(RETRY_S, self._queue.put, ((Command.RELIST_ALL, None),))
        t.daemon = True
        t.start()

    def reattach(self) -> None:
        """Look at the copy again (a team reader, told of a change)."""
        self._queue.put((Command.ATTACH, None))

    def refresh_all(self, progress: Optional[Callable[[int, int], None]] = None) -> int:
        failed: list[Exception] = []  # a source that cannot be listed does not hold back the others
        plan = indexer.plan(self.store, self.places, errors=failed)

        def report(done: int, total: int) -> None:
            self.progress = (done, total)
            if progress:
                progress(done, total)

        self.progress = (0, plan.total)
        log.debug("looked at every source: %d files listed, %d to index, %d removed",
                  plan.listed, plan.total, len(plan.removed))
        try:
            done = indexer.build(self.store, self.places, plan, self.tmpdir, report, self._stop.is_set)
        finally:  # the batches' peak goes back to the system (and the floor for later changes is set)
            self._trim_if_grown(force=bool(plan.total))
        if failed:
            raise failed[0]  # the caller retries later
        return done

    def refresh(self, ref: Optional[str]) -> None:
        plan = indexer.plan(self.store, self.places, only=ref)
        log.debug("looked at %s: %d files listed, %d to index, %d removed", ref, plan.listed, plan.total,
                  len(plan.removed))
        if plan.total:
            indexer.build(self.store, self.places, plan, self.tmpdir)
            self._trim_if_grown(force=plan.total > 50)
            self.store.let_go_of_map()  # serve's memory does not grow with each change (issue 12)

    _anon_floor = 0  # bytes of anonymous memory held after the last trim

    _rest_mark = 0.0  # the last search (Store.read_at) before the last trim at rest

    def _trim_at_rest(self) -> None:
        """No change queued and no search for :data:`IDLE_LET_GO_S`, but searches since the
        last time: the heap that they (and any change) freed goes back now, when no search
        waits for the trim. At 1.27M passages a serve after its searches and a few changes
        held tens of MiB of freed heap (docs/BENCHMARKS.md)."""
        read = self.store.read_at
        if read != self._rest_mark and time.monotonic() - read >= IDLE_LET_GO_S:
            self._rest_mark = read
            self._trim_if_grown(force=True)

    def _trim_if_grown(self, force: bool = False) -> None:
        """Give the heap back when a change's work left it larger (a merge in the change's
        path: at 1x RssAnon stayed several times higher until trimmed). A trim costs tens of
        ms on a fragmented heap, so not after every one-file change: only past a slack."""
        anon = _anon_bytes()
        if force or (anon is not None and anon > self._anon_floor + TRIM_SLACK):
            memtrim.trim()
            self._anon_floor = _anon_bytes() or 0
            log.debug("heap trimmed: %d -> %d MiB not backed by a file", (anon or 0) >> 20, self._anon_floor >> 20)

    def changed_path(self, path: str, done) -> None:
        """A `changed` control's path as Link names it (§5.6, lnkmem.memory.changes);
        ``done.set()`` is called once it is in the index (no thread waits for it)."""
        chats = self.places.get("chats")
        if chats is not None and path.split("/", 1)[0] == "chats":
            # (a store driver's conversations, §3.5: listed again first, then looked at in the copy)
            chats.before_change(lambda: self._queue.put((ChangedPath(path), done)))
            return
        self._queue.put((ChangedPath(path), done))

    def changed(self, ref: str, wait: bool = True, timeout: float = 30.0, done=None) -> bool:
        """Bring ``ref`` (a file or a folder's prefix) up to date in the index; ``done``
        (anything with ``set()``) is set once it is, for a caller that must not block."""
        if done is None and wait:
            done = threading.Event()
        self._queue.put((ref, done))
        if not wait:
            return True
        return done.wait(timeout)

    @property
    def conversations(self) -> Optional[str]:
        """A store driver's state for a search (§4.1 rev. 3): "refreshing",
        "unavailable: <why>", or None (no driver, or all is well)."""
        chats = self.places.get("chats")
        return chats.status() if chats is not None else None

    def conversations_idle(self) -> bool:
        """No store driver listing under way (a search waits for one, at most 2 s)."""
        chats = self.places.get("chats")
        return chats is None or chats.listing_idle()

    @property
    def indexing(self) -> Optional[tuple[int, int]]:
        if self.ready.is_set():
            return None
        return self.progress

    @property
    def embedding(self) -> Optional[tuple[int, int]]:
        """(passages with a vector, live passages) while some still wait for one;
        None when all have one or no model is served."""
        return self.embeds.progress() if self.embeds is not None else None

    # --- ranking -------------------------------------------------------------

    def rank(self, query: str, limit: int, sources=None, under=None, after: Optional[float] = None,
             before: Optional[float] = None, store: Optional[Store] = None) -> tuple[list[tuple[int, float]], str]:
        """Best (pid, score) pairs and how they were ranked: "meaning+words" only when
        meaning was used for this query (a query vector, and hits by meaning that
        pass the query's exclusions, phrases and dates). ``store``: the one whose
        passages the caller looks the ids up in (a newer version of the copy may take
        the index's place meanwhile); else the copy is looked at first (a team reader's)
        and the index then served is ranked."""
        from lnkmem.index.text import query as qlang
        from lnkmem.index.rank.hybrid import fuse
        from lnkmem.index.rank.search import scores_of
        from lnkmem.index.rank.search import words as by_words
        from lnkmem.index.lmdbfile import DAMAGE_ERRORS
        if store is None:
            self.check_copy()
            store = self.store
        q = qlang.parse(query)
        meaning = self.embedder is not None and self.vindex.count() > 0 and bool(q.meaning_text.strip())
        depth = max(limit, CANDIDATES) if meaning else limit
        try:
            words, checks = by_words(store, q, limit, sources, under, candidates=depth, after=after, before=before)
        except DAMAGE_ERRORS as e:  # a page found damaged under the search: this call fails, the index is rebuilt
            raise store.damage(e) from None
        except Exception:
            store.check_map()  # a page cut away under the search: damage, not this error
            raise
        store.check_map()
        if meaning:
            v = self.embeds.query_vector(q.meaning_text)
            if v is not None:
                near = self.vindex.search(store, v, depth * (4 if checks.any else 1), sources, under)
                near = checks.filter(store, near, depth)
                if near:
                    # every passage of the union scored by both rankings: BM25 for those
                    # only meaning found, cosine for those only words found
                    vindex = self.vindex
                    try:
                        fused = fuse(words, near, words_of=lambda pids: scores_of(store, q, pids),
                                     meaning_of=lambda pids: vindex.cosines(v, pids))
                    except DAMAGE_ERRORS as e:
                        raise store.damage(e) from None
                    store.check_map()
                    return fused[:limit], "meaning+words"
        return words[:limit], "words"


INDEX_HELD_WAIT_S = 60.0  # the index held by another memory of this process (stopping): waited for this long


TRIM_SLACK = 32 << 20


def _anon_bytes() -> Optional[int]:
    """This process's resident memory not backed by a file (no /proc: None)."""
    held = memtrim.resident()
    return held[0] if held is not None else None


def _outermost(refs: set[str]) -> list[str]:
    """Drop refs inside another ref of the set."""
    out = []
    for r in sorted(refs, key=len):
        if not any(r == o or r.startswith(o + "/") for o in out):
            out.append(r)
    return out
