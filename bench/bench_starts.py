"""What a start of the program costs: wall and CPU (all its threads) of `serve`'s first
answer and of the people's `search` and `status`, on the bundled example Home.

    python bench/bench_starts.py [--prog PROG] [--against OTHER] [--runs N]

``--against``: another `lnk-lnkmem` (another checkout's venv, say), run in turn with the
first, so that both meet the same machine; each figure is the median of ``--runs``.
Prints a markdown table; record it in docs/BENCHMARKS.md ("Process starts").
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import compiled, first_answer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOME = os.path.join(ROOT, "examples", "home")
AGENT = os.path.join(ROOT, "examples", "agent")
QUERY = "how do we deploy the service"


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LNK_", "LNKMEM_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _child(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall s, CPU s of the child and all its threads) of one command run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _one_round(prog: str, state: str, env: dict) -> dict:
    people = [HOME, state, "--agent", AGENT]
    wall, cpu, hits = first_answer(prog, HOME, state, AGENT, QUERY, env=env)
    if not hits:
        raise SystemExit(f"{prog}: serve answered no hit for {QUERY!r}")
    return {"serve, first answer": (wall, cpu),
            "search (people's command)": _child([prog, "search", *people, QUERY], env),
            "status": _child([prog, "status", *people], env),
            "python -c pass (its interpreter)": _child([os.path.join(os.path.dirname(prog), "python"), "-c", "pass"], env)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prog", default=os.path.join(ROOT, ".venv", "bin", "lnk-lnkmem"))
    ap.add_argument("--against")
    ap.add_argument("--runs", type=int, default=15)
    a = ap.parse_args()
    if a.runs < 1:
        ap.error("--runs: at least 1")
    progs = [a.prog] + ([a.against] if a.against else [])
    env = _env()
    with tempfile.TemporaryDirectory() as tmp:
        states = {}
        for i, prog in enumerate(progs):
            compiled(prog, env)
            states[prog] = os.path.join(tmp, f"state{i}")
            subprocess.run([prog, "index", HOME, states[prog], "--agent", AGENT], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=env, check=True)
        got: dict = {p: {} for p in progs}
        for _ in range(a.runs):
            for prog in progs:  # in turn: both meet the same machine
                for row, figure in _one_round(prog, states[prog], env).items():
                    got[prog].setdefault(row, []).append(figure)
    load = os.getloadavg()[0]
    print(f"{a.runs} runs each, medians; load average {load:.2f}\n")
    head = "| start | " + " | ".join(f"{p}: wall ms | CPU ms" for p in progs) + " |"
    print(head)
    print("|" + "---|" * (1 + 2 * len(progs)))
    for row in got[progs[0]]:
        cells = []
        for prog in progs:
            xs = got[prog][row]
            cells += [f"{statistics.median(x[0] for x in xs) * 1000:.0f}", f"{statistics.median(x[1] for x in xs) * 1000:.0f}"]
        print(f"| {row} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
