"""The store's guard: nothing touches a damaged index, nor pages its file no longer holds.

A store's methods that read or write LMDB are wrapped (:func:`guarded`, :func:`guarded_walk`,
:func:`through` around a transaction's ``with``): refused once the index is damaged, checked
against a file cut shorter than the pages it uses (:func:`check`: touching those would be a
SIGBUS), and an LMDB error saying its file is damaged, or a read that met a page cut away
(:mod:`lnkmem.index.mapguard`), marks it so (``store.damage``: the engine rebuilds it).

Each takes the :class:`~lnkmem.index.store.Store` guarded (its ``guard``, ``damage``,
``check_map``, environment and page size).
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Iterator

import lmdb

from lnkmem.index.lmdbfile import DAMAGE_ERRORS, DamagedWhileServing


def guarded(method):
    """Store methods that read or write LMDB: refused once the index is damaged, and an
    LMDB error saying its file is damaged marks it so (the engine rebuilds it)."""
    return _guarding(method, lambda store: store.guard())


def _guarding(method, first):
    """``method`` wrapped: ``first(store)`` before it; an LMDB error saying the file is
    damaged marks the index so; a page cut away under a read is damage, not the error."""

    @functools.wraps(method)
    def call(self, *a, **kw):
        first(self)
        try:
            out = method(self, *a, **kw)
        except DAMAGE_ERRORS as e:
            raise self.damage(e) from None
        except Exception:
            self.check_map()  # what it read was a page cut away: damage, not this error
            raise
        self.check_map()
        return out

    return call


# a search's guard (:func:`guarded_search`) looks at the file's size at most this often while a
# cut under a read is caught anyway (the map watched: :mod:`mapguard`): an fstat and a read of
# the meta pages were a few microseconds of every search, and a cut is found by whichever
# comes first, the next look or the first read of a page it took
SIZE_EVERY_S = 0.05


def guarded_search(method):
    """:func:`guarded` for a search's first call (``Store.refresh``): the file's size is looked
    at once every :data:`SIZE_EVERY_S` where the map is watched (every time where it is not);
    the damage mark and the map's faults at every call, as :func:`guarded`."""
    return _guarding(method, lambda store: check(store, search=True))


def guarded_walk(method):
    """:func:`guarded` for a Store method that yields: guarded while it is walked."""

    @functools.wraps(method)
    def walk(self, *a, **kw):
        with through(self):
            yield from method(self, *a, **kw)

    return walk


@contextlib.contextmanager
def through(store) -> Iterator[None]:
    """What :func:`guarded` does around a call, around a transaction's ``with``."""
    store.guard()
    try:
        yield
    except DAMAGE_ERRORS as e:
        raise store.damage(e) from None
    except Exception:
        store.check_map()
        raise
    store.check_map()


def check(store, search: bool = False) -> None:
    """Refuse to touch a damaged index, or one whose file became shorter than the
    pages it uses (touching those would be a SIGBUS). ``search``: the size looked at
    only when :data:`SIZE_EVERY_S` has passed since, where the map is watched."""
    if store.damaged is not None:
        raise DamagedWhileServing(f"the index is damaged ({store.damaged}) and is being rebuilt "
                                  "from the sources; try again in a moment")
    store.check_map()
    spaced = search and store.env.watch is not None  # the size looked at SIZE_EVERY_S apart at most
    if spaced:
        now = time.monotonic()
        if now < store.sized_until:
            return
    try:
        # the file first -- the one this environment maps, by its descriptor: the
        # folder's name may name another index's file by now (a newer version put in its
        # place, a rebuild, a folder swapped) -- the pages in use are read from its meta
        # pages, in the map, and a file cut below them is a SIGBUS at that read (caught:
        # mapguard; but not touched at all is better)
        size = store.env.file_size()
        if size < 2 * store.psize:
            raise store.damage(f"data.mdb holds {size} bytes, less than its two meta pages")
        # then the pages in use, then the size again if need be: a commit in between
        # grows the file before its meta, so a size read after the pages is never short
        need = (store.env.info()["last_pgno"] + 1) * store.psize
        if size < need:
            size = store.env.file_size()
    except (OSError, lmdb.Error) as e:
        raise store.damage(e) from None
    store.check_map()
    if size < need:
        raise store.damage(f"data.mdb holds {size} bytes but the index uses {need}")
    if spaced:
        store.sized_until = now + SIZE_EVERY_S
