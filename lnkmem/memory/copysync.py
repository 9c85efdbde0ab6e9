"""A bound (or team) memory's cache kept one version of its copy (§7.2).

A :class:`CopySync` is owned by a :class:`lnkmem.memory.memory.Memory` whose layout has a
copy, and given what it needs: the copy (``lnkmem.replica.sync.Replica``), the memory's
places and its stop event. It attaches the cache to a version of the copy (the
memory's indexing thread asks it to, the one writer of the index), asks for the copy's
version again now and then on a thread of its own (rev. 2: an unchanged copy costs one
304, and the indexing thread nothing), and says when a team reader's search should look
again. What the version the cache holds says is read by :func:`committed_since_copy` and
:func:`partial`. The copy's code (``lnkmem.replica``) is imported only when it is used: a
local memory never imports it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Mapping, Optional

from lnkmem.core import memtrim

log = logging.getLogger("lnkmem")


class CopySync:
    """The cache attached to a version of the copy, and the copy's version asked for again."""

    def __init__(self, replica, places: Mapping, stop: threading.Event):
        self.replica = replica
        self.places = places  # the memory's sources by name
        self.stop = stop
        self.last_check = 0.0  # when the copy's version was last asked for
        self.touched: tuple = ()  # the last version applied as a change: the files both it and the cache changed

    def attach(self, old, width, serve: Callable, lock=None) -> Optional[str]:
        """Make the cache ``old`` one version of the copy (``lnkmem.replica.sync.attach``): how
        ("reused", "loaded", "applied", "damaged", "missing"), or None when it was not looked at.

        ``serve(store)`` puts a newer version's store in ``old``'s place, before ``lock`` (the
        write-back's, when it is not the write-back that asks) lets a write-back read the index.
        Never between a write-back's PUT and its record: a re-check while a write-back is under
        way is skipped (the write-back meets any newer version itself: 412), so indexing never
        waits behind the network. ``width``: the model's (name, dimension) when vectors are kept."""
        from lnkmem.replica.sync import attach
        self.last_check = time.monotonic()
        if lock is not None and not lock.acquire(blocking=False):
            log.debug("the copy's re-check skipped: a write-back is under way")
            return None
        try:
            # a newer version is loaded beside the index (bounded memory; searches answer
            # the version held meanwhile) and put in its place (with its events and merger)
            how, store, self.touched = attach(old, self.replica, set(self.places), width, beside=True,
                                              changes=True)  # what changed only, where it can
            if store is not old:  # served before the lock lets a write-back read the index
                serve(store)
            log.info("index copy: %s", how)
            if store is not old:  # the old store let go of here (the searches on it end soon), and
                old = store = None  # what it and the load held handed back before the sources are listed
                memtrim.trim()
        except Exception as e:  # the copy can't be read now (a bridge down): serve the cache, write back later
            log.warning("the index copy could not be read: %s", e)
            return None
        finally:
            if lock is not None:
                lock.release()
        return how

    def start(self, store: Callable, ask: Callable[[], None]) -> None:
        """Ask for the copy's version again now and then while serving; ``ask()`` (the memory's
        indexing thread attaches again) when it is another than the one ``store()`` is of."""
        threading.Thread(target=self._recheck_loop, args=(store, ask), name="lnkmem-recheck", daemon=True).start()

    def _recheck_loop(self, store: Callable, ask: Callable[[], None]) -> None:
        """While serving, ask for the copy's version again now and then (§7.2 rev. 2):
        an unchanged copy costs one 304; a newer one is loaded."""
        from lnkmem.replica.sync import recheck
        every = recheck()
        while not self.stop.wait(max(every - (time.monotonic() - self.last_check), 0.05)):
            if time.monotonic() - self.last_check >= every:
                self.last_check = time.monotonic()  # queued: not again before it is done
                if self.moved(store()):  # (asked here: an unchanged copy's 304 costs the indexing thread nothing)
                    ask()

    def moved(self, store) -> bool:
        """Whether the copy is another version than the one ``store`` is of (its manifest asked
        with `If-None-Match`); False when the bridge cannot say now (asked again later)."""
        from lnkmem.bridges.place import NotFound
        from lnkmem.replica.manifest import CopyDamaged
        from lnkmem.replica.state import copy_state
        try:
            manifest, _ = self.replica.manifest(copy_state(store).version)
        except (NotFound, CopyDamaged):
            return True  # (attach says what it is)
        except Exception as e:
            log.debug("the copy's re-check: %s", e)
            return False
        return manifest is not None

    def due(self) -> bool:
        """Whether the last look at the copy is older than the re-check interval (a team
        reader's search looks again then); the look is counted as made now."""
        from lnkmem.replica.sync import recheck
        if time.monotonic() - self.last_check < recheck():
            return False
        self.last_check = time.monotonic()
        return True


def committed_since_copy(store) -> bool:
    """Whether the index holds commits of its own since the version of the copy it is of."""
    from lnkmem.replica.state import content_gen_of, copy_state
    try:
        return copy_state(store).content_gen != content_gen_of(store)
    except Exception:  # (a damaged index: rebuilt meanwhile)
        return False


def partial(store) -> bool:
    """Whether the version the cache now holds says it was written before its writer's first
    look at the sources was done (a reader reads the rest from the sources)."""
    from lnkmem.replica.state import copy_state
    return copy_state(store).partial
