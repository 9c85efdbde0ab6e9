"""The posting-list codec's speed on a list set shaped like an index's: pack, pack_many, unpack,
lookup, check_many and join_many, each the best of several rounds (ms of this process's CPU:
on a shared machine less noisy than wall time; the codec runs on one thread).

``python bench/bench_postings.py [--root DIR] [--rounds N]``: ``--root`` measures the
``lnkmem`` below DIR (another commit's tree, as ``git archive <commit> | tar -x -C DIR`` makes
it), so that two trees are compared in one sitting. The lists: 40,000 terms over 200,000
passages, their lengths Zipf-like (most of one or two postings, the commonest word's ~1/8 of
the passages), tfs mostly 1 (seed 7: every run the same lists).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def lists(rng, terms=40_000, passages=200_000):
    import numpy as np

    lens = np.minimum((passages // 8) / np.arange(1, terms + 1) ** 1.1, passages // 8).astype(np.int64)
    lens = np.maximum(lens, 1)
    out = []
    for n in lens.tolist():
        p = np.sort(rng.choice(passages, n, replace=False)).astype(np.int64)
        t = np.minimum(rng.geometric(0.6, n), 300).astype(np.int64)
        out.append((p, t))
    return out


def best(fn, rounds):
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return min(times) * 1000


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(HERE))
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    sys.path.insert(0, a.root)
    import numpy as np

    from lnkmem.index.codec import postings

    rng = np.random.default_rng(7)
    ls = lists(rng)
    vals = [postings.pack(p, t) for p, t in ls]
    pids = np.concatenate([p for p, _ in ls])
    tfs = np.concatenate([t for _, t in ls])
    lens = np.array([len(p) for p, _ in ls])
    ends = np.cumsum(lens)
    starts = ends - lens
    # a merge's groups: each list split in two segments by pid parity of its position
    groups = [[postings.pack(p[0::2], t[0::2]), postings.pack(p[1::2], t[1::2])] if len(p) > 1
              else [postings.pack(p, t)] for p, t in ls]
    want = np.sort(rng.choice(200_000, 64, replace=False))
    long_ = [v for v, (p, _) in zip(vals, ls) if len(p) > 1000]
    short = [v for v, (p, _) in zip(vals, ls) if len(p) <= 12][:20_000]
    r = a.rounds
    print(f"lnkmem at {postings.__file__}")
    print(f"lists {len(vals)}, postings {len(pids)}, long (>1000) {len(long_)}, bytes {sum(map(len, vals))}")
    rows = [
        ("pack each", lambda: [postings.pack(p, t) for p, t in ls]),
        ("pack_many", lambda: list(postings.pack_many(pids, tfs, starts, ends))),
        ("unpack each", lambda: [postings.unpack(v) for v in vals]),
        ("unpack short (<=12) x20000", lambda: [postings.unpack(v) for v in short]),
        ("lookup 64 ids in long lists", lambda: [postings.lookup(v, want) for v in long_]),
        ("check_many all", lambda: postings.check_many(vals)),
        ("check each (long)", lambda: [postings.check(v) for v in long_]),
        ("join_many all", lambda: postings.join_many(groups)),
    ]
    for name, fn in rows:
        print(f"{name:32s} {best(fn, r):9.1f} ms")


if __name__ == "__main__":
    main()
