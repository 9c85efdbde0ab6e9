"""The checks one file of a copy can take alone (§7.2): its name is the hash of its
content and says its size, it decompresses within its bound, it decodes as its kind; a ref
is one this memory could have made, a file's record is sane; the manifest names each file
once, by a name of its kind. And the order a load reads them in, fetched one ahead of the
reader (:class:`FetchAhead`). :mod:`load` checks a whole version with them, :mod:`apply`
a change."""

from __future__ import annotations

import zlib
from typing import Callable, Iterable, Optional

import msgspec
import numpy as np

from lnkmem.index.format import FileRec, file_decoder
from lnkmem.replica.manifest import (CopyDamaged, MAX_BLOB, MAX_FILES, Manifest, NAME_RE, OLD_FORMAT, OLD_MAX_BLOB,
                                     OLD_NAME_RE, RATIO, SLACK, blob_name)


def blob_size(name: str) -> Optional[int]:
    """The length a file's name says it has (None: a name of the previous format)."""
    m = NAME_RE.fullmatch(name)
    return int(m.group(2)) if m else None


def checked_blob(fetch: Callable[[str], bytes], name: str) -> bytes:
    """A file's decompressed content, once its name is the hash of its content. A file
    whose name says it is over the bound is refused before it is fetched."""
    size = blob_size(name)
    limit = MAX_BLOB if size is not None else OLD_MAX_BLOB
    if size is not None and size > MAX_BLOB:
        raise CopyDamaged(f"{name} is {size} bytes, over {MAX_BLOB}")
    data = fetch(name)
    if len(data) > limit:
        raise CopyDamaged(f"{name} is {len(data)} bytes, over {limit}")
    made = blob_name(name.split("-", 1)[0], data)
    if (made if size is not None else made.rsplit("-", 1)[0] + ".bin") != name:
        raise CopyDamaged(f"{name}: its content does not match its name")
    limit = RATIO * len(data) + SLACK
    d = zlib.decompressobj()
    try:
        raw = d.decompress(data, limit)
    except zlib.error as e:
        raise CopyDamaged(f"{name} does not decompress: {e}") from None
    if d.unconsumed_tail:
        raise CopyDamaged(f"{name} decompresses to more than {limit} bytes")
    if not d.eof or d.unused_data:
        raise CopyDamaged(f"{name} is truncated or has bytes after its end")
    return raw


def decoded(raw: bytes, typ, name: str):
    """``raw`` decoded as ``typ`` (file ``name``'s content); CopyDamaged where it is not one."""
    try:
        return msgspec.msgpack.decode(raw, type=typ)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as e:
        raise CopyDamaged(f"{name} is not understood: {e}") from None


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


def checked_record(ref: str, rec_raw: bytes) -> FileRec:
    """A file's record as a table page of the copy holds it, decoded and sane (its size, its
    kind, its passage ids within 32 bits); CopyDamaged otherwise."""
    try:
        rec = file_decoder.decode(rec_raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise CopyDamaged(f"the table's record of {ref!r} is not understood") from None
    if rec.size < 0 or rec.kind not in ("text", "name"):
        raise CopyDamaged(f"the table's record of {ref!r} is not sane")
    if rec.pids and (min(rec.pids) < 0 or max(rec.pids) >= 1 << 32):
        raise CopyDamaged(f"the table gives {ref!r} a passage that is not its own live one")
    return rec


def distinct(a: np.ndarray) -> bool:
    """Whether no value of ``a`` is there twice."""
    k = np.sort(a)
    return bool((k[1:] != k[:-1]).all())


def u4(b: bytes, what: str, dtype: str = "<u4") -> np.ndarray:
    """``b`` as an array of 4-byte ids (``what`` names it in the refusal of a length that is not)."""
    if len(b) % 4:
        raise CopyDamaged(f"{what}: {len(b)} bytes is no whole number of ids")
    return np.frombuffer(b, dtype)


def check_names(manifest: Manifest, of: Optional[str]) -> None:
    """The manifest is this memory's, and names each of its files once, by a name of its kind."""
    if of is not None and manifest.of != of:
        raise CopyDamaged(f"the copy is not this memory's (it says it is of {manifest.of!r})")
    old = manifest.format == OLD_FORMAT
    names = manifest.names()
    if len(names) > MAX_FILES:
        raise CopyDamaged(f"the manifest names {len(names)} files, over {MAX_FILES}")
    if len(set(names)) != len(names):
        raise CopyDamaged("the manifest names a file twice")
    pat = OLD_NAME_RE if old else NAME_RE
    groups = [("seg", [n for s in manifest.segments for n in s]), ("vec", manifest.vectors)]
    groups += [("table", manifest.pages)] if old else [("page", manifest.pages), ("head", [manifest.head]),
                                                       ("dict", [manifest.dict] if manifest.dict else [])]
    for kind, group in groups:
        for n in group:
            if not isinstance(n, str) or not pat.fullmatch(n) or not n.startswith(kind + "-"):
                raise CopyDamaged(f"the manifest names {n!r}, which is no {kind} file name")
    if any(not s for s in manifest.segments):
        raise CopyDamaged("the manifest names a segment of no file")
    if not manifest.pages:
        raise CopyDamaged("the manifest names no table")
    if manifest.vectors and not manifest.model:
        raise CopyDamaged("the copy has vectors but names no model")


def reading_order(manifest: Manifest) -> list[str]:
    """The files of a copy in the order a load reads them."""
    m = manifest
    if m.format == OLD_FORMAT:
        first = m.pages[:1]
    else:
        first = [m.head] + ([m.dict] if m.dict else []) + list(m.pages)
    return first + [n for parts in m.segments for n in parts] + list(m.vectors)


class FetchAhead:
    """A copy's files fetched and checked (their hash, their decompression) one ahead of
    the reader, on a thread of its own: the bridge's transfer, the hash and zlib run
    while the reader checks and writes the file before (each lets go of the GIL), and at
    most two files are held at once. A file asked out of order is fetched then."""

    def __init__(self, fetch: Callable[[str], bytes], names: Iterable[str]):
        from concurrent.futures import ThreadPoolExecutor
        self.fetch = fetch
        self.names = list(names)
        self.at = 0
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="lnkmem-copy-read")
        self.ahead = None  # (name, future) of the next file
        self._next()

    def _next(self) -> None:
        self.ahead = None
        if self.at < len(self.names):
            name = self.names[self.at]
            self.at += 1
            self.ahead = (name, self.pool.submit(checked_blob, self.fetch, name))

    def __call__(self, name: str) -> bytes:
        if self.ahead is None or self.ahead[0] != name:
            return checked_blob(self.fetch, name)
        got = self.ahead[1]
        self._next()  # (queued behind it: it starts once this one is fetched)
        return got.result()

    def close(self) -> None:
        """Nothing more is read: what is ahead is dropped (a transfer under way ends first)."""
        if self.ahead is not None:
            self.ahead[1].cancel()
            self.ahead = None
        self.pool.shutdown(wait=True)
