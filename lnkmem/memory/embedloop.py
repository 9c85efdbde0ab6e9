"""A memory's passages embedded in the background, and a query's vector.

An :class:`EmbedLoop` is owned by a :class:`lnkmem.memory.memory.Memory` that Link serves a
model to, and given what it needs: the model's client (``lnkmem.bridges.embed``), the
vectors' index (``lnkmem.index.rank.vectors``), a way to the memory's index as it is now
(a copy's newer version may take its place), the memory's stop event, and the event that
wakes it (set at each commit). On its thread it embeds every live passage that has no
vector yet, a batch at a time, pausing while the model is unavailable.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Callable, Optional

log = logging.getLogger("lnkmem")

QUERY_CACHE = 256
EMBED_BATCH = 256


class EmbedLoop:
    """Passages embedded on a thread of their own; the vectors of recent queries kept."""

    def __init__(self, embedder, vindex, store: Callable, stop: threading.Event, wake: threading.Event):
        self.embedder = embedder
        self.vindex = vindex
        self.store = store  # the memory's index now (None before it is opened)
        self.stop = stop
        self.wake = wake
        self._qcache: "OrderedDict[str, object]" = OrderedDict()

    def start(self) -> None:
        threading.Thread(target=self._embed_loop, name="lnkmem-embed", daemon=True).start()

    def progress(self) -> Optional[tuple[int, int]]:
        """(passages with a vector, live passages) while some still wait for one;
        None when all have one (or the index is not open yet)."""
        store = self.store()
        if store is None:
            return None
        alive, has = store.snapshot.alive, self.vindex.has
        total = int(alive.sum())
        n = min(len(alive), len(has))
        done = int((alive[:n] & has[:n]).sum())
        return (done, total) if done < total else None

    def _embed_loop(self) -> None:
        """Embed passages that have no vector yet, in the background."""
        while not self.stop.is_set():
            try:
                self._embed_pending()
            except Exception as e:  # keep the thread: the next wake tries again
                log.exception("embedding failed: %s", e)
                self.stop.wait(5)

    def _embed_pending(self) -> None:
        """Wait for a wake-up, then embed every live passage that has no vector."""
        from lnkmem.bridges.embed import EmbeddingUnavailable
        self.wake.wait(timeout=5)
        self.wake.clear()
        while not self.stop.is_set():
            todo = self.vindex.missing(self.store().snapshot.alive, EMBED_BATCH)
            passages = self.store().passages_of(todo)
            pids = [p for p, x in zip(todo, passages) if x is not None]
            if not pids:
                return
            texts = [x.text[:2000] for x in passages if x is not None]
            try:
                vecs = self.embedder.embed(texts)
            except EmbeddingUnavailable as e:
                log.info("embedding paused: %s", e)
                self.stop.wait(min(self.embedder.circuit.cooldown, 30))
                self.wake.set()  # try again after the pause
                return
            live = [x for x in passages if x is not None]
            stored = set(self.store().put_vectors(pids, vecs, live))
            keep = [i for i, p in enumerate(pids) if p in stored]
            self.vindex.add([pids[i] for i in keep], vecs[keep])

    def query_vector(self, query: str):
        """The model's vector for a query (the last QUERY_CACHE kept); None while the
        model is unavailable (a search then ranks by words alone)."""
        from lnkmem.bridges.embed import EmbeddingUnavailable
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
