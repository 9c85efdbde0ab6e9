"""The soak (issue 7, part 4): one `serve-many` under steady load for a bounded time.

Run: ``.venv/bin/python bench/soak.py [--minutes 10] [--kills 200] [--json FILE]``
(``make soak``). Unix sockets only; every loop is bounded in time.

One ``lnk-lnkmem serve-many --stay`` serves five local agents (Hello) and one
agent bound to the fake files and storage bridges (write-back every second).
For ``--minutes``:

- 50 sessions search (some `read` and `list`): 40 Hello sessions over the
  five local agents, 10 Bound sessions of the bound agent;
- 5 sessions `remember` (4 local agents, the bound one), each replacing its
  previous note with a new one (``remove`` + ``add``) as fast as answered;
- files change: a new file in a local Home every 0.5 s (seen by the
  watcher), one in the bridge's Home every 2 s (with a ``changed`` control);
- the bridges inject a fault every 10 s (503 and 429 storms, 412 races, slow
  answers, dropped and refused connections);
- the engine's RSS is sampled every 5 s.

Then the load stops and it checks that nothing was lost: every file written
is found by its unique word, every agent's notes hold exactly the last note
each rememberer was answered for, the copy (after a ``flush``) holds every
file of the bridge's Home; and SIGTERM ends the engine with status 0.

Reports requests served, errors, p50/p99 latency per tool, RSS over time and
whether anything was lost. Then, unless ``--kills 0``, it runs the kill loop
(``bench/kills.py``) so that ``make soak`` runs both.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)

HERE = Path(common.HERE)
ROOT = Path(common.ROOT)


from tests.bridges import Bridges  # noqa: E402
from tests.helpers import Home, Many, agent_entry  # noqa: E402

WORDS = ("harbor lantern copper velvet meadow summit glacier ember willow quartz saffron tundra canyon orchid "
         "comet nebula prairie lagoon falcon otter maple cedar river stone").split()
FAULTS = [("storage", {"mode": "503", "count": 20, "retry_after": 0}),
          ("files", {"mode": "503", "count": 20, "retry_after": 0}),
          ("storage", {"mode": "429", "count": 10, "retry_after": 0}),
          ("storage", {"mode": "412", "count": 3}),
          ("files", {"mode": "slow", "count": 10, "delay": 0.2}),
          ("storage", {"mode": "drop", "count": 3}),
          ("files", {"mode": "drop", "count": 3}),
          ("storage", {"mode": "down", "count": 3}),
          ("storage", {"mode": "refuse", "delay": 1.0})]


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


class Conn:
    """One session over the socket: a first line, then MCP requests one at a time."""

    ids = itertools.count(1)

    def __init__(self, reader, writer):
        self.r, self.w = reader, writer

    @classmethod
    async def open(cls, path: str, first: dict) -> "Conn":
        r, w = await asyncio.open_unix_connection(path, limit=1 << 24)
        w.write(json.dumps(first).encode() + b"\n")
        await w.drain()
        answer = json.loads(await asyncio.wait_for(r.readline(), 60))
        if answer != {"ok": True}:
            w.close()
            raise RuntimeError(f"first line refused: {answer}")
        return cls(r, w)

    async def call(self, tool: str, args: dict, timeout: float = 60) -> dict:
        rid = next(self.ids)
        self.w.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                                 "params": {"name": tool, "arguments": args}}).encode() + b"\n")
        await self.w.drain()
        while True:
            line = await asyncio.wait_for(self.r.readline(), timeout)
            if not line:
                raise ConnectionError("the engine closed the session")
            msg = json.loads(line)
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(f"JSON-RPC error {msg['error']}")
                return msg["result"]

    def close(self) -> None:
        self.w.close()


class Soak:
    def __init__(self, base: Path, minutes: float, sessions: int, rememberers: int, seed: int):
        self.base, self.seconds = base, minutes * 60
        self.n_sessions, self.n_rem = sessions, rememberers
        self.rng = random.Random(seed)
        self.lat: dict[str, list[float]] = {"search": [], "read": [], "list": [], "remember": []}
        self.errors: dict[str, int] = {}
        self.error_samples: list[str] = []
        self.written: list[tuple[str, str, str]] = []  # (agent, token, ref)
        self.last_note: dict[str, str | None] = {}
        self.faults: dict[str, int] = {}
        self.rss: list[tuple[float, float]] = []
        self.homes = [Home(base / f"agent{i}") for i in range(5)]
        for i, h in enumerate(self.homes):
            for j in range(40):
                h.write(f"docs/d{j}.md", self.text(f"agent{i} doc{j}"))
            h.chat("o1", [{"role": "user", "text": self.text("chat")} for _ in range(5)])
            h.notes.write_text("- the first note\n")
        self.bridges = Bridges(base / "link")
        for j in range(30):
            self.bridges.write_home(f"docs/b{j}.md", self.text(f"bound doc{j}"))
        (self.bridges.store("conversations") / "c1.jsonl").write_text(json.dumps({"role": "user", "text": "otter"}) + "\n")
        spec = json.dumps({"notes": "64 KB"})
        self.agents = {f"l{i}": agent_entry(h, env={"LNK_MEMORY_SPEC": spec}) for i, h in enumerate(self.homes)}
        self.socket = base / "run" / "m.sock"

    def text(self, head: str) -> str:
        return f"# {head}\n\n" + "\n\n".join(" ".join(self.rng.choice(WORDS) for _ in range(50)) for _ in range(3)) + "\n"

    def bound_line(self) -> dict:
        return self.bridges.bound(notes="64 KB")

    def error(self, kind: str, what) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1
        if len(self.error_samples) < 20:
            self.error_samples.append(f"{kind}: {str(what)[:200]}")

    async def timed(self, conn: Conn, tool: str, args: dict) -> dict | None:
        t0 = time.monotonic()
        try:
            r = await conn.call(tool, args)
        except Exception as e:  # noqa: BLE001
            self.error(f"{tool}: {type(e).__name__}", e)
            return None
        self.lat[tool].append(time.monotonic() - t0)
        if r.get("isError"):
            self.error(f"{tool}: isError", r["content"][0]["text"])
        return r

    # --- the load -------------------------------------------------------------------

    async def searcher(self, k: int, end: float) -> None:
        bound = k % 5 == 4  # one in five: the bound agent
        first = self.bound_line() if bound else {"agent": f"l{k % 5}"}
        conn = await Conn.open(str(self.socket), first)
        rng = random.Random(k)
        try:
            while time.monotonic() < end:
                x = rng.random()
                if x < 0.8:
                    await self.timed(conn, "search", {"query": " ".join(rng.sample(WORDS, 2)), "limit": 10})
                elif x < 0.9:
                    ref = f"home/docs/b{rng.randint(0, 29)}.md" if bound else f"home/docs/d{rng.randint(0, 39)}.md"
                    await self.timed(conn, "read", {"ref": ref})
                else:
                    await self.timed(conn, "list", {"ref": "home/docs"})
        finally:
            conn.close()

    async def rememberer(self, k: int, end: float) -> None:
        bound = k == self.n_rem - 1
        who = "bound" if bound else f"l{k}"
        conn = await Conn.open(str(self.socket), self.bound_line() if bound else {"agent": who})
        prev = None
        try:
            for n in itertools.count():
                if time.monotonic() >= end:
                    break
                note = f"{who} remembers item {n}"
                args = {"add": note} if prev is None else {"add": note, "remove": prev}
                r = await self.timed(conn, "remember", args)
                if r is not None and not r.get("isError"):
                    prev = note
                    self.last_note[who] = note
        finally:
            conn.close()

    async def changer(self, end: float) -> None:
        n = 0
        while time.monotonic() < end:
            n += 1
            i = n % 5
            token = f"soaktoken{n}x"
            self.homes[i].write(f"live/f{n}.md", f"{token} appears in the live folder\n")
            self.written.append((f"l{i}", token, f"home/live/f{n}.md"))
            if n % 4 == 0:
                btoken = f"boundtoken{n}x"
                self.bridges.write_home(f"live/g{n}.md", f"{btoken} appears in the bridge\n")
                self.written.append(("bound", btoken, f"home/live/g{n}.md"))
                try:
                    r, w = await asyncio.open_unix_connection(str(self.socket))
                    w.write(json.dumps({"changed": {"owner": "o1", "agent": "a1", "path": f"home/live/g{n}.md"}}).encode()
                            + b"\n")
                    await w.drain()
                    answer = json.loads(await asyncio.wait_for(r.readline(), 60))
                    if answer != {"ok": True}:
                        self.error("changed", answer)
                    w.close()
                except Exception as e:  # noqa: BLE001
                    self.error("changed", e)
            await asyncio.sleep(0.5)

    async def injector(self, end: float) -> None:
        k = 0
        while time.monotonic() < end - 10:
            await asyncio.sleep(10)
            which, fault = FAULTS[k % len(FAULTS)]
            k += 1
            server = self.bridges.storage if which == "storage" else self.bridges.files
            try:
                await asyncio.get_running_loop().run_in_executor(None, lambda: server.fault(**fault))
                key = f"{which}:{fault['mode']}"
                self.faults[key] = self.faults.get(key, 0) + 1
            except Exception as e:  # noqa: BLE001
                self.error("fault", e)

    async def sampler(self, pid: int, end: float, t0: float) -> None:
        while time.monotonic() < end + 1:
            m = common.proc_memory(pid)
            if not m:
                return
            if "VmRSS" in m:
                self.rss.append((round(time.monotonic() - t0, 1), round(m["VmRSS"] / 1024, 1)))
            await asyncio.sleep(5)

    # --- the checks -----------------------------------------------------------------

    async def verify(self) -> dict:
        lost = []
        conns = {f"l{i}": await Conn.open(str(self.socket), {"agent": f"l{i}"}) for i in range(5)}
        conns["bound"] = await Conn.open(str(self.socket), self.bound_line())
        try:
            for agent, token, ref in self.written:
                deadline = time.monotonic() + 30
                while True:
                    r = await conns[agent].call("search", {"query": token, "limit": 5})
                    if ref in [h["ref"] for h in r["structuredContent"]["hits"]]:
                        break
                    if time.monotonic() > deadline:
                        lost.append(f"{agent}: {ref} not found by {token}")
                        break
                    await asyncio.sleep(0.5)
        finally:
            for c in conns.values():
                c.close()
        r, w = await asyncio.open_unix_connection(str(self.socket))
        w.write(b'{"flush": {"owner": "o1", "agent": "a1"}}\n')
        await w.drain()
        flushed = json.loads(await asyncio.wait_for(r.readline(), 120))
        w.close()
        if flushed != {"ok": True}:
            lost.append(f"flush: {flushed}")
        # notes: exactly the last answered note of each rememberer (and the first note of the local ones)
        for who, note in self.last_note.items():
            if who == "bound":
                text = (self.bridges.store("memory") / "notes.md").read_text()
                want = [f"- {note}"]
            else:
                text = self.homes[int(who[1:])].notes.read_text()
                want = ["- the first note", f"- {note}"]
            if text.splitlines() != want:
                lost.append(f"notes of {who}: {text.splitlines()[:4]} != {want}")
        # the copy holds every file of the bridge's Home
        d = self.bridges.store("memory") / "lnkmem"
        from lnkmem.replica.load import verify
        from lnkmem.replica.manifest import decode_manifest
        m = decode_manifest((d / "manifest.json").read_bytes())
        in_copy = set(verify(m, lambda n: (d / n).read_bytes()).refs)
        home = self.bridges.home()
        for p in home.rglob("*.md"):
            ref = f"home/{p.relative_to(home).as_posix()}"
            if ref not in in_copy:
                lost.append(f"copy: {ref} missing")
        return {"lost": lost, "files_written": len(self.written), "notes_checked": len(self.last_note),
                "copy_refs": len(in_copy)}

    async def main(self) -> dict:
        flags = ["--stay", "--cache", str(self.base / "cache")] + self.bridges.flags()
        env = {"LNKMEM_WRITEBACK_S": "1"}
        many = Many(self.socket, self.agents, flags, env=env)
        t0 = time.monotonic()
        end = t0 + self.seconds
        try:
            # let every agent index once before the clock starts
            for i in range(5):
                c = await Conn.open(str(self.socket), {"agent": f"l{i}"})
                while "indexing" in (await c.call("search", {"query": "warm"}))["structuredContent"]:
                    await asyncio.sleep(0.2)
                c.close()
            t0 = time.monotonic()
            end = t0 + self.seconds
            tasks = [self.searcher(k, end) for k in range(self.n_sessions)]
            tasks += [self.rememberer(k, end) for k in range(self.n_rem)]
            tasks += [self.changer(end), self.injector(end), self.sampler(many.proc.pid, end, t0)]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for r in results:
                if isinstance(r, Exception):
                    self.error(f"task: {type(r).__name__}", r)
            for server in (self.bridges.storage, self.bridges.files):
                server.fault("ok")
            elapsed = time.monotonic() - t0
            checks = await self.verify()
            code = many.stop(signal.SIGTERM)
            err = many.proc.stderr.read().decode(errors="replace")
        finally:
            many.stop()
            self.bridges.stop()
        served = sum(len(v) for v in self.lat.values())
        report = {
            "seconds": round(elapsed, 1), "sessions": self.n_sessions, "rememberers": self.n_rem,
            "requests_served": served, "requests_per_s": round(served / elapsed, 1),
            "errors": sum(self.errors.values()), "errors_by_kind": self.errors, "error_samples": self.error_samples,
            "latency_ms": {tool: {"n": len(xs), "p50": round(pct(xs, 50) * 1000, 1), "p99": round(pct(xs, 99) * 1000, 1),
                                  "max": round(max(xs) * 1000, 1) if xs else 0.0} for tool, xs in self.lat.items()},
            "rss_mb": {"first": self.rss[0][1] if self.rss else None, "max": max((r for _, r in self.rss), default=None),
                       "last": self.rss[-1][1] if self.rss else None, "series": self.rss},
            "faults_injected": self.faults, "exit_status": code, "traceback_in_log": "Traceback" in err,
            "log_excerpt": err[max(0, err.find("Traceback") - 300):][:3000] if "Traceback" in err else "",
            **checks,
        }
        report["anything_lost"] = bool(checks["lost"])
        return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--sessions", type=int, default=50)
    ap.add_argument("--rememberers", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--kills", type=int, default=200, help="then run bench/kills.py with this many kills (0: none)")
    ap.add_argument("--json", default=str(HERE / "out" / "soak.json"), help="write the report here")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="lnkmem-soak-"))
    try:
        report = asyncio.run(Soak(base, args.minutes, args.sessions, args.rememberers, args.seed).main())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    series = report["rss_mb"].pop("series")
    print(json.dumps(report, indent=2))
    print("RSS over time (s, MB): " + ", ".join(f"{t:g}:{r:g}" for t, r in series[:: max(1, len(series) // 24)]))
    report["rss_mb"]["series"] = series
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    ok = not report["anything_lost"] and report["exit_status"] == 0 and not report["traceback_in_log"]
    if args.kills:
        print(f"\nthe kill loop: {args.kills} kills", flush=True)
        kills = subprocess.run([sys.executable, str(HERE / "kills.py"), "--kills", str(args.kills),
                                "--json", str(Path(args.json).with_name("kills.json"))])
        ok = ok and kills.returncode == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
