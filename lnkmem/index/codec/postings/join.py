"""Posting lists of one term joined: :func:`join_many`, a merge's lists of several
segments into one stored list less the dead pids (every block of every list decoded at once,
the joined lists packed at once); :func:`joined`, a search's (pids, tfs) of one term's
segments as one pair of arrays.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from lnkmem.index.codec.postings import encode  # (its WINDOW read at each call, as pack_many reads it)
from lnkmem.index.codec.postings.layout import (BLOCK, HEADER, HEADER_BYTES, TF_WIDTH, VALID_WIDTH, read_varint,
                                                run_units)
from lnkmem.index.codec.postings.runs import block_values, words_at


def join_many(groups: list, dead: Optional[np.ndarray] = None) -> list:
    """For each group of stored lists (a merge's lists of one term in several segments,
    each list's pids apart from every other's of its group), the stored form of their
    postings together less the pids the mask ``dead`` (by pid; None: none) marks, or
    None when none is left. ValueError when a list's lengths are broken. Every block of
    every list is decoded at once (:func:`_blocks`; a block stands alone) and the groups
    packed at once (:func:`.encode.pack_many`): a few dozen numpy calls whatever the number of
    groups and lists (a merge's are mostly of one or two postings)."""
    flat = []  # (count, count's bytes, value) of each list not empty, a group's by last pid
    counts = []  # postings a group, for the groups not empty
    some = []  # which groups those are
    for gi, parts in enumerate(groups):
        heads = []
        total = 0
        for v in parts:
            n = v[0] if len(v) else 0x80
            used = 1
            if n >= 0x80:
                n, used = read_varint(v)
            if n <= 0:
                if n == 0 and len(v) == used:
                    continue
                raise ValueError("a posting list has a broken length")
            at = used + (n - 1) // BLOCK * HEADER_BYTES  # the last block's header
            if len(v) < at + HEADER_BYTES:
                raise ValueError("a posting list has a broken length")
            heads.append((int.from_bytes(v[at:at + 4], "little"), n, used, v))
            total += n
        if heads:
            heads.sort()  # by last pid (no two alike): by first pid too, unless they interleave
            flat += [h[1:] for h in heads]
            counts.append(total)
            some.append(gi)
    out: list = [None] * len(groups)
    if not flat:
        return out
    ps, ts = [], []  # decoded a window of postings at a time (its work arrays a few int64 a posting)
    i = 0
    while i < len(flat):
        j, k = i, 0
        while j < len(flat) and (k + flat[j][0] <= encode.WINDOW or j == i):
            k += flat[j][0]
            j += 1
        a, b = _blocks(flat[i:j])
        ps.append(a)
        ts.append(b)
        i = j
    p, t = (ps[0], ts[0]) if len(ps) == 1 else (np.concatenate(ps), np.concatenate(ts))
    del ps, ts
    n = np.array(counts, np.int64)
    gs = np.cumsum(n) - n  # a group's first posting
    up = p[1:] > p[:-1]
    up[gs[1:] - 1] = True  # (from one group to the next)
    if not up.all():  # some group's ids interleave: each group sorted by pid
        order = np.lexsort((p, np.repeat(np.arange(len(n)), n)))
        p, t = p[order], t[order]
    if dead is not None:
        inside = p < len(dead)
        drop = np.zeros(len(p), bool)
        drop[inside] = dead[p[inside]]
        if drop.any():
            keep = ~drop
            n = np.add.reduceat(keep.astype(np.int64), gs)
            p, t = p[keep], t[keep]
            some = [g for g, k in zip(some, (n > 0).tolist()) if k]
            n = n[n > 0]
            if not len(n):
                return out
    gs = np.cumsum(n) - n
    for g, v in zip(some, encode.pack_many(p, t, gs, gs + n)):
        out[g] = v
    return out


def _blocks(parts: list) -> tuple[np.ndarray, np.ndarray]:
    """(pids u32, tfs u16) of stored values (each given as (count, count's bytes, value),
    none empty), one after another: every block of all of them decoded at once from their
    bodies joined (a block stands alone: its header's last pid, then its runs), so the
    numpy calls are a few dozen whatever the number of values. ValueError when one's
    lengths are broken."""
    hs, bodies, ns = [], [], []
    for n, used, v in parts:
        b = used + (n + BLOCK - 1) // BLOCK * HEADER_BYTES
        hs.append(v[used:b])
        bodies.append(v[b:])
        ns.append(n)
    hdr = np.frombuffer(b"".join(hs), HEADER)
    ns = np.array(ns, np.int64)
    nbs = (ns + BLOCK - 1) // BLOCK
    wp = hdr["w"].astype(np.int64)
    wt = TF_WIDTH[hdr["maxtf"]]  # -1 for a largest tf of 0
    if not VALID_WIDTH[wp].all() or wt.min() < 0:
        raise ValueError("a posting list has a broken length")
    m = np.full(len(hdr), BLOCK, np.int64)  # postings a block: the last of each value's short
    m[np.cumsum(nbs) - 1] = ns - BLOCK * (nbs - 1)
    gb, tb = np.multiply(*run_units(m, wp)), np.multiply(*run_units(m, wt))
    size = gb + tb
    ends = np.cumsum(size)
    lens = np.fromiter(map(len, bodies), np.int64, len(bodies))
    if not (ends[np.cumsum(nbs) - 1] == np.cumsum(lens)).all():
        raise ValueError("a posting list has a broken length")
    go = ends - size
    win = words_at(b"".join(bodies), 0)
    first = np.cumsum(m) - m  # a block's first posting
    d, f = block_values(win, m, first, go, gb, wp, wt)  # gaps, tfs less one
    d += 1  # (0 at a block's last)
    last = first + m - 1
    d[last] = 0  # a block's last pid is its header's
    # id j of a block: its last id less (gaps + 1) from j on, i.e. with c the running sum
    # of d, c[j] - d[j] - (c[its last] - its last id)
    c = np.cumsum(d)
    pids = c - d
    pids -= np.repeat(c[last] - hdr["last"].astype(np.int64), m)
    f += 1
    np.minimum(f, 65535, out=f)
    return pids.astype(np.uint32), f.astype(np.uint16)


def joined(pids: list, tfs: list, dtype) -> tuple[np.ndarray, np.ndarray]:
    """One term's (pids, tfs) from its segments' lists (pids of ``dtype`` when none)."""
    if not pids:
        return np.empty(0, dtype), np.empty(0, np.uint16)
    if len(pids) == 1:
        return pids[0], tfs[0]
    return np.concatenate(pids), np.concatenate(tfs)
