"""One agent's memory: its places, its index, its notes, its indexing loop.

A :class:`Memory` is shared by every session of its agent in a process. The
index is opened and brought up to date on a background thread, so sessions
answer at once; searches read whatever is committed so far. Changes found by
the watcher, told by a `changed` control or made by `remember` go through
one queue to that same thread, the index's only writer.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from lnkmem.bridges.local import LocalPlace
from lnkmem.bridges.place import Entry
from lnkmem import memtrim
from lnkmem.config import AgentConfig
from lnkmem.index import indexer
from lnkmem.index.store import Store
from lnkmem.notes import LocalNotes

from collections import OrderedDict

log = logging.getLogger("lnkmem")

WATCH_DEBOUNCE_MS = 100
IGNORE_FILES = (".gitignore", ".lnkmemignore")
CANDIDATES = 100  # each ranking's depth before fusion
QUERY_CACHE = 256
EMBED_BATCH = 256
RETRY_S = 5.0  # a first pass that failed is tried again after this long


class NotesPlace:
    """The notes as a place holding one file, ref `notes` (wherever they live)."""

    def __init__(self, notes):
        self.notes = notes
        self.skipped = 0

    def list(self, prefix: str = "") -> list[Entry]:
        e = self.notes.entry()
        return [Entry("", e.size, e.version)] if e else []

    def read(self, path: str = "") -> tuple[bytes, str]:
        return self.notes.read_bytes()

    def stat(self, path: str = "") -> Optional[Entry]:
        e = self.list()
        return e[0] if e else None


@dataclass
class Layout:
    """Where one memory's things live and what it may do with them."""

    places: dict[str, object]
    notes: object = None  # LocalNotes / BridgeNotes, or None: no `remember`
    notes_limit: int = 0
    index_path: str = ""
    replica: object = None  # a sync.Replica: the cache is of this copy
    writes: bool = True  # writes the copy back (False: a team reader)
    embed: Optional[tuple[str, str, Callable[[], dict]]] = None  # (base url, model, headers)
    tmpdir: str = ""


def local_layout(cfg: AgentConfig) -> Layout:
    """An agent on this machine: Home, chats, skills and notes in local folders."""
    notes = LocalNotes(cfg.notes_path, cfg.state) if cfg.notes_path else None
    places: dict[str, object] = {}
    exclude = [cfg.state] + ([cfg.agent] if cfg.agent else [])
    places["home"] = LocalPlace(cfg.folder, exclude=exclude, ignore=True)
    if cfg.agent:
        places["chats"] = LocalPlace(os.path.join(cfg.agent, "chats"))
        places["skills"] = LocalPlace(os.path.join(cfg.agent, "skills"))
    if notes:
        places["notes"] = NotesPlace(notes)
    embed = (cfg.model_url, cfg.spec.model or "default", dict) if cfg.model_url else None
    return Layout(places, notes, cfg.notes_limit, os.path.join(cfg.state, "index"), embed=embed,
                  tmpdir=os.path.join(cfg.state, "tmp"))


class Memory:
    def __init__(self, cfg: AgentConfig, layout: Optional[Layout] = None):
        self.cfg = cfg
        self.layout = layout or local_layout(cfg)
        self.notes = self.layout.notes
        self.notes_limit = self.layout.notes_limit
        self.places = self.layout.places
        self.store: Optional[Store] = None
        self.opened = threading.Event()
        self.ready = threading.Event()  # first full pass done
        self.progress = (0, 0)
        self.error: Optional[str] = None
        self._queue: "queue.Queue[tuple[str, Optional[threading.Event]]]" = queue.Queue()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._watcher: Optional[threading.Thread] = None
        self.tmpdir = self.layout.tmpdir
        self.embedder = None
        self.vindex = None
        self.writeback = None
        self._embed_wake = threading.Event()
        self._qcache: "OrderedDict[str, object]" = OrderedDict()
        if self.layout.embed and self.layout.writes:  # a team reader embeds nothing
            from lnkmem.embed import Embedder
            from lnkmem.index.vectors import VectorIndex
            url, model, headers = self.layout.embed
            try:
                self.embedder = Embedder(url, model, headers=headers)
                self.vindex = VectorIndex()
            except ValueError as e:
                log.warning("no ranking by meaning: %s", e)
        if self.layout.replica is not None and self.layout.writes:
            from lnkmem.sync import WriteBack
            self.writeback = WriteBack(lambda: self.store, self.layout.replica, self.reload_from_copy)

    # --- life ----------------------------------------------------------------

    def start(self, watch: bool = True) -> "Memory":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lnkmem-index", daemon=True)
            self._thread.start()
            if watch:
                self._watcher = threading.Thread(target=self._watch, name="lnkmem-watch", daemon=True)
                self._watcher.start()
        return self

    def stop(self) -> None:
        if self.writeback is not None and self.store is not None:
            err = self.writeback.stop()
            if err:
                log.warning("%s", err)
        self._stop.set()
        self._embed_wake.set()
        self._queue.put(("", None))
        if self._thread:
            self._thread.join(timeout=10)
        if self.store:
            self.store.close()
        if self.embedder:
            self.embedder.close()

    def open_store(self) -> Store:
        os.makedirs(os.path.dirname(self.layout.index_path), mode=0o700, exist_ok=True)
        store = Store.open(self.layout.index_path)
        if store.rebuilt_because:
            log.warning("index was damaged (%s); rebuilding", store.rebuilt_because)
        return store

    def _committed(self) -> None:
        """The index changed: embed what is new, and write the copy back in time."""
        self._embed_wake.set()
        if self.writeback is not None:
            self.writeback.changed()

    def _run(self) -> None:
        try:
            self.store = self.open_store()
            if self.embedder:
                self.vindex.load(self.store)
            self.opened.set()  # searches answer from the cache while the copy is looked at
            if self.layout.replica is not None:
                self._attach()
            self.store.on_commit = self._committed
            if self.writeback is not None:
                self.writeback.start()
            if self.embedder:
                if self.store.use_vector_model(self.embedder.model):
                    log.warning("the model changed to %s: passages are embedded again", self.embedder.model)
                self.vindex.load(self.store)
                threading.Thread(target=self._embed_loop, name="lnkmem-embed", daemon=True).start()
            try:
                self.refresh_all()
            except Exception as e:  # a source failing (a bridge down or talking nonsense): serve, retry
                log.warning("indexing failed: %s; trying again in %gs", e, RETRY_S)
                self._retry_all()
            self.ready.set()
            self._embed_wake.set()
            while not self._stop.is_set():
                ref, done = self._queue.get()
                if self._stop.is_set():
                    break
                refs = {ref}
                events = [done] if done else []
                try:  # take everything queued so far together
                    while True:
                        r, d = self._queue.get_nowait()
                        refs.add(r)
                        if d:
                            events.append(d)
                except queue.Empty:
                    pass
                retry = "\0all" in refs
                if retry:
                    refs.discard("\0all")
                    refs.update(self.places)
                try:
                    if "\0attach" in refs:
                        refs.discard("\0attach")
                        self._attach()
                        refs.add("home")
                    for r in _outermost(refs):
                        self.refresh(r)
                except Exception as e:  # keep serving; the next change retries
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

    def _attach(self) -> None:
        """Make the cache one version of the copy before indexing the sources (§7.2)."""
        from lnkmem.sync import attach
        try:
            how = attach(self.store, self.layout.replica)
            log.info("index copy: %s", how)
        except Exception as e:  # the copy can't be read now: serve the cache, write back later
            log.warning("the index copy could not be read: %s", e)
            return
        if how == "loaded" and self.vindex is not None:
            self.vindex.load(self.store)  # passage ids now name the copy's passages

    def reload_from_copy(self) -> None:
        """Another engine wrote the copy first: take its version, re-apply the sources."""
        self._attach()
        self.refresh_all()

    def _retry_all(self) -> None:
        """Look at every source again a little later."""
        t = threading.Timer(RETRY_S, self._queue.put, (("\0all", None),))
        t.daemon = True
        t.start()

    def reattach(self) -> None:
        """Look at the copy again (a team reader, told of a change)."""
        self._queue.put(("\0attach", None))

    def refresh_all(self, progress: Optional[Callable[[int, int], None]] = None) -> int:
        plan = indexer.plan(self.store, self.places)

        def report(done: int, total: int) -> None:
            self.progress = (done, total)
            if progress:
                progress(done, total)

        self.progress = (0, plan.total)
        try:
            return indexer.build(self.store, self.places, plan, self.tmpdir, report, self._stop.is_set)
        finally:
            if plan.total:
                memtrim.trim()  # the batches' peak goes back to the system

    def refresh(self, ref: Optional[str]) -> None:
        plan = indexer.plan(self.store, self.places, only=ref)
        if plan.total:
            indexer.build(self.store, self.places, plan, self.tmpdir)
            if plan.total > 50:
                memtrim.trim()

    def changed(self, ref: str, wait: bool = True, timeout: float = 30.0) -> bool:
        """Bring ``ref`` (a file or a folder's prefix) up to date in the index."""
        done = threading.Event() if wait else None
        self._queue.put((ref, done))
        return done.wait(timeout) if done else True

    @property
    def indexing(self) -> Optional[tuple[int, int]]:
        if self.ready.is_set():
            return None
        return self.progress

    @property
    def embedding(self) -> Optional[tuple[int, int]]:
        """(passages with a vector, live passages) while some still wait for one;
        None when all have one or no model is served."""
        if self.embedder is None or self.store is None:
            return None
        alive, has = self.store.snapshot.alive, self.vindex.has
        total = int(alive.sum())
        n = min(len(alive), len(has))
        done = int((alive[:n] & has[:n]).sum())
        return (done, total) if done < total else None

    # --- meaning -------------------------------------------------------------

    def _embed_loop(self) -> None:
        """Embed passages that have no vector yet, in the background."""
        while not self._stop.is_set():
            try:
                self._embed_pending()
            except Exception as e:  # keep the thread: the next wake tries again
                log.exception("embedding failed: %s", e)
                self._stop.wait(5)

    def _embed_pending(self) -> None:
        """Wait for a wake-up, then embed every live passage that has no vector."""
        from lnkmem.embed import EmbeddingUnavailable
        self._embed_wake.wait(timeout=5)
        self._embed_wake.clear()
        while not self._stop.is_set():
            todo = self.vindex.missing(self.store.snapshot.alive, EMBED_BATCH)
            passages = self.store.passages_of(todo)
            pids = [p for p, x in zip(todo, passages) if x is not None]
            if not pids:
                return
            texts = [x.text[:2000] for x in passages if x is not None]
            try:
                vecs = self.embedder.embed(texts)
            except EmbeddingUnavailable as e:
                log.info("embedding paused: %s", e)
                self._stop.wait(min(self.embedder.circuit.cooldown, 30))
                self._embed_wake.set()  # try again after the pause
                return
            live = [x for x in passages if x is not None]
            stored = set(self.store.put_vectors(pids, vecs, live))
            keep = [i for i, p in enumerate(pids) if p in stored]
            self.vindex.add([pids[i] for i in keep], vecs[keep])

    def query_vector(self, query: str):
        from lnkmem.embed import EmbeddingUnavailable
        v = self._qcache.get(query)
        if v is not None:
            self._qcache.move_to_end(query)
            return v
        try:
            v = self.embedder.embed([query], patient=False)[0]
        except EmbeddingUnavailable:
            return None
        self._qcache[query] = v
        if len(self._qcache) > QUERY_CACHE:
            self._qcache.popitem(last=False)
        return v

    def rank(self, query: str, limit: int, sources=None, under=None, after: Optional[float] = None,
             before: Optional[float] = None) -> tuple[list[tuple[int, float]], str]:
        """Best (pid, score) pairs and how they were ranked: "meaning+words" only when
        meaning was used for this query (a query vector, and hits by meaning that
        pass the query's exclusions, phrases and dates)."""
        from lnkmem.index import query as qlang
        from lnkmem.index.hybrid import fuse
        from lnkmem.index.search import words as by_words
        q = qlang.parse(query)
        meaning = self.embedder is not None and self.vindex.count() > 0 and bool(q.meaning_text.strip())
        depth = max(limit, CANDIDATES) if meaning else limit
        words, checks = by_words(self.store, q, limit, sources, under, candidates=depth, after=after, before=before)
        if meaning:
            v = self.query_vector(q.meaning_text)
            if v is not None:
                near = self.vindex.search(self.store, v, depth * (4 if checks.any else 1), sources, under)
                near = checks.filter(self.store, near, depth)
                if near:
                    return fuse(words, near)[:limit], "meaning+words"
        return words[:limit], "words"

    # --- watching ------------------------------------------------------------

    def _roots(self) -> list[tuple[str, str]]:
        """(absolute folder, source) of each local place to watch, most specific first."""
        roots = []
        for source in ("chats", "skills", "home"):
            place = self.places.get(source)
            if isinstance(place, LocalPlace):
                roots.append((place.root, source))
        return roots

    def ref_for(self, path: str) -> Optional[str]:
        """The ref of a changed local path, or None when it is not indexed."""
        if isinstance(self.notes, LocalNotes) and path == self.notes.path:
            return "notes"
        state = self.cfg.state
        if path == state or path.startswith(state + os.sep):
            return None
        for root, source in self._roots():
            if path == root or path.startswith(root + os.sep):
                if source == "home" and self.cfg.agent and (path == self.cfg.agent or path.startswith(self.cfg.agent + os.sep)):
                    continue
                rel = os.path.relpath(path, root)
                if rel == ".":
                    return source
                parts = rel.split(os.sep)
                ignorer = getattr(self.places.get(source), "ignore", None)
                if ignorer is not None and parts[-1] in IGNORE_FILES:  # its folder's listing changes
                    folder = "/".join(parts[:-1])
                    return f"{source}/{folder}" if folder else source
                if any(p.startswith(".") for p in parts):
                    return None
                if ignorer is not None and ignorer.ignored("/".join(parts), os.path.isdir(path)):
                    return None
                return f"{source}/{rel.replace(os.sep, '/')}"
        return None

    def _watch(self) -> None:
        self.opened.wait()
        if self.error:
            return
        try:
            import watchfiles
        except ImportError:
            return
        paths = [r for r, _ in self._roots() if os.path.isdir(r)]
        if isinstance(self.notes, LocalNotes):
            d = os.path.dirname(self.notes.path)
            if os.path.isdir(d) and not any(d == p or d.startswith(p + os.sep) for p in paths):
                paths.append(d)
        if not paths:
            return
        caught_up = False
        try:
            for changes in watchfiles.watch(*paths, stop_event=self._stop, debounce=WATCH_DEBOUNCE_MS,
                                            step=20, rust_timeout=300, yield_on_timeout=True,
                                            raise_interrupt=False, watch_filter=None):
                if not changes:
                    if not caught_up:  # watching now: look once more at what changed before
                        caught_up = True
                        for source, place in self.places.items():
                            if isinstance(place, LocalPlace) or isinstance(getattr(place, "notes", None), LocalNotes):
                                self.changed(source, wait=False)
                    continue
                refs = {self.ref_for(p) for _, p in changes}
                for r in refs:
                    if r:
                        self.changed(r, wait=False)
                # files made in a new folder before the watch on it began send no
                # event of their own: look at new folders once more a little later
                for _, p in changes:
                    r = self.ref_for(p)
                    if r and os.path.isdir(p):
                        t = threading.Timer(0.5, self.changed, (r,), {"wait": False})
                        t.daemon = True
                        t.start()
        except Exception as e:  # the watcher is a help, not a need
            log.warning("watching stopped: %s", e)


def _outermost(refs: set[str]) -> list[str]:
    """Drop refs inside another ref of the set."""
    out = []
    for r in sorted(refs, key=len):
        if not any(r == o or r.startswith(o + "/") for o in out):
            out.append(r)
    return out
