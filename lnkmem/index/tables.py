"""An index's tables in one transaction, named for what they hold: :class:`Reading` (a read
transaction) and :class:`Writing` (a write transaction), which :class:`~lnkmem.index.store.Store`
hands out (``store.reading()``, ``store.writing()``, ``store.begin_writing()``), so that
a caller above the store (the ranking; the copy: export, verify, load) never holds LMDB's
handles or knows how a table keys its records.

Thin on purpose: each method is one LMDB call (or one cursor walk) on the table it names;
what is written many at a time (a load's 10^7 postings) goes to ``cursor.putmulti`` as the
caller's iterable, with no work an item here. Items to write are as the table stores them:
``(key, value)`` bytes, keys made by :mod:`lnkmem.index.format` (``id_key``, ``file_key``).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

import numpy as np

from lnkmem.index.format import file_entry, file_get, id_key

TABLES = ("meta", "files", "passages", "postings", "segments", "dead", "vectors", "vec_pending")
DATA_TABLES = TABLES[1:]  # every table but meta: what the index holds (a copy's load replaces them all)


class Tables:
    """The handles of an index's tables in one LMDB environment (opened once, with it)."""

    def __init__(self, env):
        self.meta = env.open_db(b"meta")
        self.files = env.open_db(b"files")
        self.passages = env.open_db(b"passages")
        self.postings = env.open_db(b"postings")
        self.segments = env.open_db(b"segments")
        self.dead = env.open_db(b"dead")
        self.vectors = env.open_db(b"vectors")
        self.vec_pending = env.open_db(b"vec_pending")

    def named(self, table: str):
        """The handle of the table called ``table`` (one of :data:`TABLES`)."""
        if table not in TABLES:
            raise KeyError(f"no table {table!r}")
        return getattr(self, table)

    @property
    def data(self) -> tuple:
        """The handles of :data:`DATA_TABLES`."""
        return tuple(getattr(self, t) for t in DATA_TABLES)


class Reading:
    """A read transaction of an index's tables (or the reads of a :class:`Writing`)."""

    __slots__ = ("txn", "tables")

    def __init__(self, txn, tables: Tables):
        self.txn, self.tables = txn, tables

    # --- meta ---------------------------------------------------------------------------

    def meta(self, key: bytes) -> Optional[bytes]:
        """The value of meta key ``key`` (None: not set)."""
        return self.txn.get(key, db=self.tables.meta)

    def meta_int(self, key: bytes) -> int:
        """A meta key that holds a number (``gen``, ``next_pid``, ``next_seg``): always set."""
        return int(self.txn.get(key, db=self.tables.meta))

    # --- sizes --------------------------------------------------------------------------

    def count(self, table: str) -> int:
        """How many items the table called ``table`` holds."""
        return self.txn.stat(self.tables.named(table))["entries"]

    def table_bytes(self, table: str) -> int:
        """The bytes of the table's leaf and overflow pages (what a walk of it maps)."""
        s = self.txn.stat(self.tables.named(table))
        return (s["leaf_pages"] + s["overflow_pages"]) * s["psize"]

    # --- files --------------------------------------------------------------------------

    def files(self) -> Iterator[tuple[str, bytes]]:
        """(ref, its record's bytes) of every file, in key order (a long ref's by its key)."""
        for k, v in self.txn.cursor(db=self.tables.files):
            yield file_entry(k, v)

    def file(self, ref: str) -> Optional[bytes]:
        """``ref``'s record's bytes, None where the index holds no such file."""
        return file_get(self.txn, self.tables.files, ref)

    # --- passages, segments, postings ---------------------------------------------------

    def passage(self, pid: int) -> Optional[bytes]:
        """Passage ``pid``'s stored bytes (packed: :mod:`textpack`), None when not live."""
        return self.txn.get(id_key(pid), db=self.tables.passages)

    def dead_ids(self) -> np.ndarray:
        """The ids of the dead passages, int64, ascending."""
        keys = b"".join(bytes(k) for k in self.txn.cursor(db=self.tables.dead).iternext(values=False))
        dead = np.frombuffer(keys, ">u4").astype(np.int64)
        dead.sort()
        return dead

    def segment_keys(self) -> list[bytes]:
        """The listed segments' keys, ascending."""
        return [bytes(k) for k in self.txn.cursor(db=self.tables.segments).iternext(values=False)]

    def segment(self, sk: bytes) -> Optional[bytes]:
        """Segment ``sk``'s stored record (:data:`format.seg_codec`), None when not listed."""
        return self.txn.get(sk, db=self.tables.segments)

    def posting_list(self, key: bytes) -> Optional[bytes]:
        """One segment's posting list of a term, as stored (``key``: the segment's key then
        the term's bytes), None where the segment has none. (A search asks it for each of
        its terms in each segment: one LMDB lookup, nothing more.)"""
        return self.txn.get(key, db=self.tables.postings)

    def segment_terms(self, sk: bytes, prefix: bytes = b"", most: Optional[int] = None) -> list[bytes]:
        """The terms (bytes) of segment ``sk`` that start with ``prefix``, in term order, the
        first ``most`` of them (None: all): its posting lists' keys walked, no list read."""
        out: list[bytes] = []
        if most is not None and most <= 0:
            return out
        cur = self.txn.cursor(db=self.tables.postings)
        start = sk + prefix
        if cur.set_range(start):
            n = len(sk)
            for k in cur.iternext(values=False):
                if not k.startswith(start):
                    break
                out.append(bytes(k[n:]))
                if len(out) == most:
                    break
        return out

    def segment_postings(self, sk: bytes) -> Iterator[tuple[bytes, bytes]]:
        """(term bytes, posting list bytes) of segment ``sk``, in term order."""
        cur = self.txn.cursor(db=self.tables.postings)
        if cur.set_range(sk):
            for k, v in cur:
                if not k.startswith(sk):
                    break
                yield bytes(k[4:]), v

    # --- vectors ------------------------------------------------------------------------

    def vector(self, pid: int) -> Optional[bytes]:
        """Passage ``pid``'s stored vector (int8 row and scale), None when it has none."""
        return self.txn.get(id_key(pid), db=self.tables.vectors)

    def vectors(self) -> Iterator[tuple[int, bytes]]:
        """(pid, stored vector) of every vector, by pid."""
        for k, v in self.txn.cursor(db=self.tables.vectors):
            yield int.from_bytes(k, "big"), bytes(v)

    def pending_vector_ids(self) -> list[int]:
        """The passages whose vectors were stored since the copy last carried them."""
        return [int.from_bytes(k, "big") for k in self.txn.cursor(db=self.tables.vec_pending).iternext(values=False)]


class ReadingBegun(Reading):
    """A :class:`Reading` that is its own ``with``'s context, its read transaction begun
    with it and ended with the ``with``: what ``store.reading(guarded=False)`` hands out (a
    search, whose refresh passed the store's guard just before: one object, no generator's
    context, since every search begins one)."""

    __slots__ = ()

    def __init__(self, env, tables: Tables):
        super().__init__(env.begin(), tables)

    def __enter__(self) -> Reading:
        return self

    def __exit__(self, *exc) -> None:
        self.txn.__exit__(*exc)


class Writing(Reading):
    """A write transaction of an index's tables: its reads see its writes. Ended by the
    store that handed it out, or, for a stepped one, by :meth:`commit` / :meth:`abort`."""

    __slots__ = ("end",)

    def __init__(self, txn, tables: Tables, end=None):
        super().__init__(txn, tables)
        self.end = end  # the context that began it: its exit commits (and covers the file)

    def put_meta(self, key: bytes, value: bytes) -> None:
        self.txn.put(key, value, db=self.tables.meta)

    def delete_meta(self, key: bytes) -> None:
        self.txn.delete(key, db=self.tables.meta)

    def put_files(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Files' records, as (``format.file_key(ref)``, ``format.file_value(ref, rec)``)
        (in key order: LMDB appends them to its pages faster)."""
        self.txn.cursor(db=self.tables.files).putmulti(items)

    def put_passages(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Passages' stored bytes, as (``id_key(pid)``, bytes), in key order best."""
        self.txn.cursor(db=self.tables.passages).putmulti(items)

    def put_postings(self, items: Iterable[tuple[bytes, bytes]], append: bool = False) -> None:
        """Posting lists, as (segment key + term, list bytes); ``append``: each key is past
        every key the table holds (a new segment's, in term order: LMDB's fastest write)."""
        self.txn.cursor(db=self.tables.postings).putmulti(items, append=append)

    def put_dead(self, keys: Iterable[bytes]) -> None:
        """Mark passages dead (``id_key(pid)`` each, in key order best): their postings stay
        in their segment, unseen, until a merge drops them."""
        self.txn.cursor(db=self.tables.dead).putmulti((k, b"") for k in keys)

    def put_segment(self, sk: bytes, record: bytes) -> None:
        """List segment ``sk`` with its stored record (:data:`format.seg_codec`)."""
        self.txn.put(sk, record, db=self.tables.segments)

    def put_vectors(self, items: Iterable[tuple[bytes, bytes]]) -> None:
        """Stored vectors, as (``id_key(pid)``, int8 row and scale), in key order best."""
        self.txn.cursor(db=self.tables.vectors).putmulti(items)

    def drop_pending_vector(self, pid: int) -> None:
        """Passage ``pid``'s vector is carried by the copy now."""
        self.txn.delete(id_key(pid), db=self.tables.vec_pending)

    def clear_data(self) -> None:
        """Empty every table but meta (:data:`DATA_TABLES`): the index holds nothing."""
        for db in self.tables.data:
            self.txn.drop(db, delete=False)

    def commit(self) -> None:
        """Commit a stepped write transaction (``store.begin_writing()``)."""
        self.end.__exit__(None, None, None)

    def abort(self) -> None:
        """Drop what a stepped write transaction wrote."""
        self.txn.abort()
