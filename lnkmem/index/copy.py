"""The index copy's format (§7.2, §7.3; docs/ARCHITECTURE.md "The copy").

A copy is a set of immutable, content-addressed files plus one manifest:

``manifest.json``        which files make this version (its bridge version is
                         the copy's version)
``seg-<hash>.bin``       one index segment: its passages, lengths and postings
``table-<hash>.bin``     the file table (ref -> version, size, passages), dead
                         passages, the next passage id, the model
``vec-<hash>.bin``       a chunk of passage embeddings (int8 + scale)

Files are written before the manifest that names them, and never changed, so
a reader that fetches a manifest and then its files sees exactly one version;
a write-back after one changed file sends one small segment, a vector chunk,
the table and the manifest. The local LMDB cache is rebuilt from a copy in
one write transaction, so a reader of the cache also sees one version.
"""

from __future__ import annotations

import hashlib
import time
import zlib
from typing import Callable, Optional

import msgspec
import numpy as np

from lnkmem.index.store import SegMeta, Store, _dec_seg, _enc, _k

FORMAT = "lnkmem-copy-1"
MANIFEST = "manifest.json"


class Manifest(msgspec.Struct, forbid_unknown_fields=False):
    format: str
    segments: list[str]
    table: str
    vectors: list[str] = msgspec.field(default_factory=list)
    model: Optional[str] = None
    made: Optional[str] = None


class _Segment(msgspec.Struct, array_like=True):
    pids: bytes
    lens: bytes
    refs: list[str]
    terms: list[bytes]
    postings: list[bytes]
    passages: list[bytes]


class _Table(msgspec.Struct, array_like=True):
    files: list[tuple[str, bytes]]
    dead: bytes
    next_pid: int
    model: Optional[str]


class _Vectors(msgspec.Struct, array_like=True):
    pids: bytes
    rows: bytes  # n x (dim int8 + 4-byte scale)
    dim: int


def _pack(obj) -> bytes:
    return zlib.compress(_enc.encode(obj), 3)


def _name(kind: str, blob: bytes) -> str:
    return f"{kind}-{hashlib.sha256(blob).hexdigest()[:40]}.bin"


def encode_manifest(m: Manifest) -> bytes:
    return msgspec.json.encode(m)


def decode_manifest(data: bytes) -> Manifest:
    m = msgspec.json.decode(data, type=Manifest)
    if m.format != FORMAT:
        raise ValueError(f"copy format {m.format!r} is not {FORMAT!r}")
    return m


# --- local state of the cache relative to the copy ------------------------------------

class CopyState(msgspec.Struct):
    version: Optional[str] = None  # the copy version this cache is of
    gen: int = -1  # the cache generation last written to (or read from) the copy
    segments: dict[int, str] = msgspec.field(default_factory=dict)  # local segment -> copy file
    vectors: list[str] = msgspec.field(default_factory=list)
    vec_model: Optional[str] = None
    table: Optional[str] = None


def copy_state(store: Store) -> CopyState:
    raw = store.get_meta(b"copy")
    return msgspec.msgpack.decode(raw, type=CopyState) if raw else CopyState()


def dirty(store: Store, state: Optional[CopyState] = None) -> bool:
    """Whether the cache holds anything the copy does not."""
    state = state or copy_state(store)
    with store.env.begin() as txn:
        gen = int(txn.get(b"gen", db=store.meta))
        pending = txn.stat(store.vec_pending)["entries"]
    return state.version is None or gen != state.gen or pending > 0


# --- export: what a write-back sends --------------------------------------------

class Export(msgspec.Struct):
    gen: int
    manifest: Manifest
    blobs: dict[str, bytes]  # files the copy lacks
    segments: dict[int, str]  # local segment -> file name, for every segment
    vec_sent: list[int]  # pending vectors this export carries


MAX_VECTOR_CHUNKS = 16


def export(store: Store, state: CopyState) -> Export:
    """Everything needed to make the copy equal to the cache now, in one read txn."""
    blobs: dict[str, bytes] = {}
    segs: dict[int, str] = {}
    with store.env.begin() as txn:
        gen = int(txn.get(b"gen", db=store.meta))
        raw_model = txn.get(b"model", db=store.meta)
        model = raw_model.decode() if raw_model else None
        for k, v in txn.cursor(db=store.segments):
            seg = int.from_bytes(k, "big")
            if seg in state.segments:
                segs[seg] = state.segments[seg]
                continue
            meta = _dec_seg.decode(v)
            terms, postings = [], []
            for t, p in store.segment_postings(txn, bytes(k)):
                terms.append(t)
                postings.append(bytes(p))
            pids = np.frombuffer(meta.pids, "<u4")
            passages = [txn.get(_k(int(p)), db=store.passages) or b"" for p in pids]
            blob = _pack(_Segment(meta.pids, meta.lens, meta.refs, terms, postings, passages))
            name = _name("seg", blob)
            blobs[name] = blob
            segs[seg] = name
        files = [(k.decode(), bytes(v)) for k, v in txn.cursor(db=store.files)]
        dead = b"".join(bytes(k) for k, _ in txn.cursor(db=store.dead))
        table = _pack(_Table(files, dead, int(txn.get(b"next_pid", db=store.meta)), model))
        tname = _name("table", table)
        if tname != state.table:
            blobs[tname] = table
        # vectors: a chunk of those made since the last write; all of them anew
        # when the model changed or the chunks pile up
        vec_names = list(state.vectors)
        rebuild = state.vec_model != model or len(vec_names) >= MAX_VECTOR_CHUNKS
        pending = [int.from_bytes(k, "big") for k, _ in txn.cursor(db=store.vec_pending)]
        if rebuild:
            vec_names = []
            source = ((int.from_bytes(k, "big"), bytes(v)) for k, v in txn.cursor(db=store.vectors))
        else:
            source = ((p, txn.get(_k(p), db=store.vectors)) for p in pending)
        pids, rows = [], []
        for p, v in source:
            if v:
                pids.append(p)
                rows.append(bytes(v))
        if rows:
            blob = _pack(_Vectors(np.asarray(pids, "<u4").tobytes(), b"".join(rows), len(rows[0]) - 4))
            name = _name("vec", blob)
            blobs[name] = blob
            vec_names.append(name)
    manifest = Manifest(FORMAT, [segs[s] for s in sorted(segs)], tname, vec_names, model,
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return Export(gen, manifest, blobs, segs, pending)


def written(store: Store, exp: Export, version: str) -> None:
    """Record that the copy is now ``version``, made of ``exp``."""
    with store.write_lock, store.env.begin(write=True) as txn:
        for p in exp.vec_sent:
            txn.delete(_k(p), db=store.vec_pending)
        live = {int.from_bytes(k, "big") for k, _ in txn.cursor(db=store.segments)}
        state = CopyState(version, exp.gen, {s: n for s, n in exp.segments.items() if s in live},
                          exp.manifest.vectors, exp.manifest.model, exp.manifest.table)
        txn.put(b"copy", msgspec.msgpack.encode(state), db=store.meta)


# --- import: the cache becomes one version of the copy ---------------------------------

def load(store: Store, manifest: Manifest, version: str, fetch: Callable[[str], bytes]) -> None:
    """Replace the whole cache with this copy version in one write transaction."""
    segs = [(name, msgspec.msgpack.decode(zlib.decompress(fetch(name)), type=_Segment)) for name in manifest.segments]
    table = msgspec.msgpack.decode(zlib.decompress(fetch(manifest.table)), type=_Table)
    vecs = [msgspec.msgpack.decode(zlib.decompress(fetch(n)), type=_Vectors) for n in manifest.vectors]
    with store.write_lock:
        while True:
            try:
                seg_map = _load_txn(store, manifest, version, segs, table, vecs)
                break
            except __import__("lmdb").MapFullError:
                store.env.set_mapsize(store.env.info()["map_size"] * 2)
        store.snapshot = store._load()
    return seg_map


def _load_txn(store: Store, manifest: Manifest, version: str, segs, table: _Table, vecs) -> None:
    with store.env.begin(write=True) as txn:
        for db in (store.files, store.passages, store.postings, store.segments, store.dead, store.vectors,
                   store.vec_pending):
            txn.drop(db, delete=False)
        seg_map: dict[int, str] = {}
        next_seg = int(txn.get(b"next_seg", db=store.meta))
        for name, s in segs:
            sk = _k(next_seg)
            items = [(sk + t, p) for t, p in zip(s.terms, s.postings) if p]
            txn.cursor(db=store.postings).putmulti(sorted(items), append=True)
            pids = np.frombuffer(s.pids, "<u4")
            for pid, blob in zip(pids, s.passages):
                if blob:
                    txn.put(_k(int(pid)), blob, db=store.passages)
            txn.put(sk, _enc.encode(SegMeta(s.pids, s.lens, s.refs)), db=store.segments)
            seg_map[next_seg] = name
            next_seg += 1
        for ref, rec in table.files:
            txn.put(ref.encode(), rec, db=store.files)
        for i in range(0, len(table.dead), 4):
            txn.put(table.dead[i:i + 4], b"", db=store.dead)
        dead = {table.dead[i:i + 4] for i in range(0, len(table.dead), 4)}
        for v in vecs:
            width = v.dim + 4
            pids = np.frombuffer(v.pids, "<u4")
            for i, pid in enumerate(pids):
                key = _k(int(pid))
                if key in dead or txn.get(key, db=store.passages) is None:
                    continue
                txn.put(key, v.rows[i * width:(i + 1) * width], db=store.vectors)
        if manifest.model:
            txn.put(b"model", manifest.model.encode(), db=store.meta)
        else:
            txn.delete(b"model", db=store.meta)
        txn.put(b"next_seg", str(next_seg).encode(), db=store.meta)
        txn.put(b"next_pid", str(table.next_pid).encode(), db=store.meta)
        gen = int(txn.get(b"gen", db=store.meta)) + 1
        txn.put(b"gen", str(gen).encode(), db=store.meta)
        state = CopyState(version, gen, seg_map, list(manifest.vectors), manifest.model, manifest.table)
        txn.put(b"copy", msgspec.msgpack.encode(state), db=store.meta)
    return seg_map
