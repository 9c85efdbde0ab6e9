"""What a hit must satisfy beyond its score, and the scored phrases' lifts.

:class:`Checks`: exclusions and ``+words`` by postings; required and excluded
phrases and dates on the candidates' text, at most :data:`CHECK_CAP` passages read,
best first (dates first judged on every candidate by its file's time, one
file-table read per file); a scored phrase's lift where a passage holds it.
:class:`Texts`: the passages one search reads, and their neighbours in their file (a
phrase may span the boundary of two passages). :func:`holding_every`: the passages
holding every term, alone or with a neighbour.
"""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

from lnkmem.index.text import query as qlang
from lnkmem.index.format import SOURCE_CODE, Passage
from lnkmem.index.rank.dates import seconds
from lnkmem.index.snapshot import Snapshot
from lnkmem.index.store import Store


_CHATS = SOURCE_CODE["chats"]
CHECK_CAP = 4000  # passages whose text is checked (phrases, dates) per search, at most

Pairs = list[tuple[int, float]]  # (pid, score), best first

# kept with the snapshot (Snapshot.worked_out) under this name, as terms.FACTS is
FILE_TIMES = "file times"  # file times by refid: Checks.by_file_time


class Checks:
    """What a hit must satisfy beyond its score: no excluded term, every required
    phrase's words in order (in the passage, or across its boundary with the passage
    before or after it in its file), every ``+word``, no excluded phrase, a time in
    [after, before). Also the scored phrases' lifts (:meth:`lift`)."""

    def __init__(self, q: qlang.Query, after: Optional[float], before: Optional[float]):
        self.q = q
        self.after, self.before = after, before
        self.phrases = [(qlang.phrase_pattern(w), len(w)) for w in q.phrases]
        self.not_phrases = [qlang.phrase_pattern(w) for w in q.excluded_phrases]
        self.scored = [(qlang.phrase_pattern(w), len(w)) for w in q.scored]
        self.lifts: list[float] = [0.0] * len(q.scored)  # each scored phrase's lift (set by the ranking)
        self.holders: list = [None] * len(q.scored)  # pids that may hold each scored phrase (bool by pid)
        self.banned: Optional[np.ndarray] = None  # pids holding an excluded term
        self.required: Optional[np.ndarray] = None  # pids holding (with a neighbour) every required term
        self.snap: Optional[Snapshot] = None  # the snapshot the ranking read (a passage's neighbours)

    @property
    def on_text(self) -> bool:
        return bool(self.phrases or self.not_phrases or self.after is not None or self.before is not None)

    @property
    def any(self) -> bool:
        return self.on_text or self.banned is not None or self.required is not None

    def mask_ok(self, pids: np.ndarray) -> np.ndarray:
        ok = np.ones(len(pids), bool)
        for m, want in ((self.banned, False), (self.required, True)):
            if m is not None:
                inside = pids < len(m)
                got = np.zeros(len(pids), bool)
                got[inside] = m[pids[inside]]
                ok &= got == want
        return ok

    @property
    def dated(self) -> bool:
        return self.after is not None or self.before is not None

    def by_file_time(self, store: Store, snap: Snapshot, cand: np.ndarray) -> np.ndarray:
        """Those of ``cand`` whose file's time can pass, judged for all of them at
        once (one file-table read per file, kept for the snapshot): a file's passage
        by that time; a conversation's is kept unless its file was last changed
        before ``after`` (no message of it can be later); the rest is left to the
        text check."""
        rids = snap.refid[cand]
        uniq, inv = np.unique(rids, return_inverse=True)
        known = snap.worked_out.get(FILE_TIMES)
        if known is None:
            known = snap.worked_out.setdefault(FILE_TIMES, {})
        times = np.empty(len(uniq), np.float64)
        for i, r in enumerate(uniq.tolist()):
            if r not in known:
                known[r] = seconds(store.file_mtime(snap.refs[r])) if r >= 0 else None
            v = known[r]
            times[i] = np.nan if v is None else v
        t = times[inv]
        chat = snap.src[cand] == _CHATS
        ok = np.ones(len(cand), bool)
        if self.after is not None:
            ok &= np.where(chat, ~(t < self.after), t >= self.after)  # nan: unknown, kept for a chat
        if self.before is not None:
            ok &= chat | (t < self.before)
        return cand[ok]

    def time_of(self, store: Store, p: Passage, files: dict) -> Optional[float]:
        """A passage's time: its message's in a conversation, else its file's
        modification time (from the file table, once per file)."""
        if p.thread is not None:
            return seconds(p.at)
        if p.ref not in files:
            files[p.ref] = seconds(store.file_mtime(p.ref))
        return files[p.ref]

    def text_ok(self, texts: "Texts", pid: int, p: Passage, t: Optional[float] = None) -> bool:
        if self.after is not None or self.before is not None:
            if t is None or (self.after is not None and t < self.after) or \
                    (self.before is not None and t >= self.before):
                return False
        if self.phrases or self.not_phrases:
            low = p.text.casefold()
            if any(r.search(low) for r in self.not_phrases):
                return False
            if any(not texts.holds(r, n, pid, p, low) for r, n in self.phrases):
                return False
        return True

    def filter(self, store: Store, pairs: Pairs, want: int) -> Pairs:
        """Those of ``pairs`` (best first) that pass, the first ``want``, reading at
        most CHECK_CAP passages."""
        if not self.any or not pairs:
            return pairs[:want]
        arr = np.fromiter((p for p, _ in pairs), np.int64, len(pairs))
        ok = self.mask_ok(arr)
        pairs = [x for x, good in zip(pairs, ok) if good]
        if not self.on_text:
            return pairs[:want]
        out: Pairs = []
        dated = self.after is not None or self.before is not None
        files: dict = {}
        texts = Texts(store, self.snap or store.refresh())
        for i in range(0, min(len(pairs), CHECK_CAP), 256):
            chunk = pairs[i:min(i + 256, CHECK_CAP)]
            for pair, p in zip(chunk, texts.read([pid for pid, _ in chunk])):
                if p is not None and self.text_ok(texts, pair[0], p, self.time_of(store, p, files) if dated else None):
                    out.append(pair)
                    if len(out) >= want:
                        return out
        return out

    def lift(self, store: Store, snap: Snapshot, cand: np.ndarray, sc: np.ndarray) -> np.ndarray:
        """``sc`` (the scores of ``cand``) with each scored phrase's lift added where the
        passage holds it (or it spans the passage's boundary with a neighbour in its
        file): at most PHRASE_CHECK passages read, the best of those whose words (with a
        neighbour's) hold the phrase's."""
        if not self.scored or not len(cand):
            return sc
        may = np.zeros(len(cand), bool)
        for h in self.holders:
            if h is not None:
                inside = cand < len(h)
                may[inside] |= h[cand[inside]]
        at = np.flatnonzero(may)
        if not len(at):
            return sc
        if len(at) > PHRASE_CHECK:
            at = at[np.argpartition(-sc[at], PHRASE_CHECK - 1)[:PHRASE_CHECK]]
        sc = sc.copy()
        texts = Texts(store, snap)
        pids = cand[at].tolist()
        for i, pid, p in zip(at.tolist(), pids, texts.read(pids)):
            if p is None:
                continue
            low = p.text.casefold()
            for (r, n), lift, h in zip(self.scored, self.lifts, self.holders):
                if lift and h is not None and pid < len(h) and h[pid] and texts.holds(r, n, pid, p, low):
                    sc[i] += lift
        return sc
PHRASE_CHECK = 256  # passages read per search for the scored phrases, at most (the best of those that may hold one)


class Texts:
    """The passages one search reads for its text checks, by pid, and their neighbours
    in their file (a phrase may span the boundary between two passages)."""

    def __init__(self, store: Store, snap: Snapshot):
        self.store, self.snap = store, snap
        self.kept: dict[int, Optional[Passage]] = {}

    def read(self, pids: list[int]) -> list[Optional[Passage]]:
        todo = [p for p in pids if p not in self.kept]
        for p, got in zip(todo, self.store.passages_of(todo)):
            self.kept[p] = got
        return [self.kept[p] for p in pids]

    def neighbours(self, pid: int) -> list[int]:
        """The passages just before and after ``pid`` in its file, alive."""
        refid, alive = self.snap.refid, self.snap.alive
        if not 0 <= pid < min(len(refid), len(alive)) or refid[pid] < 0:
            return []
        r = refid[pid]
        return [n for n in (pid - 1, pid + 1) if 0 <= n < min(len(refid), len(alive)) and refid[n] == r and alive[n]]

    def holds(self, pattern: re.Pattern, size: int, pid: int, p: Passage, low: str) -> bool:
        """Whether passage ``p`` (``pid``; ``low``: its text case-folded) holds the phrase
        (``pattern``, ``size`` characters long), alone or across its boundary with a
        neighbour of its file."""
        if pattern.search(low):
            return True
        span = 2 * size + 64
        near = self.neighbours(pid)
        for n, o in zip(near, self.read(near)):
            if o is None or o.ref != p.ref:
                continue
            a, b = (o.text, p.text) if n < pid else (p.text, o.text)
            a, b = a[-span:].casefold(), b[:span].casefold()
            joined = a + "\n" + b
            for m in pattern.finditer(joined):
                if m.start() < len(a) < m.end():
                    return True
        return False


def holding_every(cap: int, refid: np.ndarray, masks: list[np.ndarray]) -> np.ndarray:
    """The passages (bool by pid) that hold every term (``masks``: bool by pid, one a
    term), alone or with the passage before or after them in their file."""
    every = masks[0].copy()
    for m in masks[1:]:
        every &= m
    if cap < 2:
        return every
    same = np.zeros(cap, bool)  # pid and pid + 1 in one file
    n = min(cap, len(refid))
    same[:n - 1] = (refid[:n - 1] == refid[1:n]) & (refid[:n - 1] >= 0)
    nxt = same.copy()
    prv = np.zeros(cap, bool)
    prv[1:] = same[:-1]
    for m in masks:
        up = np.zeros(cap, bool)
        up[:-1] = m[1:]
        down = np.zeros(cap, bool)
        down[1:] = m[:-1]
        nxt &= m | up
        prv &= m | down
    some = masks[0].copy()
    for m in masks[1:]:
        some |= m
    return every | ((nxt | prv) & some)
