"""Counting files: each one's passages (cut by kind: text, conversation, document:
:func:`read_file`), then a batch's postings, all its files' at once, as flat u32 columns
per file (:func:`count_files`) with term ids of the build's :class:`Vocab`; the same
here and in the build's worker process.
"""

from __future__ import annotations

from typing import Optional

import itertools

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


# a token's codes (:meth:`Vocab.codes`): a word's term id (>= 0), a stop word's -1, an
# identifier's ``-2 - id``; GAP_CODE: the gap between two texts (:data:`analyze.GAP`);
# at or below MANY: a token of other than one code (``MANY - k``: the k-th such, its
# codes in ``Vocab.many``)
GAP_CODE = -(1 << 40)
MANY = -(1 << 41)
UNSEEN = -(1 << 39)  # (a token not seen before, while its codes are looked up)
# a build's vocabulary is kept from batch to batch (each distinct token analysed once,
# not once a batch: 1x holds ~360k distinct tokens, a batch ~50k) until it holds this
# many tokens and words (~140 B each, in each process counting), then made anew
VOCAB_MAX = 200_000
VOCAB_BYTES = 16 << 20  # ... or the tokens and words it holds this many bytes (long ones: a blob's)


class Vocab(dict):
    """What a build's files are counted into: a word (bytes or str, as
    :func:`analyze.scan` gives it) or a whole identifier -> the id of its term
    among ``names`` (-1: a word not indexed, a stop word), filled on first
    sight; ``names``: the terms by id (of which :func:`count_files` gives each
    batch those it uses). A word never holds a connector and
    an identifier always does, so one map holds both.

    ``tokens``: each ASCII token of :func:`analyze.tokens` seen -> its code, a
    text's codes being its tokens' in turn (:meth:`codes`): each distinct token
    analysed once (:func:`analyze.token_parts`), no Python object made per token
    after. Most tokens are one word, one code; the codes of the others (an
    identifier and its words; punctuation alone: none) are in ``many``."""

    __slots__ = ("names", "ids", "tokens", "many", "held")

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []
        self.ids: dict[str, int] = {}  # term -> its id
        self.tokens: dict[bytes, int] = {analyze.GAP: GAP_CODE}
        self.many: list[tuple] = []
        self.held = 0  # bytes of the tokens and words it holds (their characters)

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
        self.held += len(key)
        return i

    def full(self) -> bool:
        """Whether to start a new one for the next batch (:data:`VOCAB_MAX`, :data:`VOCAB_BYTES`)."""
        return len(self.tokens) + len(self) >= VOCAB_MAX or self.held >= VOCAB_BYTES

    def codes(self, tokens: list[bytes]) -> np.ndarray:
        """The codes of ``tokens`` in turn (those of ``many`` each in its place), the
        tokens not seen before analysed first."""
        known = self.tokens
        c = np.fromiter(map(known.get, tokens, itertools.repeat(UNSEEN)), np.int64, len(tokens))
        unseen = np.flatnonzero(c == UNSEEN)
        if len(unseen):
            many = self.many
            for at in unseen.tolist():
                token = tokens[at]
                code = known.get(token)
                if code is None:
                    self.held += len(token)
                    words, whole = analyze.token_parts(token)
                    if len(words) == 1 and not whole:
                        code = known[token] = self[words[0]]
                    else:
                        code = known[token] = MANY - len(many)
                        many.append(tuple([self[w] for w in words] + [-2 - self[i] for i in whole]))
                c[at] = code
        multi = c <= MANY
        if not multi.any():
            return c
        parts = list(map(self.many.__getitem__, (MANY - c[multi]).tolist()))
        n = np.fromiter(map(len, parts), np.int64, len(parts))
        sizes = np.ones(len(c), np.int64)
        sizes[multi] = n
        out = np.repeat(c, sizes)  # (each of many's there as often as it has codes)
        total = int(n.sum())
        if total:
            first = np.repeat(np.cumsum(sizes)[multi] - n, n)  # where each one's codes start in ``out``
            step = np.arange(total) - np.repeat(np.cumsum(n) - n, n)
            out[first + step] = np.fromiter(itertools.chain.from_iterable(parts), np.int64, total)
        return out


def term_ids(text: str, vocab: Vocab) -> tuple[list[int], int]:
    """The term ids of a text's words and whole identifiers, with repeats (stop
    words as -1), and its length (its indexed words: identifiers not counted)."""
    words, whole = analyze.scan(text)
    ids = list(map(vocab.__getitem__, words))
    length = len(ids) - ids.count(-1)
    if whole:
        ids += map(vocab.__getitem__, whole)
    return ids, length


def codes_of(texts: list[str], vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """The codes (:data:`GAP_CODE`'s comment) of the words and identifiers of
    ``texts``, and the index of the text each is of: the ASCII texts (most) split
    together by byte tables, each distinct token analysed once (:meth:`Vocab.codes`);
    the others one by one (:func:`analyze.scan`)."""
    plain: list[str] = []
    at: list[int] = []
    codes: list[np.ndarray] = []
    which: list[np.ndarray] = []
    for j, text in enumerate(texts):
        a = analyze.ascii_text(text)
        if a is not None and "\0" not in a:
            plain.append(a)
            at.append(j)
            continue
        words, whole = analyze.scan(text)
        c = np.fromiter(map(vocab.__getitem__, words), np.int64, len(words))
        if whole:
            c = np.concatenate((c, -2 - np.fromiter(map(vocab.__getitem__, whole), np.int64, len(whole))))
        codes.append(c)
        which.append(np.full(len(c), j, np.int64))
    if plain:
        c = vocab.codes(analyze.tokens(plain))
        gap = c == GAP_CODE
        keep = ~gap
        codes.append(c[keep])
        which.append(np.asarray(at, np.int64)[np.cumsum(gap)[keep]])
    if not codes:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(codes) == 1:
        return codes[0], which[0]
    return np.concatenate(codes), np.concatenate(which)


# a batch's files are counted a group of this many characters at a time: numpy's
# temporaries of a 4 MB batch counted at once peaked at ~85 MiB (its tokens, their codes)
GROUP_CHARS = 1 << 19


def count_files(files: list[NewFile], vocab: Vocab) -> None:
    """Count files' postings (a batch's): each one's flat u32 columns (tids, npost,
    tfs, lens) and ``terms`` (the batch's: those of ``vocab`` its files use),
    counted from the term ids of each passage with repeats: its file's name words
    once, and its path whole (``docs/plan.md``, an identifier: no length); a
    conversation message's own words above its context's, a file's title above its
    body (BM25F by repetition: one length, the passage's words). The texts of
    GROUP_CHARS at a time are split at once (:func:`codes_of`), their counts made
    with numpy over them all (:func:`_count_group`)."""
    group: list[NewFile] = []
    chars = 0
    for f in files:
        group.append(f)
        chars += sum(len(p.text) for p in f.passages)
        if chars >= GROUP_CHARS:
            _count_group(group, vocab)
            group, chars = [], 0
    if group:
        _count_group(group, vocab)
    # the terms the batch uses (a build's vocabulary holds earlier batches' too)
    names = vocab.names
    used = np.zeros(0, np.int64)
    if files:
        used = np.flatnonzero(np.bincount(np.concatenate([f.tids for f in files]), minlength=len(names)))
    at = np.zeros(len(names), np.uint32)
    at[used] = np.arange(len(used), dtype=np.uint32)
    terms = [names[i] for i in used.tolist()]
    for f in files:
        f.terms, f.tids = terms, at[f.tids]


def _count_group(files: list[NewFile], vocab: Vocab) -> None:
    """:func:`count_files` of some files, at once: their ``tids`` ids of ``vocab``."""
    texts: list[str] = []
    of: list[int] = []  # each text's passage (among the batch's)
    weight: list[int] = []  # how many times it counts
    counted: list[bool] = []  # whether its words count in its passage's length (a title's repeat does not)
    sizes: list[int] = []  # passages of each file
    named: list[int] = []  # each file's name terms (the ids of those indexed), one file after another
    name_n: list[int] = []
    name_lens: list[int] = []
    base = 0
    for f in files:
        passages = f.passages
        path = f.ref.split("/", 1)[-1]
        name, name_len = term_ids(path.replace("/", " "), vocab)
        name += map(vocab.__getitem__, analyze.idents(path, inner=True))
        name = [i for i in name if i >= 0]
        named += name
        name_n.append(len(name))
        name_lens.append(name_len)
        conversation = f.ref.startswith("chats/")
        title = None if conversation and passages and passages[0].role is not None else title_of(passages)
        for k, p in enumerate(passages, base):
            if conversation and p.role is not None:  # a message: its own words above its context's
                cut = chats.own_start(p.text)
                texts.append(p.text[cut:])
                of.append(k)
                weight.append(chats.OWN_WEIGHT)
                counted.append(True)
                if cut:
                    texts.append(p.text[:cut])
                    of.append(k)
                    weight.append(1)
                    counted.append(True)
            else:
                texts.append(p.text)
                of.append(k)
                weight.append(1)
                counted.append(True)
        if title and TITLE_WEIGHT > 1:  # (in the first passage: a file's title is on its first line)
            texts.append(title)
            of.append(base)
            weight.append(TITLE_WEIGHT - 1)
            counted.append(False)
        sizes.append(len(passages))
        base += len(passages)
    n = base
    codes, which = codes_of(texts, vocab)
    owner = np.asarray(of, np.int64)[which]
    words = (codes >= 0) & np.asarray(counted, bool)[which]
    per = np.asarray(sizes, np.int64)
    lens = (np.bincount(owner[words], minlength=n) + np.repeat(np.asarray(name_lens, np.int64), per)).astype(np.uint32)
    ids = np.where(codes <= -2, -2 - codes, codes)
    kept = ids >= 0
    key = (owner[kept] << 32) | ids[kept]
    times = np.asarray(weight, np.int64)[which[kept]]
    if (times > 1).any():
        key = np.repeat(key, times)
    if named:  # each passage its file's name terms
        nn = np.asarray(name_n, np.int64)
        each = np.repeat(nn, per)  # how many a passage has
        total = int(each.sum())
        if total:
            first = np.repeat(np.repeat(np.cumsum(nn) - nn, per), each)  # its file's first
            step = np.arange(total) - np.repeat(np.cumsum(each) - each, each)
            key = np.concatenate((key, (np.repeat(np.arange(n, dtype=np.int64), each) << 32)
                                  | np.asarray(named, np.int64)[first + step]))
    key, tfs = np.unique(key, return_counts=True)
    npost = np.bincount(key >> 32, minlength=n).astype(np.uint32)
    tids = (key & 0xFFFFFFFF).astype(np.uint32)
    tfs = tfs.astype(np.uint32)
    ends = np.cumsum(npost, dtype=np.int64)
    p0 = q0 = 0
    for f, size in zip(files, sizes):
        p1 = p0 + size
        q1 = int(ends[p1 - 1]) if size else q0
        f.tids, f.npost, f.tfs, f.lens = tids[q0:q1], npost[p0:p1], tfs[q0:q1], lens[p0:p1]
        p0, q0 = p1, q1


def read_file(source: str, entry: Entry, place, tmpdir: str) -> Optional[NewFile]:
    """Read and cut one file, its postings not counted yet (:func:`count_files`); None
    when it vanished or cannot be read."""
    try:
        data, version = place.read(entry.path)
    except (NotFound, Forbidden, OSError):
        return None
    ref = ref_of(source, entry.path)
    passages, kind = passages_of(source, entry.path, data, tmpdir, None)  # (converted from its bytes)
    if kind == "binary":
        passages = []
    version = version if version else entry.version
    return NewFile(ref, version, len(data), kind, passages, None, file_time(place, entry, version))


def index_file(source: str, entry: Entry, place, tmpdir: str, vocab: Optional[Vocab] = None) -> Optional[NewFile]:
    """Read, cut and count one file (:func:`read_file`, :func:`count_files`); None when
    it vanished or cannot be read."""
    nf = read_file(source, entry, place, tmpdir)
    if nf is not None:
        count_files([nf], vocab if vocab is not None else Vocab())
    return nf


def as_listed(nf: Optional[NewFile], entry: Entry) -> bool:
    """Whether a file was indexed as its listing said (read, and not changed between the two)."""
    return nf is not None and nf.version == entry.version and nf.size == entry.size

