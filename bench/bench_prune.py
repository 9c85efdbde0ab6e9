"""MaxScore on and off, side by side on one index: the same answers, and the time.

    .venv/bin/python bench/bench_prune.py INDEX QUERIES.json [--long N] [--rounds R]

INDEX: an index folder (``<state>/index``, e.g. one ``lnk-lnkmem index`` made of
a ``bench/corpus.py`` folder); QUERIES.json: a list of query strings (the corpus's
``queries.json``). ``--long N`` adds N longer queries (8 to 20 words drawn, seeded,
from the index's own passages: an agent pasting text). Each query runs with
``prune`` off and on, alternately, ``--rounds`` times; the table gives p50 /
p90 / p99 of each query's median in ms, and every answer (pids and scores) is
compared: the script exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lnkmem.index.rank import search  # noqa: E402
from lnkmem.index.store import Store  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def long_queries(st: Store, n: int, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    live = [int(p) for p in st.snapshot.alive.nonzero()[0]]
    out = []
    for p in st.passages_of(rng.sample(live, n)):
        words = p.text.split()
        k = rng.randint(8, 20)
        start = rng.randint(0, max(0, len(words) - k))
        out.append(" ".join(words[start:start + k]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("index")
    ap.add_argument("queries")
    ap.add_argument("--long", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--limit", type=int, default=10)
    a = ap.parse_args()
    st = Store.open(a.index)
    with open(a.queries) as f:
        short = json.load(f)
    sets = {"corpus queries": short, "long queries": long_queries(st, a.long) if a.long else []}
    bad = 0
    print(f"index: {a.index}, {st.snapshot.live} live passages, {len(st.snapshot.segs or {})} segments")
    print("| queries | n | off p50 / p90 / p99 ms | on p50 / p90 / p99 ms | on ÷ off p50 |")
    print("|---|---|---|---|---|")
    for name, qs in sets.items():
        if not qs:
            continue
        times = {False: [[] for _ in qs], True: [[] for _ in qs]}
        answers = {}
        for _ in range(a.rounds):
            for i, q in enumerate(qs):
                for on in (False, True):
                    t = time.perf_counter()
                    got = search.bm25(st, q, a.limit, prune=on)
                    times[on][i].append(time.perf_counter() - t)
                    answers[on, i] = got
        for i, q in enumerate(qs):
            x, y = answers[False, i], answers[True, i]
            same = [p for p, _ in x] == [p for p, _ in y] and all(
                abs(s - t) <= 1e-4 * max(1.0, abs(s)) for (_, s), (_, t) in zip(x, y))
            if not same:
                bad += 1
                print(f"DIFFERENT: {q!r}\n  off {x}\n  on  {y}", file=sys.stderr)
        med = {on: [statistics.median(t) * 1000 for t in times[on]] for on in (False, True)}
        cell = {on: " / ".join(f"{pct(med[on], p):.2f}" for p in (50, 90, 99)) for on in (False, True)}
        print(f"| {name} | {len(qs)} | {cell[False]} | {cell[True]} | "
              f"{pct(med[True], 50) / max(pct(med[False], 50), 1e-9):.2f}× |")
    st.close()
    print("answers: " + ("all identical" if not bad else f"{bad} differ"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
