"""The index copy's format (§7.2, §7.3; docs/ARCHITECTURE.md "The copy").

A copy is a set of immutable, content-addressed files plus one manifest:

``manifest.json``        which files make this version (its bridge version is
                         the copy's version)
``seg-<hash>.bin``       one index segment: its passages, lengths and postings,
                         as the index stores them (postings.py, textpack.py)
``table-<hash>.bin``     the file table (ref -> version, size, passages), dead
                         passages, the next passage id, the model, the
                         passages' dictionary (zstd, or deflate)
``vec-<hash>.bin``       a chunk of passage embeddings (int8 + scale)

Files are written before the manifest that names them, and never changed, so
a reader that fetches a manifest and then its files sees exactly one version;
the manifest and the table name whose memory the copy is (``of``);
a write-back after one changed file sends one small segment, a vector chunk,
the table and the manifest. The local LMDB cache is rebuilt from a copy in
one write transaction, so a reader of the cache also sees one version.

The copy is untrusted input (§7.2 rev. 2): :func:`verify` checks all of it --
names against content hashes, decompressed sizes against the compressed ones,
counts, lengths and ids against each other, refs against this memory's
sources, vector widths, whose copy it is -- before :func:`load` lets any of it
into the cache; a copy that fails is :class:`CopyDamaged`, never loaded.
"""

from __future__ import annotations

import hashlib
import re
import time
import zlib
from typing import Callable, Iterable, Optional

import msgspec
import numpy as np

from lnkmem.index import postings, textpack
from lnkmem.index.store import FileRec, SegMeta, Store, _dec_file, _dec_passage, _seg_codec, _enc, _k

FORMAT = "lnkmem-copy-3"  # -3: compressed postings and passages (issue 12); an older copy is replaced
MANIFEST = "manifest.json"

# bounds on what a copy may make the engine hold (§7.2: never trusted to size an allocation)
MAX_MANIFEST = 1 << 20
MAX_BLOB = 1 << 30
RATIO = 32  # decompressed bytes per compressed byte, at most (plus SLACK)
SLACK = 1 << 20
MAX_FILES = 100_000  # files one manifest may name
MAX_DIM = 16384
MAX_TERM = 1024
POSTINGS_PER_BYTE = 8  # postings a segment may claim per byte of it (real ones: about 1)
SPARSE = 4  # ids beyond SPARSE x passages + DENSE_SLACK are renumbered at load
DENSE_SLACK = 1 << 16
_NAME = re.compile(r"(seg|table|vec)-[0-9a-f]{40}\.bin")


class CopyDamaged(ValueError):
    """The copy fails a check: it is never loaded, and is replaced at the next write-back."""


class Manifest(msgspec.Struct, forbid_unknown_fields=False):
    format: str
    segments: list[str]
    table: str
    vectors: list[str] = msgspec.field(default_factory=list)
    model: Optional[str] = None
    made: Optional[str] = None
    of: Optional[str] = None  # whose memory: "agent <owner>/<agent>" or "team <team id>"


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
    of: Optional[str] = None
    zdict: Optional[bytes] = None  # the passages' dictionary (textpack: zstd, or deflate)


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
    if len(data) > MAX_MANIFEST:
        raise CopyDamaged(f"the manifest is {len(data)} bytes, over {MAX_MANIFEST}")
    try:
        m = msgspec.json.decode(data, type=Manifest)
    except msgspec.DecodeError as e:
        raise CopyDamaged(f"the manifest is not understood: {e}") from None
    if m.format != FORMAT:
        raise CopyDamaged(f"copy format {m.format!r} is not {FORMAT!r}")
    return m


# --- local state of the cache relative to the copy ------------------------------------

class CopyState(msgspec.Struct):
    version: Optional[str] = None  # the copy version this cache is of
    gen: int = -1  # the cache generation last written to (or read from) the copy
    segments: dict[int, str] = msgspec.field(default_factory=dict)  # local segment -> copy file
    vectors: list[str] = msgspec.field(default_factory=list)
    vec_model: Optional[str] = None
    table: Optional[str] = None
    # the copy's files are not all known here (a damaged version, or one loaded renumbered):
    # the write-back that replaces it deletes every file its new manifest does not name
    sweep: bool = False


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


def export(store: Store, state: CopyState, of: Optional[str] = None) -> Export:
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
            meta = _seg_codec.decode(v)
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
        files = list(store.file_items(txn))
        dead = b"".join(bytes(k) for k, _ in txn.cursor(db=store.dead))
        zdict = txn.get(b"zdict", db=store.meta)
        table = _pack(_Table(files, dead, int(txn.get(b"next_pid", db=store.meta)), model, of, zdict))
        tname = _name("table", table)
        if tname != state.table:
            blobs[tname] = table
        # vectors: a chunk of those made since the last write; all of them anew
        # when the model changed, the chunks pile up, or passage ids were given again
        # since the last write (an old chunk names the id's former passage)
        vec_names = list(state.vectors)
        reuse = txn.get(b"pid_reuse", db=store.meta)
        rebuild = (state.vec_model != model or len(vec_names) >= MAX_VECTOR_CHUNKS
                   or (reuse is not None and int(reuse) > state.gen))
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
                        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), of)
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


# --- verify: everything the copy holds is checked before any of it is loaded ----------

class Verified(msgspec.Struct):
    manifest: Manifest
    segs: list  # (file name, _Segment)
    table: _Table
    vecs: list  # _Vectors
    renumber: Optional[np.ndarray] = None  # sorted old pids; new pid = index + 1


def _bad(why: str) -> CopyDamaged:
    return CopyDamaged(why)


def _blob(fetch: Callable[[str], bytes], name: str) -> bytes:
    """A file's decompressed content, once its name is the hash of its content."""
    data = fetch(name)
    if len(data) > MAX_BLOB:
        raise _bad(f"{name} is {len(data)} bytes, over {MAX_BLOB}")
    if _name(name.split("-", 1)[0], data) != name:
        raise _bad(f"{name}: its content does not match its name")
    limit = RATIO * len(data) + SLACK
    d = zlib.decompressobj()
    try:
        raw = d.decompress(data, limit)
    except zlib.error as e:
        raise _bad(f"{name} does not decompress: {e}") from None
    if d.unconsumed_tail:
        raise _bad(f"{name} decompresses to more than {limit} bytes")
    if not d.eof or d.unused_data:
        raise _bad(f"{name} is truncated or has bytes after its end")
    return raw


def _decode(raw: bytes, typ, name: str):
    try:
        return msgspec.msgpack.decode(raw, type=typ)
    except msgspec.DecodeError as e:
        raise _bad(f"{name} is not understood: {e}") from None


def valid_ref(ref: str, sources: Optional[Iterable[str]]) -> bool:
    """A ref this memory could have made: a known source, then a clean path (or `notes`)."""
    if not isinstance(ref, str) or not ref or len(ref) > 4096 or "\0" in ref or "\\" in ref:
        return False
    source, _, path = ref.partition("/")
    if sources is not None and source not in sources:
        return False
    if source == "notes":
        return path == "" and "/" not in ref
    if source not in ("home", "chats", "skills") or not path:
        return False
    return all(p not in ("", ".", "..") for p in path.split("/"))


def _distinct(a: np.ndarray) -> bool:
    k = np.sort(a)
    return bool((k[1:] != k[:-1]).all())


def _u4(b: bytes, what: str, dtype: str = "<u4") -> np.ndarray:
    if len(b) % 4:
        raise _bad(f"{what}: {len(b)} bytes is no whole number of ids")
    return np.frombuffer(b, dtype)


def verify(manifest: Manifest, fetch: Callable[[str], bytes], of: Optional[str] = None,
           sources: Optional[Iterable[str]] = None, width: Optional[tuple[str, int]] = None) -> Verified:
    """Every check of §7.2 on one version of the copy; CopyDamaged at the first that fails.

    ``of``: whose memory this must be; ``sources``: the sources refs may name
    (None: any); ``width``: (model, its vector width) when known."""
    sources = set(sources) if sources is not None else None
    if of is not None and manifest.of != of:
        raise _bad(f"the copy is not this memory's (it says it is of {manifest.of!r})")
    names = list(manifest.segments) + [manifest.table] + list(manifest.vectors)
    if len(names) > MAX_FILES:
        raise _bad(f"the manifest names {len(names)} files, over {MAX_FILES}")
    if len(set(names)) != len(names):
        raise _bad("the manifest names a file twice")
    for kind, group in (("seg", manifest.segments), ("table", [manifest.table]), ("vec", manifest.vectors)):
        for n in group:
            if not isinstance(n, str) or not _NAME.fullmatch(n) or not n.startswith(kind + "-"):
                raise _bad(f"the manifest names {n!r}, which is no {kind} file name")
    if manifest.vectors and not manifest.model:
        raise _bad("the copy has vectors but names no model")

    table = _decode(_blob(fetch, manifest.table), _Table, manifest.table)
    if of is not None and table.of != of:
        raise _bad(f"the copy's table is not this memory's (it says it is of {table.of!r})")
    if table.model != manifest.model:
        raise _bad("the table and the manifest name different models")
    try:
        textpack.check_dict(table.zdict)
    except ValueError as e:
        raise _bad(f"the table's passage dictionary is not one the engine makes ({e})") from None
    ok_refs: dict[str, bool] = {}

    def check_ref(r: str, where: str) -> None:
        good = ok_refs.get(r)
        if good is None:
            good = ok_refs[r] = valid_ref(r, sources)
        if not good:
            raise _bad(f"{where} names {r!r}, which is no ref of this memory's sources")

    segs = []
    ref_of: dict[int, str] = {}
    for name in manifest.segments:
        raw = _blob(fetch, name)
        s = _decode(raw, _Segment, name)
        pids = _u4(s.pids, name)
        n = len(pids)
        if len(s.lens) != 4 * n or len(s.refs) != n or len(s.passages) != n or len(s.terms) != len(s.postings):
            raise _bad(f"{name}: its lengths disagree")
        if not _distinct(pids):
            raise _bad(f"{name} names a passage twice")
        for r in s.refs:
            check_ref(r, name)
        prev = None
        counts = []
        room = POSTINGS_PER_BYTE * len(raw)  # what the lists may claim in all, before any is decoded
        for t, post in zip(s.terms, s.postings):
            if not t or len(t) > MAX_TERM or (prev is not None and t <= prev):
                raise _bad(f"{name}: its terms are not distinct, sorted and short")
            prev = t
            k = postings.count(post)
            if k is None:
                raise _bad(f"{name}: a posting list has a broken length")
            if k > n or k > room:
                raise _bad(f"{name}: a posting list claims more postings than the segment holds")
            room -= k
            why = postings.check(post)
            if why is not None:
                raise _bad(f"{name}: {why}")
            counts.append(k)
        if counts:  # all postings at once: each names passages of this segment, none twice
            pp = np.concatenate([postings.unpack(post)[0] for post in s.postings])
            order = np.sort(pids)
            at = np.minimum(np.searchsorted(order, pp), max(n - 1, 0))
            if len(pp) and (n == 0 or not (order[at] == pp).all()):
                raise _bad(f"{name}: a posting names a passage the segment does not hold")
            key = np.repeat(np.arange(len(counts), dtype=np.int64), counts) * (1 << 32) + pp
            if not _distinct(key):
                raise _bad(f"{name}: a posting names a passage twice")
        text_room = RATIO * len(raw) + SLACK  # the passages' bytes decompressed, in all
        for i, (pid, blob) in enumerate(zip(pids.tolist(), s.passages)):
            if pid in ref_of:
                raise _bad(f"{name}: passage {pid} is in two segments")
            ref_of[pid] = s.refs[i]
            if blob:
                try:
                    one = textpack.unpack(blob, table.zdict, max(text_room, 1))
                    text_room -= len(one)
                    p = _dec_passage.decode(one)
                except ValueError as e:
                    raise _bad(f"{name}: passage {pid} is not understood ({e})") from None
                except msgspec.DecodeError:
                    raise _bad(f"{name}: passage {pid} is not understood") from None
                if p.ref != s.refs[i]:
                    raise _bad(f"{name}: passage {pid} names another ref than its segment")
        segs.append((name, s))
    all_pids = np.fromiter(ref_of, np.int64, len(ref_of))
    top = int(all_pids.max()) if len(all_pids) else 0
    if not isinstance(table.next_pid, int) or table.next_pid < top + 1 or table.next_pid < 1:
        raise _bad(f"the table's next passage id {table.next_pid} is not beyond its passages")
    dead = _u4(table.dead, manifest.table, ">u4")  # the dead table's keys, big-endian
    dead_set = set(dead.tolist())
    if len(dead_set) != len(dead) or any(p not in ref_of for p in dead_set):
        raise _bad("the table's dead passages are not passages of its segments")
    owned: set[int] = set()
    seen_refs: set[str] = set()
    for ref, rec_raw in table.files:
        check_ref(ref, manifest.table)
        if ref in seen_refs:
            raise _bad(f"the table names {ref!r} twice")
        seen_refs.add(ref)
        try:
            rec = _dec_file.decode(rec_raw)
        except msgspec.DecodeError:
            raise _bad(f"the table's record of {ref!r} is not understood") from None
        if rec.size < 0 or rec.kind not in ("text", "name"):
            raise _bad(f"the table's record of {ref!r} is not sane")
        for p in rec.pids:
            if p in owned or p in dead_set or ref_of.get(p) != ref:
                raise _bad(f"the table gives {ref!r} a passage that is not its own live one")
            owned.add(p)
    if len(owned) != len(ref_of) - len(dead_set):
        raise _bad("the table's files and the segments' live passages disagree")
    vecs = []
    dim = None
    for name in manifest.vectors:
        v = _decode(_blob(fetch, name), _Vectors, name)
        vp = _u4(v.pids, name)
        if not 1 <= v.dim <= MAX_DIM or (dim is not None and v.dim != dim):
            raise _bad(f"{name}: vectors {v.dim} wide, not the copy's width")
        if width is not None and width[0] == manifest.model and v.dim != width[1]:
            raise _bad(f"{name}: vectors {v.dim} wide, but the model's are {width[1]}")
        dim = v.dim
        if len(v.rows) != len(vp) * (v.dim + 4):
            raise _bad(f"{name}: its rows and ids disagree")
        if len(vp) and (int(vp.max()) >= table.next_pid):
            raise _bad(f"{name}: a vector names a passage id the copy never gave")
        if len(vp):
            raw = np.frombuffer(v.rows, np.uint8).reshape(len(vp), v.dim + 4)
            scale = raw[:, v.dim:].copy().view("<f4").ravel()
            if not np.isfinite(scale).all():
                raise _bad(f"{name}: a vector's scale is not a number")
        vecs.append(v)
    renumber = None
    if max(top + 1, table.next_pid) > SPARSE * len(all_pids) + DENSE_SLACK:  # ids never size an allocation
        renumber = np.sort(all_pids)
    return Verified(manifest, segs, table, vecs, renumber)


# --- import: the cache becomes one version of the copy ---------------------------------

def load(store: Store, v: Verified, version: str) -> dict:
    """Replace the whole cache with this verified copy version in one write transaction."""
    import lmdb
    with store.write_lock:
        store.forget_listed()  # (the lock is reentrant) every file replaced
        while True:
            try:
                seg_map = _load_txn(store, v, version)
                break
            except lmdb.MapFullError:
                store.env.set_mapsize(store.env.info()["map_size"] * 2)
        store.snapshot = store._load()
    return seg_map


def damaged(store: Store, version: str) -> None:
    """The copy at ``version`` failed its checks: the cache is not of it, and the next
    write-back replaces all of it, conditionally on that version (§7.2)."""
    store.put_meta(b"copy", msgspec.msgpack.encode(CopyState(version=version, sweep=True)))


def _load_txn(store: Store, v: Verified, version: str) -> dict:
    manifest, segs, table, vecs, order = v.manifest, v.segs, v.table, v.vecs, v.renumber

    def remap(a: np.ndarray) -> np.ndarray:
        if order is None or not len(a):
            return a
        return (np.searchsorted(order, a) + 1).astype("<u4")

    def remap1(p: int) -> int:
        return int(np.searchsorted(order, p)) + 1 if order is not None else int(p)

    with store.env.begin(write=True) as txn:
        for db in (store.files, store.passages, store.postings, store.segments, store.dead, store.vectors,
                   store.vec_pending):
            txn.drop(db, delete=False)
        seg_map: dict[int, str] = {}
        next_seg = int(txn.get(b"next_seg", db=store.meta))
        for name, s in segs:
            sk = _k(next_seg)
            items = []
            for t, p in zip(s.terms, s.postings):
                if not p:
                    continue
                if order is not None:
                    pp, tt = postings.unpack(p)
                    p = postings.pack(remap(pp), tt)
                items.append((sk + t, p))
            txn.cursor(db=store.postings).putmulti(items, append=True)
            pids = remap(np.frombuffer(s.pids, "<u4"))
            for pid, blob in zip(pids.tolist(), s.passages):
                if blob:
                    txn.put(_k(pid), blob, db=store.passages)
            txn.put(sk, _seg_codec.encode(SegMeta(pids.astype("<u4").tobytes(), s.lens, s.refs)), db=store.segments)
            if order is None:
                seg_map[next_seg] = name  # renumbered: the copy's file is no longer this segment
            next_seg += 1
        for ref, rec in table.files:
            if order is not None:
                r = _dec_file.decode(rec)
                rec = _enc.encode(FileRec(r.version, r.size, [remap1(p) for p in r.pids], r.kind, r.mtime))
            store.put_file(txn, ref, rec)
        dead = set(remap(_u4(table.dead, "", ">u4").astype("<u4")).tolist())
        for p in sorted(dead):
            txn.put(_k(p), b"", db=store.dead)
        live_vec = 0
        for vc in vecs:
            width = vc.dim + 4
            vp = np.frombuffer(vc.pids, "<u4")
            for i, pid in enumerate(vp.tolist()):
                if order is not None:
                    j = int(np.searchsorted(order, pid))
                    if j >= len(order) or order[j] != pid:
                        continue
                    pid = j + 1
                key = _k(pid)
                if pid in dead or txn.get(key, db=store.passages) is None:
                    continue
                txn.put(key, vc.rows[i * width:(i + 1) * width], db=store.vectors)
                live_vec += 1
        if manifest.model:
            txn.put(b"model", manifest.model.encode(), db=store.meta)
        else:
            txn.delete(b"model", db=store.meta)
        if table.zdict:  # the copy's passages are packed with its dictionary
            txn.put(b"zdict", table.zdict, db=store.meta)
        else:
            txn.delete(b"zdict", db=store.meta)
        next_pid = len(order) + 1 if order is not None else table.next_pid
        txn.put(b"next_seg", str(next_seg).encode(), db=store.meta)
        txn.put(b"next_pid", str(next_pid).encode(), db=store.meta)
        gen = int(txn.get(b"gen", db=store.meta)) + 1
        txn.put(b"gen", str(gen).encode(), db=store.meta)
        if order is None:
            state = CopyState(version, gen, seg_map, list(manifest.vectors), manifest.model, manifest.table)
        else:  # of this version, but every file is sent anew at the next write-back
            state = CopyState(version, -1, sweep=True)
        txn.put(b"copy", msgspec.msgpack.encode(state), db=store.meta)
    return seg_map
