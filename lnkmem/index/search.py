"""BM25 over the words index (Robertson/Sparck Jones idf, Lucene's form),
with the query language (:mod:`lnkmem.index.query`) and the date filters.

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

import re
from datetime import date, datetime, timezone
from typing import Optional, Sequence, Union

import numpy as np

from lnkmem.index import query as qlang
from lnkmem.index.store import SOURCE_CODE, Passage, Snapshot, Store

_CHATS = SOURCE_CODE["chats"]

K1 = 1.2  # tuned on BEIR SciFact train (docs/BENCHMARKS.md)
B = 0.75
CHECK_CAP = 4000  # passages whose text is checked (phrases, dates) per search, at most

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


# --- ties ---------------------------------------------------------------------------

_ref_times: dict = {}  # file times by refid, for the last snapshot


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
    by place in the file (a file's pids ascend with its lines). O(n) whatever the ties."""
    if len(cand) > want:
        # the score of the last place: numpy's vectorised sort, since its partition
        # degrades on masses of equal values (0.4 s for 2M ties against 0.02 s)
        kth = np.sort(sc)[len(sc) - want]
        above = np.flatnonzero(sc > kth)
        tied = np.flatnonzero(sc == kth)
        need = want - len(above)
        if len(tied) > need:
            ct = cand[tied]
            key = (_tie_rank(snap, snap.refid[ct]) << 32) | ct.astype(np.int64)
            tied = tied[np.argpartition(key, need - 1)[:need]]
        keep = np.concatenate((above, tied))
        cand, sc = cand[keep], sc[keep]
    refs, refid = snap.refs, snap.refid
    c, s = cand.tolist(), sc.tolist()
    order = sorted(range(len(c)), key=lambda i: (-s[i], refs[refid[c[i]]], c[i]))
    return cand[order], sc[order]


# --- the words ranking --------------------------------------------------------------

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


class Checks:
    """What a hit must satisfy beyond its score: no excluded term, every phrase's
    terms and words in order, no excluded phrase, a time in [after, before)."""

    def __init__(self, q: qlang.Query, after: Optional[float], before: Optional[float]):
        self.q = q
        self.after, self.before = after, before
        self.phrases = [qlang.phrase_pattern(w) for w in q.phrases]
        self.not_phrases = [qlang.phrase_pattern(w) for w in q.excluded_phrases]
        self.banned: Optional[np.ndarray] = None  # pids holding an excluded term
        self.required: Optional[np.ndarray] = None  # pids holding every phrase's terms

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
        cache = _ref_times.get("v")
        if cache is None or cache[0] is not snap:
            cache = (snap, {})
            _ref_times["v"] = cache
        known = cache[1]
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

    def text_ok(self, p: Passage, t: Optional[float] = None) -> bool:
        if self.after is not None or self.before is not None:
            if t is None or (self.after is not None and t < self.after) or \
                    (self.before is not None and t >= self.before):
                return False
        if self.phrases or self.not_phrases:
            low = p.text.casefold()
            if any(not r.search(low) for r in self.phrases) or any(r.search(low) for r in self.not_phrases):
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
        for i in range(0, min(len(pairs), CHECK_CAP), 256):
            chunk = pairs[i:min(i + 256, CHECK_CAP)]
            for pair, p in zip(chunk, store.passages_of(pid for pid, _ in chunk)):
                if p is not None and self.text_ok(p, self.time_of(store, p, files) if dated else None):
                    out.append(pair)
                    if len(out) >= want:
                        return out
        return out


def _newest(store: Store, snap: Snapshot, checks: Checks, want: int, sources, under) -> Pairs:
    """Passages holding the query's phrases among the newest CHECK_CAP (none of
    their words is indexed, so nothing scores them: 0 for all)."""
    cand = snap.keep(np.flatnonzero(snap.alive)[::-1], sources, under)
    cand = cand[checks.mask_ok(cand)]
    if checks.dated and len(cand):
        cand = checks.by_file_time(store, snap, cand)
    cand = cand[:CHECK_CAP]
    return checks.filter(store, [(int(p), 0.0) for p in cand], want)


def words(store: Store, query: Union[str, qlang.Query], limit: int, sources: Optional[Sequence[str]] = None,
          under: Optional[str] = None, k1: float = K1, b: float = B, candidates: Optional[int] = None,
          after: Optional[float] = None, before: Optional[float] = None) -> tuple[Pairs, Checks]:
    """Best (pid, score) pairs for ``query``, best first, and the checks any
    other ranking's hits must pass too (exclusions, phrases, dates)."""
    q = qlang.parse(query) if isinstance(query, str) else query
    checks = Checks(q, after, before)
    snap = store.refresh()
    want = candidates or limit
    if snap.live == 0:
        return [], checks
    cap = len(snap.alive)
    scores = np.zeros(cap, np.float32)
    avgdl = snap.avgdl
    touched = []
    weights = dict(q.weights)

    def postings(txn, segs, term):
        pids, tfs = store.postings_of(txn, term, segs)
        if not len(pids):
            return pids, tfs
        inside = pids < cap
        if not inside.all():
            pids, tfs = pids[inside], tfs[inside]
        live = snap.alive[pids]
        return pids[live], tfs[live]

    with store.env.begin() as txn:
        segs = store.segment_keys(txn)
        room = qlang.MAX_TERMS
        for prefix in q.prefixes:
            if room <= 0:
                break
            for t in _expand(store, txn, segs, prefix, min(qlang.MAX_EXPANSIONS, room)):
                if t not in q.excluded:
                    weights.setdefault(t, 1.0)
                room -= 1
        if q.excluded:
            banned = np.zeros(cap, bool)
            for term in q.excluded:
                banned[postings(txn, segs, term)[0]] = True
            checks.banned = banned
        for terms in q.phrase_terms:
            if not terms:
                continue
            has = None
            for term in list(dict.fromkeys(terms))[:8]:  # enough to narrow; the text check decides
                m = np.zeros(cap, bool)
                m[postings(txn, segs, term)[0]] = True
                has = m if has is None else has & m
            checks.required = has if checks.required is None else checks.required & has
        for term, w in weights.items():
            pids, tfs = postings(txn, segs, term)
            tfs = tfs.astype(np.float32)
            df = len(pids)
            if df == 0:
                continue
            idf = np.log1p((snap.live - df + 0.5) / (df + 0.5))
            if w != 1.0:
                idf = idf * w
            dl = snap.doclen[pids]
            scores[pids] += idf * tfs * (k1 + 1) / (tfs + k1 * (1 - b + b * dl / avgdl))
            touched.append(pids)
    if not touched:
        if q.phrases and not any(q.phrase_terms):  # phrases of stop words only ("to be or not to be"):
            return _newest(store, snap, checks, want, sources, under), checks  # no postings to go by
        return [], checks
    if len(touched) > 1:  # the union of the terms' passages, in pid order
        seen = np.zeros(cap, bool)
        for t in touched:
            seen[t] = True
        cand = np.flatnonzero(seen)
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
    if checks.on_text:
        cand, sc = top(snap, cand, sc, min(len(cand), CHECK_CAP))
        pairs = checks.filter(store, [(int(p), float(s)) for p, s in zip(cand, sc)], want)
        return pairs, checks
    cand, sc = top(snap, cand, sc, want)
    return [(int(p), float(s)) for p, s in zip(cand, sc)], checks


def bm25(store: Store, query: Union[str, qlang.Query], limit: int, sources: Optional[Sequence[str]] = None,
         under: Optional[str] = None, k1: float = K1, b: float = B,
         candidates: Optional[int] = None) -> Pairs:
    """Best (pid, score) pairs for ``query``, best first.

    ``candidates``: how many to return before the limit is applied (the hybrid
    ranker asks for more than it shows).
    """
    return words(store, query, limit, sources, under, k1, b, candidates)[0]
