"""Counting one file: its passages (cut by kind: text, conversation, document), then its
postings as flat u32 columns (:func:`columns`) with term ids of a batch's :class:`Vocab`
(:func:`index_file`); the same here and in the build's worker process.
"""

from __future__ import annotations

from array import array
from typing import Optional

import numpy as np

from lnkmem.bridges.place import Entry, Forbidden, NotFound
from lnkmem.core.knobs import knobs
from lnkmem.index.text import analyze, chats, documents
from lnkmem.index.text.chunk import chunk_text
from lnkmem.index.commit import NewFile
from lnkmem.index.format import Passage

# A batch is committed every so many bytes or files (tests make them small
# with LNKMEM_BATCH_FILES to kill indexing between batches).
BATCH_BYTES = 4 * 1024 * 1024
BATCH_FILES = knobs().batch_files


def ref_of(source: str, path: str) -> str:
    return f"{source}/{path}" if path else source


def split_ref(ref: str) -> tuple[str, str]:
    source, _, path = ref.partition("/")
    return source, path


def decode_text(data: bytes) -> Optional[str]:
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", "replace")


def passages_of(source: str, path: str, data: bytes, tmpdir: str, local_path: Optional[str]) -> tuple[list[Passage], str]:
    """Passages of one file, and how it was indexed ("text", "name", "name-failed" or "binary")."""
    ref = ref_of(source, path)
    thread = None
    if source == "chats":
        if not chats.is_conversation(path.rsplit("/", 1)[-1]):
            text = decode_text(data)
            if text is None:
                return [Passage(ref, 1, 1, path)], "name"
            return [Passage(ref, p.first, p.last, p.text) for p in chunk_text(text)], "text"
        thread = chats.thread_of(path.rsplit("/", 1)[-1])
        text = decode_text(data)
        if text is None:
            return [Passage(ref, 1, 1, path, thread=thread)], "name"
        pieces, _ = chats.chunk_conversation(path, text)
        return [Passage(ref, c.first, c.last, c.text, thread, c.role, c.at) for c in pieces], "text"
    if documents.is_document(path):
        installed = documents.converter() is not None
        text = documents.convert(data, path, tmpdir, local_path) if installed else None
        if text is None:  # by name: "name" while no converter is installed, to be converted once one is
            return [Passage(ref, 1, 1, path)], ("name-failed" if installed else "name")
    else:
        text = decode_text(data)
        if text is None:
            return [], "binary"
    out = [Passage(ref, p.first, p.last, p.text) for p in chunk_text(text)]
    return out, "text"


# A file's title (a heading on its first line, or a short first line with a blank line
# after it) counts this many times in its passage, as a title field weighted in BM25F
# (one length normalisation: the passage's words). BEIR SciFact train nDCG@10 by words:
# 1 (as before) 0.6930; 2 0.6946; 3 0.6948 (the title in every passage of the file
# as well: no change); docs/BENCHMARKS.md.
TITLE_WEIGHT = 2
TITLE_CHARS = 200


def title_of(passages: list[Passage]) -> Optional[str]:
    """The title of a file whose first passage starts at its first line, if any."""
    if not passages or passages[0].first != 1:
        return None
    text = passages[0].text
    end = text.find("\n")
    first = (text if end < 0 else text[:end]).strip()
    if first.startswith("#") and first.lstrip("#").startswith(" "):
        return first.lstrip("#").strip()[:TITLE_CHARS]
    rest = text[end + 1:] if end >= 0 else ""
    if 0 < len(first) <= TITLE_CHARS and not rest.split("\n", 1)[0].strip() and rest.strip():
        return first  # (a first line alone is no title of anything)
    return None


def file_time(place, entry: Entry, version: str) -> Optional[str]:
    """The file's modification time (RFC 3339, UTC) for the date filters, as its
    place's entry gives it (a local file's: of the version read); None if unknown."""
    return entry._replace(version=version or entry.version).modified or None


class Vocab(dict):
    """What a batch's files are counted into: a word (bytes or str, as
    :func:`analyze.scan` gives it) or a whole identifier -> the id of its term
    among the terms of the batch (-1: a word not indexed, a stop word), filled
    on first sight; ``names``: the terms by id (what a file's ``tids`` index).
    A word never holds a connector and an identifier always does, so one map
    holds both."""

    __slots__ = ("names", "ids")

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.ids: dict[str, int] = {}  # term -> its id

    def __missing__(self, key) -> int:
        if isinstance(key, bytes):  # an ASCII word
            term = analyze.term_of(key.decode("ascii"))
        else:  # a word is letters and digits only; an identifier holds a connector
            term = analyze.term_of(key) if key.isalnum() else key
        if not term:
            i = -1
        else:
            i = self.ids.get(term)
            if i is None:
                i = self.ids[term] = len(self.names)
                self.names.append(term)
        self[key] = i
        return i


def term_ids(text: str, vocab: Vocab) -> tuple[list[int], int]:
    """The term ids of a text's words and whole identifiers, with repeats (stop
    words as -1), and its length (its indexed words: identifiers not counted)."""
    words, whole = analyze.scan(text)
    ids = list(map(vocab.__getitem__, words))
    length = len(ids) - ids.count(-1)
    if whole:
        ids += map(vocab.__getitem__, whole)
    return ids, length


def columns(ref: str, passages: list[Passage], vocab: Vocab) -> tuple[np.ndarray, ...]:
    """A file's postings as flat u32 columns (tids, npost, tfs, lens), counted
    from the term ids of each passage with repeats: its file's name words
    once, and its path whole (``docs/plan.md``, an identifier: no length); a
    conversation message's own words above its context's, a file's title
    above its body (BM25F by repetition: one length, the passage's words)."""
    path = ref.split("/", 1)[-1]
    name, name_len = term_ids(path.replace("/", " "), vocab)
    name += map(vocab.__getitem__, analyze.idents(path, inner=True))
    conversation = ref.startswith("chats/")
    title = None if conversation and passages and passages[0].role is not None else title_of(passages)
    extra = term_ids(title, vocab)[0] * (TITLE_WEIGHT - 1) if title else []
    flat: list[int] = []
    sizes = array("I")
    lens = array("I")
    for p in passages:
        at = len(flat)
        if conversation and p.role is not None:  # a message: its own words above its context's
            cut = chats.own_start(p.text)
            own, length = term_ids(p.text[cut:], vocab)
            flat += own * chats.OWN_WEIGHT
            if cut:
                ctx, ctx_len = term_ids(p.text[:cut], vocab)
                flat += ctx
                length += ctx_len
        else:
            ids, length = term_ids(p.text, vocab)
            flat += ids
            if extra:
                flat += extra
                extra = []
        flat += name
        sizes.append(len(flat) - at)
        lens.append(length + name_len)
    ids = np.array(flat, np.int64)
    key = np.repeat(np.arange(len(passages), dtype=np.int64) << 32, np.frombuffer(sizes, np.uint32)) | ids
    key, tfs = np.unique(key[ids >= 0], return_counts=True)
    npost = np.bincount(key >> 32, minlength=len(passages)).astype(np.uint32)
    return ((key & 0xFFFFFFFF).astype(np.uint32), npost, tfs.astype(np.uint32), np.frombuffer(lens, np.uint32))


def index_file(source: str, entry: Entry, place, tmpdir: str, vocab: Optional[Vocab] = None) -> Optional[NewFile]:
    """Read and cut one file; None when it vanished or cannot be read. Its term
    ids are ``vocab``'s (the batch's) when given, else its own."""
    try:
        data, version = place.read(entry.path)
    except (NotFound, Forbidden, OSError):
        return None
    ref = ref_of(source, entry.path)
    passages, kind = passages_of(source, entry.path, data, tmpdir, None)  # (converted from its bytes)
    if kind == "binary":
        passages = []
    version = version if version else entry.version
    if vocab is None:
        vocab = Vocab()
    tids, npost, tfs, lens = columns(ref, passages, vocab)
    return NewFile(ref, version, len(data), kind, passages, None, file_time(place, entry, version),
                   vocab.names, tids, npost, tfs, lens)


def as_listed(nf: Optional[NewFile], entry: Entry) -> bool:
    """Whether a file was indexed as its listing said (read, and not changed between the two)."""
    return nf is not None and nf.version == entry.version and nf.size == entry.size

