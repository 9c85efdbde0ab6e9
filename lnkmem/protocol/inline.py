"""Which searches run on the event loop itself rather than on a pool thread.

A call handed to the pool costs two thread wake-ups (the loop, a pool thread,
the loop again) and, while other calls are under way, its thread shares the
GIL with theirs: a thread that lets go of the GIL (for a read, or numpy) waits
up to the switch interval to have it back. Under `serve-many`'s 50 paced
sessions most of the tail was that: a cheap search took many times its own time
on its thread (bench_many, stage by stage; the figures in docs/BENCHMARKS.md). So a search that is
known to be cheap runs inline, on the loop: nothing to hand over, and searches
one after another instead of sliced together.

Known to be cheap, bounded: its memory is local and settled (its index open,
no copy behind it, no model to ask for a query vector, every place on this
machine: nothing in the search waits for another thread or the network), its
query short and its limit small, and that memory's last ``RECENT`` searches
each took under ``INLINE_MAX_S``. A memory's first ``WARM`` searches, and all
the next ``RECENT`` after any slow one, run on the pool. Every search is
measured by its thread's CPU time, on the pool and inline alike, so that
waiting for the GIL (another thread's search, an index's commit) is not counted
as the search's cost. A memory's very first search is not remembered: it pays
once for what every later search finds ready (its ignore rules read, its lists
decoded, its snapshot's facts: several times a later one's in bench_many's
agents; docs/BENCHMARKS.md), and held the next ``RECENT`` on the pool, where under
many sessions they wait for the GIL behind one another. A search inline holds
the loop (every session's Hellos, controls and answers) no longer than a pool
thread's search already could for one switch interval, except for a search far
slower than its memory's last ``RECENT``; one such sends that memory's next
``RECENT`` back to the pool.
"""

from __future__ import annotations

from collections import deque

from lnkmem.memory.served import ServedMemory

INLINE_MAX_S = 0.005  # the GIL's switch interval: a pool thread may hold the loop off this long today
RECENT = 16  # a memory's searches remembered; one slow among them keeps its searches on the pool
WARM = 4  # a memory's first searches run on the pool: measured before any runs inline
QUERY_MAX = 200  # characters: a longer query (a pasted page) is never run inline
LIMIT_MAX = 20  # hits asked for: more are never run inline


class SearchCosts:
    """What one memory's recent searches cost, in seconds (kept on the loop only)."""

    def __init__(self) -> None:
        self.recent: deque[float] = deque(maxlen=RECENT)
        self.searches = 0
        self.settled_local: bool | None = None  # worked out once: nothing in its searches waits

    def record(self, seconds: float) -> None:
        """A search's CPU seconds (the first search's are not remembered: its cold caches)."""
        self.searches += 1
        if self.searches > 1:
            self.recent.append(seconds)

    def cheap(self) -> bool:
        return self.searches >= WARM and bool(self.recent) and max(self.recent) < INLINE_MAX_S


def settled_local(memory: ServedMemory) -> bool:
    """A memory whose searches wait for nothing: its index open and whole, no copy
    behind it (a team reader looks at the copy again before a search), no model (a
    query vector is asked over HTTP), and every place local (no bridge)."""
    if memory.embedder is not None or memory.layout.replica is not None:
        return False
    return all(bool(p.local) for p in memory.places.values())


def runs_inline(costs: SearchCosts, memory: ServedMemory, args) -> bool:
    """Whether this search (typed ``SearchArgs``) runs on the loop."""
    if not costs.cheap():
        return False
    if len(args.query) > QUERY_MAX or args.limit > LIMIT_MAX:
        return False
    if costs.settled_local is None:
        costs.settled_local = settled_local(memory)
    if not costs.settled_local:
        return False
    if memory.fresh and not memory.ready.is_set():  # a first search waits for the first pass
        return False
    return memory.opened.is_set() and memory.store is not None and not memory.error
