"""A query's ranked terms in a snapshot, for BM25 (Robertson/Sparck Jones idf, Lucene's
form): its parameters and its score of a term (:func:`tf_score`: one expression for
scoring and bounding), idf, whole identifiers scored flat (:func:`flat_idfs`), the
terms' weights with prefixes expanded (:func:`query_weights`), each term's live
postings (:func:`live_postings`), and its lists with their live df and score bound
(:func:`ranked_terms`: what MaxScore and :func:`scores_of` start from). What a search
works out once for a snapshot (:func:`snapshot_facts`) is kept on it."""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from lnkmem.index.text import analyze
from lnkmem.index.codec import postings as plists
from lnkmem.index.text import query as qlang
from lnkmem.index.snapshot import Snapshot
from lnkmem.index.store import Store
from lnkmem.index.tables import Reading


K1 = 1.2  # tuned on BEIR SciFact train (docs/BENCHMARKS.md)
B = 0.75


# What a search works out once for a snapshot is kept with it (Snapshot.worked_out), under
# a name (this one, and checks.FILE_TIMES): it lives as long as the snapshot (a change's new
# snapshot starts with none), and memories searched in turn in one process (serve-many)
# each keep their own.
FACTS = "facts"  # (shortest live length, segments holding dead, dead held by list): snapshot_facts


def facts_known(snap: Snapshot) -> Optional[tuple[float, dict, dict]]:
    """:func:`snapshot_facts` of ``snap`` when a search has computed them already, else None."""
    return snap.worked_out.get(FACTS)


def snapshot_facts(snap: Snapshot) -> tuple[float, dict, dict]:
    """The shortest live passage's length (the bound of every BM25 score), the
    segments that hold dead passages, each with their ids (ascending): a list there
    is checked for its live count; elsewhere its header's count is the live count;
    and, by list (segment and term), how many of those dead it holds, as counted
    (a segment's list never changes, and the dead are the snapshot's: a search
    after a change counts a list's dead once, not at every search). Computed once
    a snapshot."""
    known = facts_known(snap)
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


class Term:
    """One ranked term: its lists (a segment's decoded and live; or as stored or as
    cached, when every posting in it is live or its segment's dead are few: see
    :func:`ranked_terms`), its live df, weight, idf and score bound."""

    __slots__ = ("term", "w", "lists", "df", "maxtf", "idf", "ub", "dead", "k1")

    def __init__(self, term: str, w: float, k1: float = 0.0):
        self.term, self.w, self.k1 = term, w, k1
        # (key, packed bytes or None, (pids, tfs) decoded or None); a list decoded and checked
        # against the live passages: (None, None, its live (pids, tfs))
        self.lists: list = []
        self.df = self.maxtf = 0
        self.idf = self.ub = 0.0
        self.dead = False  # a list of it was left holding postings of dead passages (FEW_DEAD)


def _expand(r: Reading, segs: list[bytes], prefix: str, room: int) -> list[str]:
    """Terms of the dictionary starting with ``prefix``, the first ``room`` in order."""
    p = prefix.encode()
    found: set[bytes] = set()
    for sk in segs:
        found.update(r.segment_terms(sk, p, room))
    return [t.decode() for t in sorted(found)[:room]]


def query_weights(r: Reading, segs: list[bytes], q: qlang.Query) -> dict:
    """The query's ranked terms and their weights, its prefixes expanded from the
    dictionary (an excluded term never ranked)."""
    weights = dict(q.weights)
    room = qlang.MAX_TERMS
    for prefix in q.prefixes:
        if room <= 0:
            break
        for t in _expand(r, segs, prefix, min(qlang.MAX_EXPANSIONS, room)):
            if t not in q.excluded:
                weights.setdefault(t, 1.0)
            room -= 1
    return weights


def tf_score(idf, tf, dl, avgdl: float, k1: float, b: float):
    """BM25's score of a term (its ``idf``) in passages with ``tf`` and length ``dl``: one
    expression for scoring, bounding and the bounds per passage, so a bound is never below
    the score it bounds by a rounding."""
    # (folded so that an array goes through five operations, not eight)
    return idf * (k1 + 1) * tf / (tf + (k1 * (1 - b) + k1 * b / avgdl * dl))


def alive_in(snap: Snapshot, ps: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def live_postings(store: Store, r: Reading, snap: Snapshot, segs: list[bytes], term: str) -> tuple[np.ndarray, np.ndarray]:
    """(pids as intp, tfs) of ``term``'s live postings in ``snap``: a segment's list is only
    checked against the live passages where the segment holds a dead one (a merged or
    fresh index has none: its lists as decoded) or that is not known yet (:func:`snapshot_facts`),
    and against the snapshot's end where the segment is newer than the snapshot."""
    t = term.encode()
    # the dead passages' segments only where a search has found them for this snapshot
    # already: a one-word search right after a commit (a change made searchable) does
    # not wait for them (milliseconds at 1.27M passages), it checks its lists instead
    facts = facts_known(snap) if snap.segs is not None else None
    pids, tfs = [], []
    for sk in store.holding(r, segs, t):
        got = store.decoded_list(r, sk + t)
        if got is None:
            continue
        ps, ts = got
        if not len(ps):
            continue
        ps = ps.astype(np.intp)  # (once: every gather by them would convert them again)
        seg = int.from_bytes(sk, "big")
        if facts is None or seg not in snap.segs:
            ps, ts = alive_in(snap, ps, ts)
        elif seg in facts[1]:  # its dead passages (few, beside a long list) looked up, not every posting
            ps, ts = _without(ps, ts, facts[1][seg])
        pids.append(ps)
        tfs.append(ts)
    return plists.joined(pids, tfs, np.intp)


def ranked_terms(store: Store, r: Reading, snap: Snapshot, segs: list[bytes], weights: dict, k1: float, b: float,
           flat: Sequence[str] = ()) -> list:
    """The ranked terms that have a live posting: each one's lists (a segment's still
    packed when every posting in it is live: its header gives the count and the
    largest tf; or when its segment's dead passages are few beside it: counted off by
    looking them up, left in for :func:`maxscore` to drop from its candidates; else
    decoded, its live postings), live df, idf (times its weight) and score bound (the
    largest tf in the shortest live passage)."""
    avgdl = snap.avgdl
    mindl, dirty, held = snapshot_facts(snap)
    terms = []
    for term, w in weights.items():
        tm = Term(term, w, k1)
        t = term.encode()
        for sk in store.holding(r, segs, t):
            key = sk + t
            got = store.caches.decoded.get(key)
            v = None
            if got is None:
                v = r.posting_list(key)
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
                        mt = store.caches.decoded.max_tf(key, got) if n else 0
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
                got = store.caches.decoded.put(key, plists.unpack(v))
            ps, ts = alive_in(snap, *got)
            if len(ps):
                tm.df += len(ps)
                tm.maxtf = max(tm.maxtf, int(ts.max()))
                tm.lists.append((None, None, (ps, ts)))  # (no key: its postings are no longer the list's whole)
        if tm.df:
            tm.idf = idf_of(snap, tm.df) * w
            terms.append(tm)
    flat = flat_idfs({tm.term: tm.idf for tm in terms}, k1, flat)
    for tm in terms:
        if tm.term in flat:
            tm.idf, tm.k1 = flat[tm.term], FLAT_K1
        tm.ub = tf_score(tm.idf, tm.maxtf, mindl, avgdl, tm.k1, b)
    return terms


def idf_of(snap: Snapshot, df: int) -> float:
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


def _holding(ps: np.ndarray, dead: np.ndarray) -> int:
    """How many of ``dead`` (ascending) are among ``ps`` (ascending)."""
    return len(_found_at(ps, dead))
