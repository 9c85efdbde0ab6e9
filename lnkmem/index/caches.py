"""What searches keep of an index between them: the posting lists decoded, the terms of small
segments, one word's block-max bounds (:class:`SearchCaches`, one per :class:`~lnkmem.index.store.Store`).

A segment's lists never change (a merge writes a new segment under a new key, and a key is never
reused), so what was decoded from one stays true for as long as the store is open; nothing here
is written to the index.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from lnkmem.index.codec import postings
from lnkmem.index.tables import Reading

LOOKED_UP_BYTES = 4 << 20  # SearchCaches.looked_up's budget
SMALL_SEGMENT_TERMS = 4096  # a segment of at most this many terms has them held as a set (SearchCaches.holding)


class SearchCaches:
    """The decoded lists' caches of one store, and the questions answered from them."""

    def __init__(self) -> None:
        self.decoded = postings.Decoded()  # long lists decoded, by segment and term (immutable)
        # short lists search only looks up, decoded whole and kept apart, so that many
        # of them never evict the long ones above (rank.prune.LOOKUP_WHOLE)
        self.looked_up = postings.Decoded(LOOKED_UP_BYTES)
        self.block_max: dict = {}  # by list key: its blocks' largest scores' part (one word's block-max: rank.prune)
        self.seg_terms: dict[bytes, Optional[frozenset]] = {}  # by segment key: its terms when few (holding)

    def postings_of(self, r: Reading, term: str, segs: Optional[list[bytes]] = None) -> tuple[np.ndarray, np.ndarray]:
        """(pids, tfs) of a term across all segments (``segs``, else every listed one) as
        ``r`` reads them, dead ones included."""
        t = term.encode()
        pids, tfs = [], []
        for sk in segs if segs is not None else r.segment_keys():
            got = self.decoded_list(r, sk + t)
            if got is None:
                continue
            ps, ts = got
            pids.append(ps)
            tfs.append(ts)
        return postings.joined(pids, tfs, np.uint32)

    def holding(self, r: Reading, segs: list[bytes], term: bytes) -> list[bytes]:
        """Those of ``segs`` that may hold a list of ``term``: a small segment (a changed
        file's, a few commits') only where its terms, read once and held as a set, have
        it, so a search does not look every term up in each of them (a segment's terms
        never change; its key is never reused)."""
        known = self.seg_terms
        if len(known) > 2 * len(segs) + 64:  # segments merged away: forget them
            keep = set(segs)
            self.seg_terms = known = {k: v for k, v in known.items() if k in keep}
        out = []
        for sk in segs:
            try:
                terms = known[sk]
            except KeyError:
                terms = known[sk] = terms_if_few(r, sk)
            if terms is None or term in terms:
                out.append(sk)
        return out

    def decoded_list(self, r: Reading, key: bytes) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(pids, tfs) of one segment's list of a term (segment key + term), decoded once and
        kept in :attr:`decoded`; None when the segment has no such list."""
        got = self.decoded.get(key)
        if got is None:
            v = r.posting_list(key)
            if v is None:
                return None
            got = self.decoded.put(key, postings.unpack(v))
        return got


def terms_if_few(r: Reading, sk: bytes) -> Optional[frozenset]:
    """The terms of segment ``sk`` (bytes), or None when it has more than
    :data:`SMALL_SEGMENT_TERMS`."""
    terms = r.segment_terms(sk, most=SMALL_SEGMENT_TERMS + 1)
    return frozenset(terms) if len(terms) <= SMALL_SEGMENT_TERMS else None
