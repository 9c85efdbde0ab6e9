"""A restart's first answer (issue 47): `serve` started on an index that holds the tree, its
`initialize` answered, then one search; the time from the spawn to that search's answer
(wall) and the CPU the process had used by then (every thread, those ended included: what
the start cost, less the machine's noise than the wall); ``common.first_answer``, which
bench_scale's restart row runs too.

Run: ``.venv/bin/python bench/bench_first_answer.py [--scale 1] [--runs 15] [--vs PROGRAM] [--record]``

The corpus is ``bench/corpus.py``'s at the scale (made once, in bench/out/); its index is
built once by this tree's ``lnk-lnkmem index`` into bench/out/first-answer-<scale>/. Each
program's package is compiled first (``common.compiled``), as an install compiles it.
``--vs`` names another ``lnk-lnkmem`` (the code before a change): the two are started in
turn, A B A B ..., and the ratio taken pair by pair, so that the machine's drift moves both.
Prints a markdown table; ``--record`` writes it to the ``bench:first-answer`` section of
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import shutil
import statistics
import subprocess
import time
from datetime import datetime, timezone

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import HERE, ROOT, compiled, first_answer  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lnkmem: a restart's first answer")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--vs", help="another lnk-lnkmem, started in turn with this tree's")
    ap.add_argument("--record", action="store_true")
    a = ap.parse_args(argv)
    import corpus
    t0 = time.monotonic()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    src = os.path.join(HERE, "out", f"corpus-{a.scale:g}")
    corpus.generate(src, a.scale, 7, log=lambda *x: None)
    home, agent = os.path.join(src, "home"), os.path.join(src, "agent")
    with open(os.path.join(src, "queries.json")) as f:
        query = json.load(f)[0]
    prog = os.path.join(ROOT, ".venv", "bin", "lnk-lnkmem")
    states = {}
    for name, p in [("this tree", prog)] + ([("--vs", a.vs)] if a.vs else []):
        compiled(p)
        state = os.path.join(HERE, "out", f"first-answer-{a.scale:g}-{len(states)}")
        if not os.path.isdir(os.path.join(state, "index")):
            shutil.rmtree(state, ignore_errors=True)
            subprocess.run([p, "index", home, state, agent], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        subprocess.run([p, "index", home, state, agent], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)  # (the tree's metadata and the index in the page cache)
        states[name] = (p, state)
    runs: dict[str, list] = {n: [] for n in states}
    for _ in range(a.runs):
        for name, (p, state) in states.items():
            runs[name].append(first_answer(p, home, state, agent, query))
    rows = ["| program | first answer, wall s (min / median / max) | CPU s by then (median) | hits |", "|---|---|---|---|"]
    for name, rs in runs.items():
        ws = sorted(r[0] for r in rs)
        rows.append(f"| {name} | {ws[0]:.3f} / {statistics.median(ws):.3f} / {ws[-1]:.3f} | "
                    f"{statistics.median(r[1] for r in rs):.2f} | {rs[0][2]} |")
    if a.vs:
        ratio = statistics.median(x[0] / y[0] for x, y in zip(runs["this tree"], runs["--vs"]))
        rows.append("")
        rows.append(f"This tree / --vs, wall, the median of {a.runs} pairs: {ratio:.2f}.")
    text = "\n".join(rows) + f"\n\nScale {a.scale:g}, {a.runs} runs each{common.load_note()}."
    mach = common.machine()
    common.report("lnkmem: a restart's first answer", when, mach, text, {"runs": runs}, t0, None)
    if a.record:
        head = (f"`.venv/bin/python bench/bench_first_answer.py --scale {a.scale:g} --runs {a.runs}"
                f"{' --vs PROGRAM' if a.vs else ''}` — {when}, on {mach}.")
        common.write_section("first-answer", ["## A restart's first answer (issue 47)", "", head, "", text])
    return 0


if __name__ == "__main__":
    sys.exit(main())
