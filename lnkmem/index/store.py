"""The words index in LMDB: segments of postings, passages, files.

Layout (one LMDB environment, ``<state>/index/``), named databases:

``meta``      format, generation, next passage id, next segment id, model
``files``     ref -> FileRec: the version seen and the passages made of it
``passages``  pid (4 bytes, big-endian) -> Passage: ref, lines, text, thread...
``postings``  segment (4 bytes BE) + term -> pids (u32 LE) + tfs (u16 LE)
``segments``  segment -> SegMeta: its pids, their lengths and refs
``dead``      pid -> b"": passages replaced or deleted, still in a segment
``vectors``   pid -> int8 embedding + float32 scale (meta ``model``: whose)
``vec_pending`` pid -> b"": vectors made since the copy was last written

Like Lucene, the index grows by immutable segments: a batch of changed
files becomes one new segment in one write transaction, and the passages it
replaces are marked dead, filtered at search time and dropped when segments
are merged. Every change is one LMDB transaction, so a process killed at any
moment leaves the index at the state before or after a batch; :meth:`open`
checks that the tables agree and raises :class:`DamagedIndex` when not.

The few numbers BM25 needs per passage (length, source, ref) are held in
memory as numpy arrays, rebuilt at open from ``segments`` and replaced, never
mutated, after each commit so that searches read a consistent snapshot.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field
from typing import Iterable, Optional

import lmdb
import msgspec
import numpy as np

from lnkmem.errors import DamagedIndex

FORMAT = b"lnkmem-index-2"
SOURCES = ("home", "chats", "skills", "notes")
SOURCE_CODE = {s: i for i, s in enumerate(SOURCES)}


class FileRec(msgspec.Struct, array_like=True):
    version: str
    size: int
    pids: list[int]
    kind: str = "text"  # "text" | "name" (indexed by name only)


class Passage(msgspec.Struct, array_like=True, omit_defaults=True):
    ref: str
    first: int
    last: int
    text: str
    thread: Optional[str] = None
    role: Optional[str] = None
    at: Optional[str] = None


class SegMeta(msgspec.Struct, array_like=True):
    pids: bytes  # u32 LE
    lens: bytes  # u32 LE
    refs: list[str]  # one per pid


_enc = msgspec.msgpack.Encoder()
_dec_file = msgspec.msgpack.Decoder(FileRec)
_dec_passage = msgspec.msgpack.Decoder(Passage)
_dec_seg = msgspec.msgpack.Decoder(SegMeta)


def _k(n: int) -> bytes:
    return n.to_bytes(4, "big")


def source_of(ref: str) -> str:
    return ref.split("/", 1)[0]


@dataclass(frozen=True)
class Snapshot:
    """What BM25 needs in memory, consistent with one committed generation."""

    gen: int
    doclen: np.ndarray  # float32 per pid
    alive: np.ndarray  # bool per pid
    src: np.ndarray  # uint8 per pid
    refid: np.ndarray  # int32 per pid -> refs
    refs: list[str]
    live: int
    total_len: float

    @property
    def avgdl(self) -> float:
        return self.total_len / self.live if self.live else 1.0

    def keep(self, pids: np.ndarray, sources=None, under: Optional[str] = None) -> np.ndarray:
        """Those of ``pids`` from the given sources and with refs starting ``under``."""
        if sources is not None and set(sources) != set(SOURCE_CODE):
            codes = np.array([SOURCE_CODE[s] for s in sources if s in SOURCE_CODE], np.uint8)
            pids = pids[np.isin(self.src[pids], codes)]
        if under:
            ok = np.fromiter((r.startswith(under) for r in self.refs), bool, len(self.refs))
            rid = self.refid[pids]
            pids = pids[(rid >= 0) & ok[np.maximum(rid, 0)]]
        return pids


@dataclass
class NewFile:
    ref: str
    version: str
    size: int
    kind: str
    passages: list[Passage]
    counts: list[tuple[dict, int]]  # (term -> tf, length) per passage


@dataclass
class Batch:
    """Changes to commit together: files (re)indexed and refs removed."""

    files: list[NewFile] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.files or self.removed)

    @property
    def text_bytes(self) -> int:
        return sum(f.size for f in self.files)


class Store:
    """One agent's words index, in one LMDB environment."""

    MAP_SIZE = 1 << 30

    def __init__(self, path: str):
        self.path = path
        self.write_lock = threading.Lock()
        self._open()

    # --- opening, checking, wiping ---------------------------------------

    def _open(self) -> None:
        os.makedirs(self.path, mode=0o700, exist_ok=True)
        size = self.MAP_SIZE
        data = os.path.join(self.path, "data.mdb")
        if os.path.exists(data):
            size = max(size, os.path.getsize(data) * 2)
        self.env = lmdb.open(
            self.path, map_size=size, max_dbs=8, metasync=False, sync=True, readahead=False
        )
        self.meta = self.env.open_db(b"meta")
        self.files = self.env.open_db(b"files")
        self.passages = self.env.open_db(b"passages")
        self.postings = self.env.open_db(b"postings")
        self.segments = self.env.open_db(b"segments")
        self.dead = self.env.open_db(b"dead")
        self.vectors = self.env.open_db(b"vectors")
        self.vec_pending = self.env.open_db(b"vec_pending")
        with self.env.begin(write=True) as txn:
            fmt = txn.get(b"format", db=self.meta)
            if fmt is None:
                if txn.stat(self.files)["entries"] or txn.stat(self.segments)["entries"]:
                    raise DamagedIndex("index has data but no format")
                txn.put(b"format", FORMAT, db=self.meta)
                txn.put(b"gen", b"0", db=self.meta)
                txn.put(b"next_pid", b"1", db=self.meta)
                txn.put(b"next_seg", b"1", db=self.meta)
            elif fmt != FORMAT:
                raise DamagedIndex(f"index format {fmt!r} is not {FORMAT!r}")
        self.snapshot = self._load()

    @classmethod
    def open(cls, path: str) -> "Store":
        """Open the index at ``path``; a damaged one is wiped and started anew."""
        try:
            return cls(path)
        except (DamagedIndex, lmdb.Error, msgspec.DecodeError, ValueError) as e:
            wipe(path)
            store = cls(path)
            store.rebuilt_because = str(e)
            return store

    rebuilt_because: Optional[str] = None
    on_commit = None  # called after every change that is committed

    def _changed(self) -> None:
        if self.on_commit is not None:
            self.on_commit()

    def _load(self) -> Snapshot:
        with self.env.begin() as txn:
            gen = int(txn.get(b"gen", db=self.meta))
            next_pid = int(txn.get(b"next_pid", db=self.meta))
            cap = next_pid + 1
            doclen = np.zeros(cap, np.float32)
            alive = np.zeros(cap, bool)
            src = np.zeros(cap, np.uint8)
            refid = np.full(cap, -1, np.int32)
            refs: list[str] = []
            ids: dict[str, int] = {}
            for _, v in txn.cursor(db=self.segments):
                seg = _dec_seg.decode(v)
                pids = np.frombuffer(seg.pids, "<u4")
                if len(pids) != len(seg.refs) or (len(pids) and pids.max() >= cap):
                    raise DamagedIndex("segment table disagrees with passage ids")
                doclen[pids] = np.frombuffer(seg.lens, "<u4")
                alive[pids] = True
                for r in dict.fromkeys(seg.refs):  # new refs, in order
                    if r not in ids:
                        ids[r] = len(refs)
                        refs.append(r)
                refid[pids] = np.fromiter(map(ids.__getitem__, seg.refs), np.int32, len(pids))
            # a passage's source is its ref's: computed once per ref
            ref_src = np.fromiter((SOURCE_CODE.get(source_of(r), 0) for r in refs), np.uint8, len(refs))
            has = refid >= 0
            src[has] = ref_src[refid[has]]
            for k, _ in txn.cursor(db=self.dead):
                p = int.from_bytes(k, "big")
                if p < cap:
                    alive[p] = False
            # every live passage belongs to exactly one file record, and back
            owned = 0
            for _, v in txn.cursor(db=self.files):
                rec = _dec_file.decode(v)
                if rec.pids and not alive[rec.pids].all():
                    raise DamagedIndex("a file names passages that are not live")
                owned += len(rec.pids)
            if owned != int(alive.sum()):
                raise DamagedIndex("live passages and files disagree")
        live = int(alive.sum())
        return Snapshot(gen, doclen, alive, src, refid, refs, live, float(doclen[alive].sum(dtype=np.float64)))

    def refresh(self) -> Snapshot:
        """Reload the snapshot when another process has committed since."""
        with self.env.begin() as txn:
            gen = int(txn.get(b"gen", db=self.meta))
        if gen != self.snapshot.gen:
            self.snapshot = self._load()
        return self.snapshot

    def close(self) -> None:
        self.env.close()

    # --- reading ---------------------------------------------------------

    def all_files(self) -> dict[str, FileRec]:
        with self.env.begin() as txn:
            return {k.decode(): _dec_file.decode(v) for k, v in txn.cursor(db=self.files)}

    def file_versions(self, prefix: str = "") -> dict[str, tuple[str, int]]:
        out = {}
        p = prefix.encode()
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.files)
            if cur.set_range(p):
                for k, v in cur:
                    if not k.startswith(p):
                        break
                    rec = _dec_file.decode(v)
                    out[k.decode()] = (rec.version, rec.size)
        return out

    def passages_of(self, pids: Iterable[int]) -> list[Optional[Passage]]:
        with self.env.begin() as txn:
            out = []
            for p in pids:
                v = txn.get(_k(int(p)), db=self.passages)
                out.append(_dec_passage.decode(v) if v is not None else None)
            return out

    def segment_keys(self, txn) -> list[bytes]:
        return [bytes(k) for k in txn.cursor(db=self.segments).iternext(values=False)]

    def postings_of(self, txn, term: str, segs: Optional[list[bytes]] = None) -> tuple[np.ndarray, np.ndarray]:
        """(pids, tfs) of a term across all segments, dead ones included."""
        t = term.encode()
        pids, tfs = [], []
        for sk in segs if segs is not None else self.segment_keys(txn):
            v = txn.get(sk + t, db=self.postings)
            if v is None:
                continue
            n = len(v) // 6
            pids.append(np.frombuffer(v, "<u4", n))
            tfs.append(np.frombuffer(v, "<u2", n, 4 * n))
        if not pids:
            return np.empty(0, np.uint32), np.empty(0, np.uint16)
        if len(pids) == 1:
            return pids[0], tfs[0]
        return np.concatenate(pids), np.concatenate(tfs)

    def segment_postings(self, txn, seg: bytes):
        """(term bytes, posting bytes) of one segment, in term order."""
        cur = txn.cursor(db=self.postings)
        if cur.set_range(seg):
            for k, v in cur:
                if not k.startswith(seg):
                    break
                yield bytes(k[4:]), v

    def get_meta(self, key: bytes) -> Optional[bytes]:
        with self.env.begin() as txn:
            return txn.get(key, db=self.meta)

    def put_meta(self, key: bytes, value: bytes) -> None:
        with self.write_lock, self.env.begin(write=True) as txn:
            txn.put(key, value, db=self.meta)

    # --- writing ---------------------------------------------------------

    def commit(self, batch: Batch) -> None:
        """Apply a batch in one transaction and publish a new snapshot."""
        if not batch:
            return
        with self.write_lock:
            while True:
                try:
                    self._commit(batch)
                    break
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)
            self.snapshot = self._load()
        self._changed()

    def _commit(self, batch: Batch) -> None:
        with self.env.begin(write=True) as txn:
            next_pid = int(txn.get(b"next_pid", db=self.meta))
            seg = int(txn.get(b"next_seg", db=self.meta))
            gone = set(batch.removed) | {f.ref for f in batch.files}
            for ref in gone:
                old = txn.get(ref.encode(), db=self.files)
                if old is None:
                    continue
                for p in _dec_file.decode(old).pids:
                    txn.put(_k(p), b"", db=self.dead)
                    txn.delete(_k(p), db=self.passages)
                    txn.delete(_k(p), db=self.vectors)
                    txn.delete(_k(p), db=self.vec_pending)
                txn.delete(ref.encode(), db=self.files)
            # postings of the whole batch as flat columns (C-speed extends), then
            # grouped by term with one sort
            p_terms: list[str] = []
            p_tfs: list[int] = []
            p_pids: list[int] = []
            seg_pids: list[int] = []
            seg_lens: list[int] = []
            seg_refs: list[str] = []
            new_passages: list[tuple[bytes, bytes]] = []
            for f in batch.files:
                pids = []
                for passage, (counts, length) in zip(f.passages, f.counts):
                    pid = next_pid
                    next_pid += 1
                    pids.append(pid)
                    new_passages.append((_k(pid), _enc.encode(passage)))
                    seg_pids.append(pid)
                    seg_lens.append(length)
                    seg_refs.append(f.ref)
                    p_terms.extend(counts.keys())
                    p_tfs.extend(counts.values())
                    p_pids.extend([pid] * len(counts))
                txn.put(f.ref.encode(), _enc.encode(FileRec(f.version, f.size, pids, f.kind)), db=self.files)
            # ids only grow: appending packs the pages full
            txn.cursor(db=self.passages).putmulti(new_passages, append=True)
            if seg_pids:
                sk = _k(seg)
                names = sorted(dict.fromkeys(p_terms))
                ids = {t: i for i, t in enumerate(names)}  # term -> its rank in key order
                r = np.fromiter(map(ids.__getitem__, p_terms), np.int64, len(p_terms))
                pid_arr = np.asarray(p_pids, "<u4")
                order = np.lexsort((pid_arr, r))
                r, pid_arr = r[order], pid_arr[order]
                tf_arr = np.minimum(np.asarray(p_tfs, np.int64)[order], 65535).astype("<u2")
                bounds = np.flatnonzero(np.diff(r)) + 1
                starts = np.concatenate(([0], bounds))
                ends = np.concatenate((bounds, [len(r)]))
                items = [(sk + names[r[a]].encode(), pid_arr[a:b].tobytes() + tf_arr[a:b].tobytes())
                         for a, b in zip(starts.tolist(), ends.tolist())]
                # a new segment's keys sort after every other: appended, no old page touched
                txn.cursor(db=self.postings).putmulti(items, append=True)
                meta = SegMeta(np.asarray(seg_pids, "<u4").tobytes(), np.asarray(seg_lens, "<u4").tobytes(),
                               seg_refs)
                txn.put(sk, _enc.encode(meta), db=self.segments)
                txn.put(b"next_seg", str(seg + 1).encode(), db=self.meta)
            txn.put(b"next_pid", str(next_pid).encode(), db=self.meta)
            gen = int(txn.get(b"gen", db=self.meta)) + 1
            txn.put(b"gen", str(gen).encode(), db=self.meta)

    # --- vectors -----------------------------------------------------------

    def vector_model(self) -> Optional[str]:
        v = self.get_meta(b"model")
        return v.decode() if v is not None else None

    def use_vector_model(self, model: str) -> bool:
        """Record whose vectors the index holds; another model's are dropped.
        Returns True when vectors were dropped."""
        with self.write_lock, self.env.begin(write=True) as txn:
            old = txn.get(b"model", db=self.meta)
            if old == model.encode():
                return False
            txn.drop(self.vectors, delete=False)
            txn.drop(self.vec_pending, delete=False)
            txn.put(b"model", model.encode(), db=self.meta)
            return old is not None

    def put_vectors(self, pids: list[int], vecs: np.ndarray, passages: Optional[list] = None) -> list[int]:
        """Store unit vectors (int8 with a scale) of passages still live and, when
        ``passages`` are given, still the passages embedded; returns those stored."""
        expect = [_enc.encode(p) for p in passages] if passages is not None else None
        stored = []
        with self.write_lock:
            while True:
                try:
                    with self.env.begin(write=True) as txn:
                        stored = []
                        for i, (pid, v) in enumerate(zip(pids, vecs)):
                            now = txn.get(_k(pid), db=self.passages)
                            if now is None or (expect is not None and bytes(now) != expect[i]):
                                continue  # replaced meanwhile
                            txn.put(_k(pid), quantize(v), db=self.vectors)
                            txn.put(_k(pid), b"", db=self.vec_pending)
                            stored.append(pid)
                    break
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)
        if stored:
            self._changed()
        return stored

    def vector_shape(self) -> tuple[int, int]:
        """(largest pid with a vector + 1, dimension) of the stored vectors; (0, 0) when none."""
        with self.env.begin() as txn:
            cur = txn.cursor(db=self.vectors)
            if not cur.first():
                return 0, 0
            dim = len(cur.value()) - 4  # the first row's, as iter_vectors keeps
            cur.last()
            return int.from_bytes(cur.key(), "big") + 1, dim

    def iter_vectors(self, chunk: int = 8192):
        """Every stored vector, as it is stored, in chunks of ``chunk`` rows:
        (pids int64, int8 rows, float32 scales); rows of another length than
        the first are skipped. Only one chunk is held at a time besides LMDB's map."""
        with self.env.begin() as txn:
            dim = None
            pids: list[int] = []
            rows: list[bytes] = []
            for k, v in txn.cursor(db=self.vectors):
                if dim is None:
                    dim = len(v) - 4
                if len(v) != dim + 4:
                    continue
                pids.append(int.from_bytes(k, "big"))
                rows.append(v)
                if len(rows) >= chunk:
                    yield _vector_rows(pids, rows, dim)
                    pids, rows = [], []
            if rows:
                yield _vector_rows(pids, rows, dim)

    def all_vectors(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pids, int8 matrix, float32 scales) of every stored vector; a row's
        vector is ``matrix[i] * scales[i]``."""
        parts = list(self.iter_vectors())
        if not parts:
            return np.empty(0, np.int64), np.empty((0, 0), np.int8), np.empty(0, np.float32)
        return tuple(np.concatenate(x) for x in zip(*parts))  # type: ignore[return-value]

    # --- merging ---------------------------------------------------------

    def segment_sizes(self) -> dict[int, int]:
        with self.env.begin() as txn:
            return {int.from_bytes(k, "big"): len(v) for k, v in txn.cursor(db=self.segments)}

    def merge(self, segs: list[int]) -> None:
        """Merge segments into one, dropping dead passages from them."""
        if len(segs) < 2 and not self._has_dead():
            return
        with self.write_lock:
            while True:
                try:
                    self._merge(segs)
                    break
                except lmdb.MapFullError:
                    self.env.set_mapsize(self.env.info()["map_size"] * 2)
            self.snapshot = self._load()
        self._changed()

    def _has_dead(self) -> bool:
        with self.env.begin() as txn:
            return txn.stat(self.dead)["entries"] > 0

    def _merge(self, segs: list[int]) -> None:
        with self.env.begin(write=True) as txn:
            dead = {int.from_bytes(k, "big") for k, _ in txn.cursor(db=self.dead)}
            new = int(txn.get(b"next_seg", db=self.meta))
            nk = _k(new)
            metas = [(s, _dec_seg.decode(txn.get(_k(s), db=self.segments))) for s in segs]
            deadarr = np.fromiter(dead, np.uint32, len(dead)) if dead else None
            grouped: dict[bytes, tuple[list, list]] = {}
            for s, _ in metas:
                sk = _k(s)
                for term, v in self.segment_postings(txn, sk):
                    n = len(v) // 6
                    ps, ts = grouped.setdefault(term, ([], []))
                    ps.append(np.frombuffer(v, "<u4", n).copy())
                    ts.append(np.frombuffer(v, "<u2", n, 4 * n).copy())
                cur = txn.cursor(db=self.postings)  # drop the segment's postings
                if cur.set_range(sk):
                    while cur.key()[:4] == sk:
                        if not cur.delete():
                            break
            items = []
            for term in sorted(grouped):
                ps, ts = grouped[term]
                p = np.concatenate(ps)
                t = np.concatenate(ts)
                if deadarr is not None:
                    keep = ~np.isin(p, deadarr)
                    p, t = p[keep], t[keep]
                if len(p):
                    items.append((nk + term, p.astype("<u4").tobytes() + t.astype("<u2").tobytes()))
            txn.cursor(db=self.postings).putmulti(items, append=True)
            all_p, all_l, all_r = [], [], []
            for s, m in metas:
                p = np.frombuffer(m.pids, "<u4")
                ln = np.frombuffer(m.lens, "<u4")
                for i in range(len(p)):
                    if int(p[i]) not in dead:
                        all_p.append(int(p[i]))
                        all_l.append(int(ln[i]))
                        all_r.append(m.refs[i])
                    else:
                        txn.delete(_k(int(p[i])), db=self.dead)
                        txn.delete(_k(int(p[i])), db=self.vectors)
                txn.delete(_k(s), db=self.segments)
            if all_p:
                meta = SegMeta(np.asarray(all_p, "<u4").tobytes(), np.asarray(all_l, "<u4").tobytes(), all_r)
                txn.put(nk, _enc.encode(meta), db=self.segments)
            txn.put(b"next_seg", str(new + 1).encode(), db=self.meta)
            gen = int(txn.get(b"gen", db=self.meta)) + 1
            txn.put(b"gen", str(gen).encode(), db=self.meta)

    def maybe_merge(self, max_segments: int = 24, keep: int = 8) -> bool:
        """Tiered merging: when there are too many segments, merge the smallest."""
        sizes = self.segment_sizes()
        if len(sizes) <= max_segments:
            return False
        small = sorted(sizes, key=lambda s: sizes[s])[: len(sizes) - keep + 1]
        self.merge(small)
        return True


def quantize_rows(vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scale per row) of float vectors: row i is about
    ``q[i] * scale[i]``; the largest component maps to ±127."""
    v = np.asarray(vecs, np.float32)
    if v.ndim == 1:
        v = v[None, :]
    m = np.abs(v).max(axis=1).astype(np.float64) if v.shape[1] else np.zeros(len(v))
    m[m == 0] = 1.0
    scale = (m / 127.0).astype(np.float32)
    return np.round(v / scale[:, None]).astype(np.int8), scale


def quantize(v: np.ndarray) -> bytes:
    """int8 components and one float32 scale: 4x smaller than float32."""
    q, scale = quantize_rows(v)
    return q[0].tobytes() + scale[:1].astype("<f4").tobytes()


def _vector_rows(pids: list[int], rows: list[bytes], dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    raw = np.frombuffer(b"".join(rows), np.uint8).reshape(len(rows), dim + 4)
    q = np.ascontiguousarray(raw[:, :dim]).view(np.int8)
    scale = np.ascontiguousarray(raw[:, dim:]).view("<f4").reshape(len(rows)).astype(np.float32)
    return np.asarray(pids, np.int64), q, scale


def wipe(path: str) -> None:
    """Remove an index environment (only its own files)."""
    for name in ("data.mdb", "lock.mdb"):
        try:
            os.unlink(os.path.join(path, name))
        except FileNotFoundError:
            pass
    if os.path.isdir(path) and not os.listdir(path):
        shutil.rmtree(path, ignore_errors=True)
