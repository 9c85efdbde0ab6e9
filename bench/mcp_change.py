"""A file changed on disk, timed until `search` over MCP finds it, a few times in a row.

    .venv/bin/python bench/mcp_change.py BASE STATE [--changes 3] [--wait 3]

BASE: a ``bench/corpus.py`` folder (``home/``, ``agent/``), STATE: a state folder an
``lnk-lnkmem index`` of it made. Starts ``serve`` (``LNKMEM_LOG=debug``, its log
beside STATE as ``serve.log``), waits until it answers, waits ``--wait`` seconds,
then appends a sentence with a new word to a Home file, polls ``search`` every 5 ms
until it lists the file, puts the file back, and goes on to the next. Prints each
change's time and how many polls it took (a poll's own time shows what ran beside
it). Session 4 at scale 10: 595, 65, 72 ms (the first change after an open is slow).
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_local as bl  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("state")
    ap.add_argument("--changes", type=int, default=3)
    ap.add_argument("--wait", type=float, default=3.0)
    a = ap.parse_args()
    home, agent = os.path.join(a.base, "home"), os.path.join(a.base, "agent")
    env = dict(os.environ, LNKMEM_LOG="debug")
    c = bl.Client([bl.program(), "serve", home, a.state, agent], env, os.path.join(a.state, "serve.log"))
    try:
        c.request("initialize", bl.INIT)
        c.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        t = time.perf_counter()
        while "indexing" in bl.search_call(c, "asyncio")[0]:
            time.sleep(0.02)
        print(f"answering after {time.perf_counter() - t:.2f} s", flush=True)
        time.sleep(a.wait)
        files = sorted(glob.glob(os.path.join(home, "**", "*.md"), recursive=True))
        for i, full in enumerate(files[1000:1000 + a.changes]):
            data = open(full, "rb").read()
            word = f"zqxchange{i}w"
            t = time.perf_counter()
            try:
                with open(full, "ab") as f:
                    f.write(f"\n\nA late addition about {word}.\n".encode())
                polls = 0
                while not bl.search_call(c, word)[0].get("hits"):
                    polls += 1
                    if time.perf_counter() - t > 30:
                        raise RuntimeError(f"{word!r} not found 30 s after the change")
                    time.sleep(0.005)
                print(f"change {i}: {1000 * (time.perf_counter() - t):.0f} ms, {polls} polls", flush=True)
            finally:
                with open(full, "wb") as f:
                    f.write(data)
            time.sleep(1)
    finally:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
