"""A whole new version of an index, loaded beside it and put in its place.

A copy's version is written into a new, empty index in the folder beside the index's
(:data:`BESIDE`, :func:`open_beside`) while the index is searched; then the two folders swap
names in one step (:func:`replace`): a process killed at any moment leaves the index one whole
version, and what is left beside is removed at the next :func:`discard`. The store replaced is
retired: the reads under way on it see the version it held, and it is never sealed.

Each function takes the :class:`~lnkmem.index.store.Store` it is asked through and, where a
store is opened, the opener (``Store`` or ``Store.open``): this module sits below the store.
"""

from __future__ import annotations

from typing import Callable

from lnkmem.core import atomic
from lnkmem.index import lmdbfile

BESIDE = ".next"  # the folder beside the index's a new version is loaded into (path + BESIDE)


def discard(path: str) -> None:
    """Remove what a load beside the index at ``path`` left (a process killed during it,
    or the version it replaced); a link by that name is removed, never followed."""
    atomic.remove(path + BESIDE)  # (a folder removed from its descriptor down: nothing below followed)


def open_beside(store, make: Callable):
    """A new, empty index (``make(path)``) in the folder beside ``store``'s, anything found
    there first removed; None where the system cannot swap two folders' names in one step
    (nothing is left beside)."""
    discard(store.path)
    side = make(store.path + BESIDE)
    if not lmdbfile.can_exchange_folders(side.here):
        side.close()
        discard(store.path)
        return None
    return side


def replace(store, side, reopen: Callable):
    """Put ``side`` (:func:`open_beside`, loaded) in ``store``'s place and return it, opened
    there by ``reopen(path)``: ``side`` closed (sealed), the folders swapped in one step,
    ``store`` retired (its events handed to the new one, which merges if ``store`` did);
    :meth:`Store.replaced_by <lnkmem.index.store.Store.replaced_by>` says the whole of it.
    OSError (the folders as they were, ``side`` closed) where they cannot swap in one step."""
    where = side.path
    side.close()
    merging = store.merger.thread is not None
    store.merger.stop()
    with store.write_lock:  # (no commit of this store between the swap and the retirement)
        # first: its guard no longer looks at the file by its folder's name, and a read
        # that looked just before and met the other file tells nobody
        events, store.events, store.retired = store.events, type(store.events)(), True
        try:
            swapped = atomic.exchange(store.path, where)
        except OSError:
            swapped = False
        if not swapped:
            store.events, store.retired = events, False
            raise OSError(f"{store.path} and {where} cannot swap names in one step here")
        store.let_go_of_path()  # (its name is the new index's)
    new = reopen(store.path)
    new.events = events
    if merging:
        new.start_merger(look=False)  # (the loaded segments merged after the sources are looked at)
    discard(store.path)  # this one's files: unlinked, still mapped while read
    return new

