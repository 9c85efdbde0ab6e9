"""Reads of what the index holds of each file and passage: the files table's records (whole, by
prefix, by ref, their heads and kinds) and the passages' text.

Each function takes the :class:`~lnkmem.index.store.Store` it is asked through (its environment,
its tables, its letting go of the map's pages on long walks); the store's methods are the door
callers use, and its guard stands around them. Nothing here writes.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

from lnkmem.index.codec import textpack
from lnkmem.index.format import (REF_HEAD, FileRec, Passage, file_decoder, file_entry, file_get, head_decoder, id_key,
                                 kind_decoder, passage_decoder)
from lnkmem.index.tables import Reading


def all_files(store) -> dict[str, FileRec]:
    """Every file's record, by ref."""
    with store.env.begin() as txn:
        return {ref: file_decoder.decode(rec) for ref, rec in Reading(txn, store.tables).files()}


def files_under(store, prefix: str, dec=file_decoder):
    """(ref, record decoded by ``dec``) of every file whose ref starts with ``prefix``."""
    p = prefix.encode()[:REF_HEAD]  # a long ref's key holds this much of it
    exact = len(prefix.encode()) > REF_HEAD
    with store.env.begin() as txn:
        cur = txn.cursor(db=store.files)
        if cur.set_range(p):
            for i, (k, v) in enumerate(cur):
                if not k.startswith(p):
                    break
                if i % 8192 == 8191:  # the map's pages the walk read (at 10x, every file: many MiB)
                    store.let_go_of_map()
                if b"\0" in k or exact:
                    ref, rec = file_entry(k, v)
                    if ref.startswith(prefix):
                        yield ref, dec.decode(rec)
                else:
                    yield k.decode(), dec.decode(v)


def versions(store, prefix: str = "") -> dict[str, tuple[str, int]]:
    """(version, size) of every file below ``prefix``, by ref."""
    # only each record's head: a file's passage ids are not built (every restart's plan)
    return {ref: (rec.version, rec.size) for ref, rec in files_under(store, prefix, head_decoder)}


def heads_of(store, refs: Iterable[str]) -> Iterator[tuple[str, Optional[tuple[str, int]]]]:
    """(ref, (version, size) or None where the index holds no such file) of each of
    ``refs``, in their order, one lookup each in one read transaction: a whole listing
    compared with the index without a dict of every file it holds."""
    for ref, h in lookups(store, refs, head_decoder):
        yield ref, (h.version, h.size) if h is not None else None


def refs_under(store, prefix: str) -> Iterator[str]:
    """The ref of every file below ``prefix`` (a walk of the table, nothing kept)."""
    for ref, _ in files_under(store, prefix, head_decoder):
        yield ref


def lookups(store, refs: Iterable[str], dec):
    """(ref, its record decoded by ``dec`` or None where the index holds no such file) of
    each of ``refs``, one lookup each in one read transaction, letting go of the map's
    pages as it goes."""
    with store.env.begin() as txn:
        for i, ref in enumerate(refs):
            v = file_get(txn, store.files, ref)
            yield ref, dec.decode(v) if v is not None else None
            if i % 8192 == 8191:
                store.let_go_of_map()


def records(store, refs: Iterable[str], dec):
    """(ref, record decoded by ``dec``) of each of ``refs`` the index holds, one at a time."""
    return ((ref, rec) for ref, rec in lookups(store, refs, dec) if rec is not None)


def file_recs(store, refs: Iterable[str]) -> dict[str, FileRec]:
    """The records of ``refs`` that the index holds (one lookup each)."""
    return dict(records(store, refs, file_decoder))


def kinds_of(store, refs: Iterable[str]) -> dict[str, str]:
    """How each of ``refs`` that the index holds was indexed (its record's kind), no
    record kept and the map's pages let go as it goes: the people's ``index`` asks it
    of every file it read (at 1.27M passages whole records, and the pages their lookups
    mapped, held tens of MiB more)."""
    kinds: dict[str, str] = {}
    out = {}
    for i, (ref, rec) in enumerate(records(store, refs, kind_decoder)):
        out[ref] = kinds.setdefault(rec.kind, rec.kind)
        if i % 4096 == 4095:
            store.let_go_of_map()
    store.let_go()
    return out


def refs_of_kind(store, prefix: str, kind: str) -> set[str]:
    """The refs below ``prefix`` indexed as ``kind`` (e.g. "name": a document
    indexed by name while no converter was installed, §3.3)."""
    return {ref for ref, rec in files_under(store, prefix) if rec.kind == kind}


def file_mtime(store, ref: str) -> Optional[str]:
    """A file's modification time as indexed (None when unknown)."""
    with store.env.begin() as txn:
        v = file_get(txn, store.files, ref)
    return file_decoder.decode(v).mtime if v is not None else None


def passages_of(store, pids: Iterable[int]) -> list[Optional[Passage]]:
    """The passages of ``pids``, in their order (None where a pid is not live)."""
    with store.env.begin() as txn:
        zdict = txn.get(b"zdict", db=store.meta)
        out = []
        for p in pids:
            v = txn.get(id_key(int(p)), db=store.passages)
            out.append(passage_decoder.decode(textpack.unpack(v, zdict)) if v is not None else None)
        return out
