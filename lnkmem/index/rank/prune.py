"""BM25 over the words index (Robertson/Sparck Jones idf, Lucene's form),
with the query language (:mod:`lnkmem.index.text.query`) and the date filters.

Cost is bounded whatever the query or the index: at most ``query.MAX_TERMS``
terms are scored (vectorised over their postings); the best are chosen in
numpy (the last place's score, then a partition of the ties at it by (ref,
place in the file)), never by sorting every candidate in Python, so a Home of
444,444 tied passages costs a few vectorised passes over them; phrases, excluded phrases and dates are
checked on at most :data:`CHECK_CAP` passages' text, best first (dates
are first judged on every candidate by its file's time, one file-table read
per file).
"""

from __future__ import annotations

import itertools
import re
import threading
from datetime import date, datetime, timezone
from typing import Optional, Sequence, Union

import numpy as np

from lnkmem.index.text import analyze
from lnkmem.index.codec import postings as plists
from lnkmem.index.text import query as qlang
from lnkmem.index.format import SOURCE_CODE, Passage
from lnkmem.index.snapshot import Snapshot
from lnkmem.index.store import Store

_CHATS = SOURCE_CODE["chats"]

K1 = 1.2  # tuned on BEIR SciFact train (docs/BENCHMARKS.md)
B = 0.75
CHECK_CAP = 4000  # passages whose text is checked (phrases, dates) per search, at most
SAMPLE = 1024  # scores sampled for a floor under the last place's (top)
TIES_BY_HAND = 64  # passages tied for the last place that top orders in Python (more: by numpy)
FIRST_LOOK = 8  # MaxScore looks up its best 2·k first when more than this many times k may reach the top
LOOKUP_WHOLE = 16 << 10  # a packed list this short that MaxScore looks up is decoded whole and kept (Store.looked_up)

Pairs = list[tuple[int, float]]


# --- dates ------------------------------------------------------------------------

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_when(value: str, name: str) -> float:
    """Seconds since the epoch of an RFC 3339 date (midnight UTC) or date-time
    (an offset or Z; none means UTC). ValueError naming ``name`` otherwise."""
    v = value.strip()
    try:
        if _DATE.match(v):
            d = date.fromisoformat(v)
            return datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp()
        if len(v) < 11 or v[10] not in "Tt ":
            raise ValueError(v)
        t = datetime.fromisoformat(v[:-1] + "+00:00" if v[-1] in "Zz" else v)
        if t.tzinfo is None:
            t = t.replace(tzinfo=timezone.utc)
        return t.timestamp()
    except (ValueError, OverflowError):
        raise ValueError(f"{name}: {value!r} is not an RFC 3339 date (2024-03-01) or date-time "
                         f"(2024-03-01T09:30:00Z)") from None


def _seconds(when: Optional[str]) -> Optional[float]:
    if not when:
        return None
    try:
        return parse_when(when, "at")
    except ValueError:
        return None


# What a search works out once for a snapshot is kept with it (Snapshot.worked_out), under
# these names: it lives as long as the snapshot (a change's new snapshot starts with none),
# and memories searched in turn in one process (serve-many) each keep their own.
FACTS = "facts"  # (shortest live length, segments holding dead, dead held by list): _facts
FILE_TIMES = "file times"  # file times by refid: Checks.by_file_time


# --- ties ---------------------------------------------------------------------------

def _tie_rank(snap: Snapshot, rids: np.ndarray) -> np.ndarray:
    """Each of ``rids``' place among the refs they name, in ref order (refid -1 last).
    Only the tied passages' own refs are sorted: never every ref of the index, which
    each new snapshot (every change) would otherwise sort again (a p99 of searches
    after changes: 14-23 ms at 1x, growing with the files)."""
    uniq, inv = np.unique(rids, return_inverse=True)
    names = [snap.refs[r] if r >= 0 else None for r in uniq.tolist()]
    order = sorted(range(len(names)), key=lambda i: (names[i] is None, names[i] or ""))
    rank = np.empty(len(names), np.int64)
    rank[order] = np.arange(len(names))
    return rank[inv]


def top(snap: Snapshot, cand: np.ndarray, sc: np.ndarray, want: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``want`` best of ``cand`` (scores ``sc``), best first; ties by ref, then
    by place in the file (a file's pids ascend with its lines). O(n) whatever the ties;
    a ref is read only where scores tie (most searches: none)."""
    if len(cand) > 2 * SAMPLE and want * 64 < len(cand):
        # a floor under the last place's score: the ``want``-th best of an evenly
        # spaced sample (never above the whole's); every passage above it is kept,
        # ties at the last place included, and the rest dropped at one comparison
        sample = sc[::len(sc) // SAMPLE]
        if len(sample) > 2 * want:
            floor = np.partition(sample, len(sample) - want)[len(sample) - want]
            keep = sc >= floor
            cand, sc = cand[keep], sc[keep]
    if len(cand) > want:
        # the score of the last place: numpy's vectorised sort, since its partition
        # degrades on masses of equal values (0.4 s for 2M ties against 0.02 s)
        kth = np.sort(sc)[len(sc) - want]
        keep = sc >= kth
        if np.count_nonzero(keep) > want:  # more tie at the last place than it has room for
            above = np.flatnonzero(sc > kth)
            tied = np.flatnonzero(sc == kth)
            need = want - len(above)
            ct = cand[tied]
            if len(tied) <= TIES_BY_HAND:
                refs, cs, rs = snap.refs, ct.tolist(), snap.refid[ct].tolist()
                pick = sorted(range(len(cs)), key=lambda i: (_ref_key(refs, rs[i]), cs[i]))[:need]
                tied = tied[pick]
            else:
                key = (_tie_rank(snap, snap.refid[ct]) << 32) | ct.astype(np.int64)
                tied = tied[np.argpartition(key, need - 1)[:need]]
            keep = np.concatenate((above, tied))
        cand, sc = cand[keep], sc[keep]
    s = sc.tolist()
    order = sorted(range(len(s)), key=s.__getitem__, reverse=True)
    if len(set(s)) < len(s):  # equal scores: those ordered by ref, then place (refs read for them only)
        refs, c, rs = snap.refs, cand.tolist(), snap.refid[cand].tolist()
        i, n = 0, len(order)
        while i < n:
            j, si = i + 1, s[order[i]]
            while j < n and s[order[j]] == si:
                j += 1
            if j - i > 1:
                order[i:j] = sorted(order[i:j], key=lambda k: (_ref_key(refs, rs[k]), c[k]))
            i = j
    return cand[order], sc[order]


def _ref_key(refs, rid: int) -> tuple:
    """Sort key of a passage's ref (refid -1, none: last)."""
    return (False, refs[rid]) if rid >= 0 else (True, "")


# --- the words ranking --------------------------------------------------------------

def _facts_known(snap: Snapshot) -> Optional[tuple[float, dict, dict]]:
    """:func:`_facts` of ``snap`` when a search has computed them already, else None."""
    return snap.worked_out.get(FACTS)


def _facts(snap: Snapshot) -> tuple[float, dict, dict]:
    """The shortest live passage's length (the bound of every BM25 score), the
    segments that hold dead passages, each with their ids (ascending): a list there
    is checked for its live count; elsewhere its header's count is the live count;
    and, by list (segment and term), how many of those dead it holds, as counted
    (a segment's list never changes, and the dead are the snapshot's: a search
    after a change counts a list's dead once, not at every search). Computed once
    a snapshot."""
    known = _facts_known(snap)
    if known is not None:
        return known
    live = snap.doclen[snap.alive]
    mindl = float(live.min()) if len(live) else 0.0
    seg_of = snap.seg_of[:len(snap.alive)]
    dead = np.flatnonzero((~snap.alive) & (seg_of >= 0))
    of = seg_of[dead]
    order = np.argsort(of, kind="stable")  # (ids ascend within each segment)
    segs, first = np.unique(of[order], return_index=True)
    dirty = {int(sg): part for sg, part in zip(segs.tolist(), np.split(dead[order], first[1:]))}
    # (two threads may work them out at once: the first kept is every search's)
    return snap.worked_out.setdefault(FACTS, (mindl, dirty, {}))


HELD_KEPT = 1 << 14  # lists whose dead count a snapshot's facts keep (~100 B each); emptied when full


# a segment's list of this many times more postings than its segment has dead passages
# is counted live by looking those up (only the blocks that may hold them decoded: a
# changed file's passages are neighbours), its dead postings left in and their passages
# dropped from the candidates; a shorter one is decoded and its dead postings dropped
FEW_DEAD = 8


class _Term:
    """One ranked term: its lists (a segment's decoded and live; or as stored or as
    cached, when every posting in it is live or its segment's dead are few: see
    :func:`_terms`), its live df, weight, idf and score bound."""

    __slots__ = ("term", "w", "lists", "df", "maxtf", "idf", "ub", "dead", "k1")

    def __init__(self, term: str, w: float, k1: float = 0.0):
        self.term, self.w, self.k1 = term, w, k1
        # (key, packed bytes or None, (pids, tfs) decoded or None); a list decoded and checked
        # against the live passages: (None, None, its live (pids, tfs))
        self.lists: list = []
        self.df = self.maxtf = 0
        self.idf = self.ub = 0.0
        self.dead = False  # a list of it was left holding postings of dead passages (FEW_DEAD)


def _expand(store: Store, txn, segs: list[bytes], prefix: str, room: int) -> list[str]:
    """Terms of the dictionary starting with ``prefix``, the first ``room`` in order."""
    p = prefix.encode()
    found: set[bytes] = set()
    for sk in segs:
        cur = txn.cursor(db=store.postings)
        n = 0
        if cur.set_range(sk + p):
            for k in cur.iternext(values=False):
                if not k.startswith(sk + p) or n >= room:
                    break
                found.add(bytes(k[4:]))
                n += 1
    return [t.decode() for t in sorted(found)[:room]]


def _weights(store: Store, txn, segs: list[bytes], q: qlang.Query) -> dict:
    """The query's ranked terms and their weights, its prefixes expanded from the
    dictionary (an excluded term never ranked)."""
    weights = dict(q.weights)
    room = qlang.MAX_TERMS
    for prefix in q.prefixes:
        if room <= 0:
            break
        for t in _expand(store, txn, segs, prefix, min(qlang.MAX_EXPANSIONS, room)):
            if t not in q.excluded:
                weights.setdefault(t, 1.0)
            room -= 1
    return weights


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
                known[r] = _seconds(store.file_mtime(snap.refs[r])) if r >= 0 else None
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
            return _seconds(p.at)
        if p.ref not in files:
            files[p.ref] = _seconds(store.file_mtime(p.ref))
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


PHRASE_WEIGHT = 0.1  # a scored phrase's lift: this times the sum of its words' idf (the prose set's tuning parts, SciFact train / LoCoMo 1-5: 0 0.6948 / 0.7914, 0.1 0.6951 / 0.7914, 0.25 0.6942 / 0.7924, 0.5 0.6924 / 0.7922, 1 0.6901 / 0.7912)
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


def _holders(cap: int, refid: np.ndarray, masks: list[np.ndarray]) -> np.ndarray:
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


def _newest(store: Store, snap: Snapshot, checks: Checks, want: int, sources, under) -> Pairs:
    """Passages holding the query's phrases among the newest CHECK_CAP (none of
    their words is indexed, so nothing scores them: 0 for all)."""
    cand = snap.keep(np.flatnonzero(snap.alive)[::-1], sources, under)
    cand = cand[checks.mask_ok(cand)]
    if checks.dated and len(cand):
        cand = checks.by_file_time(store, snap, cand)
    cand = cand[:CHECK_CAP]
    return checks.filter(store, [(int(p), 0.0) for p in cand], want)


def _tf_score(idf, tf, dl, avgdl: float, k1: float, b: float):
    """BM25's score of a term (its ``idf``) in passages with ``tf`` and length ``dl``: one
    expression for scoring, bounding and the bounds per passage, so a bound is never below
    the score it bounds by a rounding."""
    # (folded so that an array goes through five operations, not eight)
    return idf * (k1 + 1) * tf / (tf + (k1 * (1 - b) + k1 * b / avgdl * dl))


class _Scratch(threading.local):
    """A thread's arrays over passage ids, kept between its searches: a search's
    cost is its postings', not the index's size (zeroing a score per passage of a
    million-passage index, and scanning it for the union, cost more than a query
    of rare words). A search writes only where it notes (``touched``, ``marked``),
    and those places are zeroed after it; after an error the arrays are dropped."""

    def __init__(self):
        self.scores = np.zeros(0, np.float32)
        self.seen = np.zeros(0, bool)
        self.inc = np.zeros(0, bool)
        self.touched: list = []  # pid arrays whose scores were written
        self.marked: list = []  # pid arrays set in inc
        self.seen_set = False  # whether the touched are set in seen too (a union of many: _union)

    def take(self, cap: int) -> None:
        if len(self.scores) < cap:
            n = max(cap, len(self.scores) * 5 // 4)
            self.scores, self.seen, self.inc = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        self.touched, self.marked, self.seen_set = [], [], False

    def clean(self) -> None:
        for t in self.touched:
            self.scores[t] = 0
            if self.seen_set:
                self.seen[t] = False
        for m in self.marked:
            self.inc[m] = False
        self.touched, self.marked, self.seen_set = [], [], False

    def drop(self) -> None:
        self.__init__()


_scratch = _Scratch()


def _union(touched: list, cap: int) -> np.ndarray:
    """The pids of ``touched``'s arrays (those of ``_scratch.touched``), ascending, each
    once: marked in ``_scratch.seen`` and read back when they are many, else sorted (no
    pass over every id)."""
    if len(touched) == 1 and _ascending(touched[0]):
        return touched[0]
    total = sum(len(t) for t in touched)
    if total * 16 > cap:
        seen = _scratch.seen
        _scratch.seen_set = True  # (unmarked after the search: ``_Scratch.clean``)
        for t in touched:
            seen[t] = True
        return np.flatnonzero(seen[:cap])
    # (a sort: np.unique's hashing is slower here; the stable one, since each list ascends
    # and it merges runs: ~10x numpy's default on the concatenation of two or three)
    c = np.sort(np.concatenate(touched).astype(np.int64), kind="stable")
    return c[np.concatenate(([True], c[1:] != c[:-1]))] if len(c) else c


def _ascending(p: np.ndarray) -> bool:
    """``p`` strictly ascends (one segment's list does; several joined may not)."""
    return len(p) < 2 or bool((p[1:] > p[:-1]).all())


def words(store: Store, query: Union[str, qlang.Query], limit: int, sources: Optional[Sequence[str]] = None,
          under: Optional[str] = None, k1: float = K1, b: float = B, candidates: Optional[int] = None,
          after: Optional[float] = None, before: Optional[float] = None,
          prune: bool = True) -> tuple[Pairs, Checks]:
    """Best (pid, score) pairs for ``query``, best first, and the checks any
    other ranking's hits must pass too (exclusions, phrases, dates).

    ``prune``: MaxScore (terms that cannot lift a passage into the top are only looked
    up); False scores every posting (the same answers: tests and bench_prune's A/B)."""
    q = qlang.parse(query) if isinstance(query, str) else query
    try:
        out = _words(store, q, limit, sources, under, k1, b, candidates, after, before, prune)
    except BaseException:
        _scratch.drop()
        raise
    _scratch.clean()
    return out


def _alive_in(snap: Snapshot, ps: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The postings (pids ``ps``, tfs ``ts``) of passages alive in ``snap`` (none past its end)."""
    inside = ps < len(snap.alive)
    if not inside.all():
        ps, ts = ps[inside], ts[inside]
    live = snap.alive[ps]
    if not live.all():
        ps, ts = ps[live], ts[live]
    return ps, ts


def _without(ps: np.ndarray, ts: np.ndarray, dead: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The postings (pids ``ps`` ascending, tfs ``ts``) but those of ``dead`` (ascending):
    the dead looked up in the list, so the cost is theirs, not the list's."""
    at = _found_at(ps, dead)
    if not len(at):
        return ps, ts
    return np.delete(ps, at), np.delete(ts, at)


def _found_at(ps: np.ndarray, dead: np.ndarray) -> np.ndarray:
    """Where those of ``dead`` (ascending) that ``ps`` (ascending) holds are in ``ps``."""
    if not len(ps) or not len(dead):
        return np.zeros(0, np.intp)
    at = np.searchsorted(ps, dead)
    inside = at < len(ps)
    at = at[inside]
    return at[ps[at] == dead[inside]]


def _live_postings(store: Store, txn, snap: Snapshot, segs: list[bytes], term: str) -> tuple[np.ndarray, np.ndarray]:
    """(pids as intp, tfs) of ``term``'s live postings in ``snap``: a segment's list is only
    checked against the live passages where the segment holds a dead one (a merged or
    fresh index has none: its lists as decoded) or that is not known yet (:func:`_facts`),
    and against the snapshot's end where the segment is newer than the snapshot."""
    t = term.encode()
    # the dead passages' segments only where a search has found them for this snapshot
    # already: a one-word search right after a commit (a change made searchable) does
    # not wait for them (2-10 ms at 1.27M passages), it checks its lists instead
    facts = _facts_known(snap) if snap.segs is not None else None
    pids, tfs = [], []
    for sk in store.holding(txn, segs, t):
        got = store.decoded_list(txn, sk + t)
        if got is None:
            continue
        ps, ts = got
        if not len(ps):
            continue
        ps = ps.astype(np.intp)  # (once: every gather by them would convert them again)
        seg = int.from_bytes(sk, "big")
        if facts is None or seg not in snap.segs:
            ps, ts = _alive_in(snap, ps, ts)
        elif seg in facts[1]:  # its dead passages (few, beside a long list) looked up, not every posting
            ps, ts = _without(ps, ts, facts[1][seg])
        pids.append(ps)
        tfs.append(ts)
    return plists.joined(pids, tfs, np.intp)


def _words(store: Store, q: qlang.Query, limit: int, sources, under, k1: float, b: float, candidates, after,
           before, prune: bool):
    checks = Checks(q, after, before)
    snap = store.refresh()
    want = candidates or limit
    if snap.live == 0:
        return [], checks
    cap = len(snap.alive)
    _scratch.take(cap)
    scores = _scratch.scores
    avgdl = snap.avgdl
    touched = _scratch.touched

    def postings(txn, segs, term):
        return _live_postings(store, txn, snap, segs, term)

    with store.env.begin() as txn:
        segs = store.segment_keys(txn)
        weights = _weights(store, txn, segs, q)
        if q.excluded:
            banned = np.zeros(cap, bool)
            for term in q.excluded:
                banned[postings(txn, segs, term)[0]] = True
            checks.banned = banned
        checks.snap = snap
        held: dict[str, np.ndarray] = {}  # term -> bool by pid: the passages holding it

        def holding(term: str) -> np.ndarray:
            if term not in held:
                m = held[term] = np.zeros(cap, bool)
                m[postings(txn, segs, term)[0]] = True
            return held[term]

        def require(has: np.ndarray) -> None:
            checks.required = has if checks.required is None else checks.required & has

        for terms in q.phrase_terms:  # a required phrase: in a passage, or across a boundary of its file
            if terms:  # (its first 8 distinct words: enough to narrow; the text check decides)
                require(_holders(cap, snap.refid, [holding(t) for t in list(dict.fromkeys(terms))[:8]]))
        for terms in q.required:  # +word: in the passage
            for t in terms:
                require(holding(t).copy())
        for i, terms in enumerate(q.scored_terms):
            terms = list(dict.fromkeys(terms))[:8]
            if terms:
                masks = [holding(t) for t in terms]
                checks.holders[i] = _holders(cap, snap.refid, masks)
                checks.lifts[i] = PHRASE_WEIGHT * sum(_idf(snap, int(np.count_nonzero(m))) for m in masks)
        pruned = None
        if prune and len(weights) > 1 and not checks.on_text and not checks.dated and not q.scored \
                and snap.segs is not None and snap.seg_of is not None:
            pruned = _maxscore(store, txn, snap, segs, weights, checks, scores, touched, want, sources, under, k1, b,
                               q.flat)
        else:
            # one ranked word and nothing to filter by: its postings' scores are the
            # candidates' own (no scatter into the score array, nothing to zero after)
            alone = len(weights) == 1 and not checks.any and not checks.dated and not under and not q.scored \
                and (sources is None or set(sources) >= set(SOURCE_CODE))
            if alone and prune and snap.segs is not None and snap.seg_of is not None:
                (term, w), = weights.items()
                got = _one_word(store, txn, snap, segs, term, w, want, k1, b)
                if got is not None:
                    return list(zip(got[0].tolist(), got[1].tolist())), checks
            listed = []
            for term, w in weights.items():
                pids, tfs = postings(txn, segs, term)
                if len(pids):
                    listed.append((term, pids, tfs, _idf(snap, len(pids)) * w))
            flat = flat_idfs({t: idf for t, _, _, idf in listed}, k1, q.flat)
            for term, pids, tfs, idf in listed:
                kt = k1
                if term in flat:
                    idf, kt = flat[term], FLAT_K1
                sc = _tf_score(idf, tfs.astype(np.float32), snap.doclen[pids], avgdl, kt, b)
                if alone:
                    cand, sc = top(snap, pids, sc, want)
                    return list(zip(cand.tolist(), sc.tolist())), checks
                scores[pids] += sc
                touched.append(pids)
    if pruned is not None:  # the candidates are those the pruning kept (filtered already)
        if not len(pruned):
            return [], checks
        cand, sc = top(snap, pruned, scores[pruned], want)
        return list(zip(cand.tolist(), sc.tolist())), checks
    if not touched:
        if q.phrases and not any(q.phrase_terms):  # phrases of stop words only ("to be or not to be"):
            return _newest(store, snap, checks, want, sources, under), checks  # no postings to go by
        return [], checks
    if len(touched) > 1:  # the union of the terms' passages, in pid order
        cand = _union(touched, cap)
    else:
        cand = touched[0].astype(np.int64)
    cand = snap.keep(cand, sources, under)
    if checks.banned is not None or checks.required is not None:
        cand = cand[checks.mask_ok(cand)]
    if checks.dated and len(cand):  # every candidate, not only the best CHECK_CAP
        cand = checks.by_file_time(store, snap, cand)
    if not len(cand):
        return [], checks
    sc = scores[cand]
    if q.scored:
        sc = checks.lift(store, snap, cand, sc)
    if checks.on_text:
        cand, sc = top(snap, cand, sc, min(len(cand), CHECK_CAP))
        pairs = checks.filter(store, list(zip(cand.tolist(), sc.tolist())), want)
        return pairs, checks
    cand, sc = top(snap, cand, sc, want)
    return list(zip(cand.tolist(), sc.tolist())), checks


def _terms(store: Store, txn, snap: Snapshot, segs: list[bytes], weights: dict, k1: float, b: float,
           flat: Sequence[str] = ()) -> list:
    """The ranked terms that have a live posting: each one's lists (a segment's still
    packed when every posting in it is live: its header gives the count and the
    largest tf; or when its segment's dead passages are few beside it: counted off by
    looking them up, left in for :func:`_maxscore` to drop from its candidates; else
    decoded, its live postings), live df, idf (times its weight) and score bound (the
    largest tf in the shortest live passage)."""
    avgdl = snap.avgdl
    mindl, dirty, held = _facts(snap)
    terms = []
    for term, w in weights.items():
        tm = _Term(term, w, k1)
        t = term.encode()
        for sk in store.holding(txn, segs, t):
            key = sk + t
            got = store.decoded.get(key)
            v = None
            if got is None:
                v = txn.get(key, db=store.postings)
                if v is None:
                    continue
            seg = int.from_bytes(sk, "big")
            if seg in snap.segs:  # (a segment newer than snap: checked below)
                dp = dirty.get(seg)
                if got is None:
                    n, mt = plists.head(v)
                    if n < 0:
                        raise ValueError("a posting list has a broken length")
                else:
                    n = len(got[0])
                if dp is None or len(dp) * FEW_DEAD <= n:
                    # every posting live (the header's count), or so few dead that they are
                    # counted by looking them up, left in, and dropped from the candidates
                    if got is not None:
                        mt = store.decoded.max_tf(key, got) if n else 0
                    if dp is not None:
                        gone = held.get(key)
                        if gone is None:
                            gone = _holding(got[0] if got is not None else plists.lookup(v, dp)[0], dp)
                            if len(held) >= HELD_KEPT:
                                held.clear()
                            held[key] = gone
                        n -= gone
                        tm.dead = tm.dead or gone > 0
                    if n > 0:
                        tm.df += n
                        tm.maxtf = max(tm.maxtf, mt)
                        tm.lists.append((key, v, got))
                    continue
            if got is None:
                got = store.decoded.put(key, plists.unpack(v))
            ps, ts = _alive_in(snap, *got)
            if len(ps):
                tm.df += len(ps)
                tm.maxtf = max(tm.maxtf, int(ts.max()))
                tm.lists.append((None, None, (ps, ts)))  # (no key: its postings are no longer the list's whole)
        if tm.df:
            tm.idf = _idf(snap, tm.df) * w
            terms.append(tm)
    flat = flat_idfs({tm.term: tm.idf for tm in terms}, k1, flat)
    for tm in terms:
        if tm.term in flat:
            tm.idf, tm.k1 = flat[tm.term], FLAT_K1
        tm.ub = _tf_score(tm.idf, tm.maxtf, mindl, avgdl, tm.k1, b)
    return terms


def _idf(snap: Snapshot, df: int) -> float:
    return float(np.log1p((snap.live - df + 0.5) / (df + 0.5)))


FLAT = True  # a whole identifier scores flat, at least what its parts can (the identifier rule, §4.1 rev. 3)
FLAT_K1 = 1e-6  # the k1 a flat term is scored with: its score is its idf whatever its count and passage length


def flat_idfs(idfs: dict, k1: float, flat: Sequence[str]) -> dict:
    """The whole identifiers among a query's terms (``idfs``: term -> idf times its
    weight), each with the idf it scores flat with: its own plus the most each of its
    parts can score in any passage (BM25's bound as tf grows: idf (k1 + 1)). The passage
    holding ``PIO-1384`` exactly then ranks above any holding only ``PIO`` and ``1384``,
    however often; a plain word's score is unchanged. ``flat``: the identifiers to score
    so (``Query.flat``: every one in a query read as syntax, those naming one thing,
    ``PIO-1384``, in prose)."""
    if not FLAT or not flat:
        return {}
    out = {}
    for term, idf in idfs.items():
        if term in flat and analyze.joined(term):
            parts = {analyze.term_of(w) for w in analyze.words(term)}
            parts.discard("")
            parts.discard(term)
            out[term] = idf + sum(idfs.get(t, 0.0) for t in parts) * (k1 + 1)
    return out


# a one-word search takes a word whose lists hold this many postings block by block
LONG_LIST = 4096
BLOCK_MAX_KEPT = 1 << 14  # lists whose block maxima are kept (16 bytes a block of 128 postings: a byte for 8 postings at most); emptied when full
AVGDL_ROOM = 1.05  # block maxima are computed at this much more than the mean length, so they
# stay bounds while the mean grows that much (a BM25 term's score rises with the mean length)


def _one_word(store: Store, txn, snap: Snapshot, segs: list[bytes], term: str, w: float, want: int,
              k1: float, b: float) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """The ``want`` best passages of one ranked word and their scores, taking its long lists
    block by block (block-max): each block's largest score, kept per list, bounds every
    passage in it; the blocks of the highest bounds are scored first, the ``want``-th best
    of those is theta, and then only the blocks whose bound reaches theta. A passage that
    could place is never in a block left out, so the answer is scoring every posting's.
    None when its lists are short (scoring them whole costs less)."""
    if analyze.joined(term):  # (scored flat: _terms)
        return None
    t = term.encode()
    total = 0
    for sk in store.holding(txn, segs, t):  # from the headers: a rare word costs nothing more
        v = txn.get(sk + t, db=store.postings)
        if v is not None:
            total += max(plists.stated_count(v), 0)
    if total < LONG_LIST:
        return None
    terms = _terms(store, txn, snap, segs, {term: w}, k1, b)
    if not terms:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    tm = terms[0]
    avgdl = snap.avgdl
    scale = tm.idf * (k1 + 1)
    pool_p, pool_s = [], []
    lists, bounds = [], []

    def score(ps, ts):
        if tm.dead or (len(ps) and int(ps[-1]) >= len(snap.alive)):
            ps, ts = _alive_in(snap, ps, ts)
        pool_p.append(ps)
        pool_s.append(_tf_score(tm.idf, ts.astype(np.float32), snap.doclen[ps], avgdl, k1, b))

    for key, v, dec in tm.lists:
        if key is None or (len(dec[0]) if dec is not None else plists.stated_count(v)) < LONG_LIST // 4:
            # a list decoded and checked (its blocks no longer whole), or a short one: scored whole
            ps, ts = dec if dec is not None else store.decoded.of(key, v)
            score(ps.astype(np.intp), ts)
            continue
        lists.append((key, v, dec))
        bounds.append(_block_max(store, key, v, dec, snap, k1, b))
    theta = -np.inf
    if lists:
        # each list's blocks by bound, highest first: the ``first`` best of all lists are a
        # prefix of each list's order (``took``); scored, their ``want``-th best is theta
        first = max(8, 2 * (-(-want // plists.BLOCK)))
        if len(lists) == 1:
            took = [min(first, len(bounds[0][1]))]
        else:
            heads = np.concatenate([gs[:first] for _, gs in bounds])
            of = np.concatenate([np.full(min(first, len(gs)), i, np.int64) for i, (_, gs) in enumerate(bounds)])
            took = np.bincount(of[np.argsort(-heads, kind="stable")[:first]], minlength=len(lists)).tolist()
        _score_blocks(store, lists, [order[:n] for (order, _), n in zip(bounds, took)], score)
        got = sum(len(x) for x in pool_s)
        if got >= want:
            alls = np.concatenate(pool_s) if len(pool_s) > 1 else pool_s[0]
            theta = float(np.partition(alls, got - want)[got - want])
        # then every block whose bound reaches theta (a bound under a little less than theta
        # in the tf part's terms: float rounding, if anything, scores a block more, never less)
        least = (theta - 1e-6) / (scale * (1 + 1e-5)) * (1 - 1e-9) if theta > -np.inf and scale > 0 else -np.inf
        reach = [len(gs) - int(np.searchsorted(gs[::-1], least)) for _, gs in bounds]
        _score_blocks(store, lists, [order[n:m] for (order, _), n, m in zip(bounds, took, reach)], score)
    if not pool_p:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    cand = np.concatenate(pool_p) if len(pool_p) > 1 else pool_p[0]
    sc = np.concatenate(pool_s) if len(pool_s) > 1 else pool_s[0]
    if lists and theta > -np.inf:  # (theta is at most the last place's score: none that may place dropped)
        keep = np.flatnonzero(sc >= theta)
        cand, sc = cand[keep], sc[keep]
    if not len(cand):
        return cand.astype(np.int64), sc
    return top(snap, cand.astype(np.int64), sc, want)


def _score_blocks(store: Store, lists: list, blks: list, score) -> None:
    """Score the blocks ``blks[i]`` (in any order) of each of ``lists`` (key, bytes or None,
    decoded or None): from the list decoded when it is, else only those blocks decoded."""
    for (key, v, dec), bs in zip(lists, blks):
        if not len(bs):
            continue
        bs = np.sort(bs)  # (pids ascending within a list: its last is its largest)
        if dec is None:
            dec = store.decoded.get(key)
        if dec is not None:
            ps, ts = dec
            at = (bs[:, None] * plists.BLOCK + np.arange(plists.BLOCK)).ravel()
            if at[-1] >= len(ps):
                at = at[at < len(ps)]
            score(ps[at].astype(np.intp), ts[at])
        else:
            ps, ts = plists.blocks(v, bs)
            score(ps.astype(np.intp), ts)


def _block_max(store: Store, key: bytes, v, dec, snap: Snapshot, k1: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """A list's blocks by their largest ``tf / (tf + k1 (1 - b) + k1 b dl / avgdl)`` (float64)
    at :data:`AVGDL_ROOM` times the mean length, highest first: the blocks (int64) and those
    maxima. Kept per list (its passages and their lengths never change) and computed again
    only when the mean has grown past it, or for other k1 and b. The list is decoded whole
    once for it."""
    kept = store.block_max.get(key)
    if kept is not None and kept[1] == k1 and kept[2] == b and snap.avgdl <= kept[0]:
        return kept[3]
    ps, ts = dec if dec is not None else store.decoded.of(key, v)
    at = snap.avgdl * AVGDL_ROOM
    tf = ts.astype(np.float64)
    g = tf / (tf + (k1 * (1 - b) + k1 * b / at * snap.doclen[ps.astype(np.intp)].astype(np.float64)))
    nb = -(-len(g) // plists.BLOCK)
    if len(g) < nb * plists.BLOCK:
        g = np.concatenate((g, np.zeros(nb * plists.BLOCK - len(g))))
    g = g.reshape(nb, plists.BLOCK).max(axis=1)
    order = np.argsort(-g, kind="stable")
    got = (order, g[order])
    if len(store.block_max) >= BLOCK_MAX_KEPT:
        store.block_max.clear()
    store.block_max[key] = (at, k1, b, got)
    return got


def _holding(ps: np.ndarray, dead: np.ndarray) -> int:
    """How many of ``dead`` (ascending) are among ``ps`` (ascending)."""
    return len(_found_at(ps, dead))


def _maxscore(store: Store, txn, snap: Snapshot, segs: list[bytes], weights: dict, checks: Checks,
              scores: np.ndarray, touched: list, want: int, sources, under, k1: float, b: float,
              flat: Sequence[str] = ()) -> Optional[np.ndarray]:
    """Score ``weights``' terms into ``scores`` with MaxScore (Turtle and Flood):
    terms by their score bound, highest first, each list scored whole until the
    bounds of the terms left sum below the ``want``-th best score so far (theta):
    no passage outside the lists scored can then reach the top, so the terms left
    are only looked up for the passages already there, decoding only the blocks
    that may hold them (:func:`postings.lookup`). Scores are those of scoring
    every posting (added in bound order). The candidates, filtered by sources,
    ``under`` and the query's exclusions; None when no list had a posting."""
    cap = len(snap.alive)
    avgdl = snap.avgdl
    terms = _terms(store, txn, snap, segs, weights, k1, b, flat)
    if not terms:
        return None
    terms.sort(key=lambda x: -x.ub)
    ubs = [x.ub for x in terms]
    rest = list(itertools.accumulate(ubs[::-1]))[::-1]  # bound of terms i.. together
    done = 0.0  # bound of the terms scored

    dead_in = any(tm.dead for tm in terms)  # lists left holding dead passages (FEW_DEAD)

    def kept(cand: np.ndarray) -> np.ndarray:
        if dead_in:
            cand = cand[snap.alive[cand]]
        cand = snap.keep(cand, sources, under)
        if checks.banned is not None or checks.required is not None:
            cand = cand[checks.mask_ok(cand)]
        return cand

    def contrib(tm: _Term, pids: np.ndarray, tfs: np.ndarray, first: bool = False) -> None:
        tfs = tfs.astype(np.float32)
        dl = snap.doclen[pids]
        if first:  # (no score yet: every one 0, and a term's lists hold a passage once)
            scores[pids] = _tf_score(tm.idf, tfs, dl, avgdl, tm.k1, b)
        else:
            scores[pids] += _tf_score(tm.idf, tfs, dl, avgdl, tm.k1, b)

    for i, tm in enumerate(terms):
        pids, tfs = [], []
        for key, v, dec in tm.lists:
            if dec is None:
                ps, ts = store.decoded.of(key, v)
            else:
                ps, ts = dec
            pids.append(ps)
            tfs.append(ts)
        p = np.concatenate(pids) if len(pids) > 1 else pids[0]
        p = p.astype(np.intp)  # once: the gather, the scatter and the marks below would each convert it
        t = np.concatenate(tfs) if len(tfs) > 1 else tfs[0]
        contrib(tm, p, t, i == 0)
        touched.append(p)
        done += tm.ub
        if i + 1 == len(terms):
            break
        if done <= rest[i + 1]:  # theta <= the bound of the terms scored: nothing can be pruned yet
            continue
        cand = kept(_union(touched, cap))
        if len(cand) < want:
            continue
        sc = scores[cand]
        theta = float(np.partition(sc, len(sc) - want)[len(sc) - want])
        if rest[i + 1] * (1 + 1e-5) >= theta:
            continue
        # the terms left cannot lift a passage outside ``cand`` into the top ``want``, nor one
        # of ``cand`` whose score with their bounds stays below theta: first their bounds as
        # a whole, then each passage's own (block-max: the largest tf of the block that may
        # hold it, its own length), from the lists' headers without decoding them
        left = terms[i + 1:]
        cand = cand[sc + rest[i + 1] * (1 + 1e-5) >= theta]
        bounds = [_bound(store, tm, cand, snap, k1, b) for tm in left]
        cand, bounds = _reaching(cand, bounds, scores, theta)
        best = np.zeros(0, np.int64)
        if len(cand) > FIRST_LOOK * want:
            # the best so far looked up first: their whole scores raise theta, so far fewer
            # of the others are looked up
            sc = scores[cand]
            k = 2 * want
            pick = np.zeros(len(cand), bool)
            pick[np.argpartition(sc, len(sc) - k)[len(sc) - k:]] = True
            best, cand, bounds = cand[pick], cand[~pick], [x[~pick] for x in bounds]
            _add(store, left, best, contrib)
            full = scores[best]
            theta = max(theta, float(np.partition(full, len(full) - want)[len(full) - want]))
        inc = _scratch.inc
        for r, tm2 in enumerate(left):
            # before each term left, only those that still may reach theta are looked up in it
            cand, bounds = _reaching(cand, bounds, scores, theta, r)
            if r == 0:
                inc[cand] = True  # (those dropped later stay marked: their scores are never read)
                _scratch.marked.append(cand)
            _add_marked(store, tm2, cand, contrib)
        return np.concatenate((best, cand)) if len(best) else cand
    return kept(_union(touched, cap))


def _bound(store: Store, tm: "_Term", pids: np.ndarray, snap: Snapshot, k1: float, b: float) -> np.ndarray:
    """Each of ``pids``' (ascending) largest possible score from ``tm``: its tf bounded by
    its block's largest (a decoded list: its tf), with its own length (float32)."""
    mt = np.zeros(len(pids), np.int64)
    for key, v, dec in tm.lists:
        if dec is None:
            # held, or short and decoded whole now: exact tfs (by its header alone, a recent
            # segment's one block reaches back to pid 0 and bounds every older passage by its tf)
            dec = _held_or_short(store, key, v)
        if dec is None:
            np.maximum(mt, plists.block_tf(v, pids), out=mt)
        elif len(dec[0]):
            ps, ts = dec
            lo, hi = np.searchsorted(pids, (ps[0], ps[-1] + 1)).tolist()  # only the pids its range spans
            if hi > lo:
                sub = pids[lo:hi]
                at = np.minimum(np.searchsorted(ps, sub), len(ps) - 1)
                np.maximum(mt[lo:hi], np.where(ps[at] == sub, ts[at], 0), out=mt[lo:hi])
    tf = mt.astype(np.float32)
    dl = snap.doclen[pids]
    return np.where(mt > 0, _tf_score(tm.idf, tf, dl, snap.avgdl, tm.k1, b), 0).astype(np.float32)


def _reaching(cand: np.ndarray, bounds: list, scores: np.ndarray, theta: float, r: int = 0):
    """Those of ``cand`` whose score with the bounds of the terms ``bounds[r:]`` may reach
    theta (with room for float32's rounding), and their bounds."""
    if not len(cand) or r >= len(bounds):
        return cand, bounds
    total = scores[cand] + np.sum(bounds[r:], axis=0, dtype=np.float32)
    keep = total * (1 + 1e-5) + 1e-6 >= theta
    if keep.all():
        return cand, bounds
    return cand[keep], [x[keep] for x in bounds]


def _add(store: Store, terms: list, pids: np.ndarray, contrib) -> None:
    """Add ``terms``' scores of ``pids`` (ascending, none marked in ``_scratch.inc``)."""
    inc = _scratch.inc
    inc[pids] = True
    try:
        for tm in terms:
            _add_marked(store, tm, pids, contrib)
    finally:
        inc[pids] = False


def _add_marked(store: Store, tm: "_Term", pids: np.ndarray, contrib) -> None:
    """Add ``tm``'s scores of the passages marked in ``_scratch.inc``, its lists looked up for
    ``pids`` (ascending, those marked among them)."""
    inc = _scratch.inc
    for ps, ts in _lists_for(store, tm, pids):
        hit = inc[ps]
        if hit.any():
            contrib(tm, ps[hit], ts[hit])


def _lists_for(store: Store, tm: "_Term", want: np.ndarray):
    """Each of a term's lists as (pids, tfs), for the passages ``want`` (ascending): a
    list decoded already (cached, or masked for its dead passages) whole; a short one
    (:data:`LOOKUP_WHOLE` bytes packed) decoded whole once and kept in
    ``store.looked_up``; else only the blocks that may hold them (:func:`postings.lookup`)."""
    for key, v, dec in tm.lists:
        if dec is not None:
            yield dec
            continue
        got = _held_or_short(store, key, v)
        yield got if got is not None else plists.lookup(v, want)


def _held_or_short(store: Store, key: bytes, v) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """A list (stored value ``v``) as decoded and kept in ``store.decoded``; else, when it is
    short (:data:`LOOKUP_WHOLE` bytes packed), decoded whole once and kept in
    ``store.looked_up``; else None (a long list not held: looked up block by block)."""
    got = store.decoded.get(key)
    if got is None and len(v) <= LOOKUP_WHOLE and store.looked_up.CACHE_BYTES:
        got = store.looked_up.of(key, v)
    return got


def scores_of(store: Store, query: Union[str, qlang.Query], pids, k1: float = K1, b: float = B) -> np.ndarray:
    """BM25 of each of ``pids`` for ``query`` (float32, in their order), as :func:`words`
    scores a passage: the same terms (prefixes expanded, exclusions never ranked),
    idf, lengths and order of adding; 0 for a passage holding none of them or no
    longer alive. For passages another ranking found (the fused ranking scores
    every candidate by both): each term's lists are only looked up for them,
    decoding only the blocks that may hold them (:func:`postings.lookup`, as
    MaxScore does). It scores, it does not filter: the caller's passages passed
    the query's checks (:meth:`Checks.filter`) already."""
    q = qlang.parse(query) if isinstance(query, str) else query
    pids = np.asarray(pids, np.int64).reshape(-1)
    out = np.zeros(len(pids), np.float32)
    snap = store.refresh()
    cap = len(snap.alive)
    ok = (pids >= 0) & (pids < cap)
    ok[ok] = snap.alive[pids[ok]]
    want = np.sort(pids[ok])  # ascending, as lookup needs (not np.unique: it imports numpy.ma)
    if len(want):
        want = want[np.concatenate(([True], want[1:] != want[:-1]))]
    if not len(want) or snap.live == 0:
        return out
    acc = np.zeros(len(want), np.float32)
    avgdl = snap.avgdl
    with store.env.begin() as txn:
        segs = store.segment_keys(txn)
        terms = _terms(store, txn, snap, segs, _weights(store, txn, segs, q), k1, b, q.flat)
        terms.sort(key=lambda x: -x.ub)  # MaxScore's order of adding
        for tm in terms:
            for ps, ts in _lists_for(store, tm, want):
                if not len(ps):
                    continue
                at = np.minimum(np.searchsorted(want, ps), len(want) - 1)
                hit = want[at] == ps
                if not hit.any():
                    continue
                ps, ts, at = ps[hit], ts[hit].astype(np.float32), at[hit]
                dl = snap.doclen[ps]
                acc[at] += _tf_score(tm.idf, ts, dl, avgdl, tm.k1, b)
    if q.scored:  # each scored phrase's lift where a passage holds it (as words() lifts it)
        dfs = {tm.term: tm.df for tm in terms}
        patterns = [(qlang.phrase_pattern(w), len(w)) for w in q.scored]
        lifts = [PHRASE_WEIGHT * sum(_idf(snap, dfs[t]) for t in dict.fromkeys(ts[:8]) if t in dfs)
                 if ts and all(t in dfs for t in ts) else 0.0 for ts in q.scored_terms]
        texts = Texts(store, snap)
        wl = want.tolist()
        for i, pid, p in zip(range(len(wl)), wl, texts.read(wl)):
            if p is not None:
                low = p.text.casefold()
                acc[i] += sum(lift for (r, n), lift in zip(patterns, lifts) if lift and texts.holds(r, n, pid, p, low))
    out[ok] = acc[np.searchsorted(want, pids[ok])]
    return out


def bm25(store: Store, query: Union[str, qlang.Query], limit: int, sources: Optional[Sequence[str]] = None,
         under: Optional[str] = None, k1: float = K1, b: float = B,
         candidates: Optional[int] = None, prune: bool = True) -> Pairs:
    """Best (pid, score) pairs for ``query``, best first.

    ``candidates``: how many to return before the limit is applied (the hybrid
    ranker asks for more than it shows); ``prune``: as :func:`words`'.
    """
    return words(store, query, limit, sources, under, k1, b, candidates, prune=prune)[0]
