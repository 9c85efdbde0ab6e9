"""Writers of one team copy killed at random moments (issue 45): nothing is lost, nothing
is called damaged.

Run: ``.venv/bin/python bench/soak_writers.py [--writers 3] [--rounds 60] [--seed 1]``

W writers of team ``t1`` (each its own ``serve-many`` and cache, ``writes: true``, a write-back
every 0.3 s and a re-check every second, so that their manifests race) share the team
folder in the fake files bridge and the copy in the fake storage bridge; one of them starts
with a cold cache. Each round one writer adds a file with a word of its own and is told
(``changed``); now and then a writer is told to flush, and now and then one is killed
(SIGKILL, at whatever it is doing: an upload, a manifest on its way, a sweep) and started
again on the cache it left. At the end every writer still alive is flushed and ended; a
fresh reader (a cold cache, ``writes: false``) then loads the copy and must find every
word (the union of the writers' changes, from the copy alone: a reader lists nothing), no
engine may have called the copy or the index damaged, and every file the manifest names
must be in the place. Exit 1 when a goal is missed. Part of ``make soak``.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import random
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import common  # noqa: E402,F401  (first of ours: it puts the repository's root on the path)
from lnkmem.index.rank.search import bm25  # noqa: E402
from lnkmem.index.store import Store  # noqa: E402
from lnkmem.replica.load import load_copy  # noqa: E402
from lnkmem.replica.manifest import CopyDamaged, decode_manifest  # noqa: E402
from tests.bridges import KEY, Bridges  # noqa: E402
from tests.helpers import PROGRAM, SocketClient, base_env, until  # noqa: E402

ENV = {"LNKMEM_WRITEBACK_S": "0.3", "LNKMEM_QUIET_S": "0.1", "LNKMEM_RECHECK_S": "1", "LNKMEM_LINGER_S": "30"}


def key(i: int) -> str:
    return KEY if i == 0 else f"{i + 1:02x}" * 32


class Writer:
    """One writer's `serve-many`, its log in a file (never a pipe that fills)."""

    def __init__(self, br: Bridges, base: Path, i: int):
        self.br, self.base, self.i = br, base, i
        self.agent = f"a{i + 1}"
        self.sock = base / f"w{i}" / "mem.sock"
        self.log = base / f"w{i}.log"
        self.proc = None
        self.client = None

    def start(self) -> None:
        self.sock.parent.mkdir(parents=True, exist_ok=True)
        if self.sock.exists():
            self.sock.unlink()
        argv = [PROGRAM, "serve-many", str(self.sock), "{}"] + self.br.flags() + \
            ["--cache", str(self.base / f"cache-w{self.i}")]
        with open(self.log, "a") as err:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                         env={**base_env(), **ENV})
        if not until(self._listening, timeout=20):
            raise RuntimeError(f"writer {self.i} did not start")
        self.client = SocketClient(str(self.sock), 60)
        first = self.br.bound(agent=self.agent, owner="o1", key=key(self.i), notes=None)
        first["team"] = {"id": "t1", "named": "crew", "writes": True}
        r = self.client.first(first)
        if r != {"ok": True}:
            raise RuntimeError(f"writer {self.i}: {r}")

    def _listening(self) -> bool:
        try:
            SocketClient(str(self.sock), 5).close()
            return True
        except OSError:
            return False

    def control(self, obj: dict) -> dict:
        with SocketClient(str(self.sock), 120) as c:
            return c.first(obj)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.client = None

    def end(self) -> None:
        r = self.control({"end": {"owner": "o1", "agent": self.agent}})
        if r != {"ok": True}:
            print(f"writer {self.i}: end answered {r}")
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="lnkmem: writers of one team copy, killed at random moments")
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    rnd = random.Random(a.seed)
    base = Path(tempfile.mkdtemp(prefix="lnkmem-soak-writers-"))
    names = [f"a{i + 1}" for i in range(a.writers + 1)]  # the last: the reader
    br = Bridges(base / "link", bindings={n: {"owner": "o1", "key": key(i)} for i, n in enumerate(names)},
                 teams={"t1": {"folder": "teams/t1", "names": {n: "crew" for n in names},
                               "grants": {n: "all" for n in names}}})
    folder = br.team_folder("t1") / "memory"
    folder.mkdir(parents=True, exist_ok=True)
    for j in range(30):
        (folder / f"base{j}.md").write_text(f"A base note {j} about the harbour and its ropes, basew{j}.\n" * 5)
    words: dict[str, str] = {f"basew{j}": f"home/base{j}.md" for j in range(30)}
    writers = [Writer(br, base, i) for i in range(a.writers)]
    kills = flushes = 0
    t0 = time.monotonic()
    try:
        writers[0].start()
        writers[0].control({"flush": {"owner": "o1", "agent": writers[0].agent}})
        for w in writers[1:]:  # (the last one's cache is cold: it starts after the first copy)
            w.start()
        for rnd_i in range(a.rounds):
            w = rnd.choice([w for w in writers if w.client is not None])
            word = f"soakw{rnd_i}x{w.i}"
            name = f"r{rnd_i}-{w.i}.md"
            (folder / name).write_text(f"Round {rnd_i}: writer {w.i} saw the {word}.\n")
            words[word] = f"home/{name}"
            w.control({"changed": {"owner": "o1", "agent": w.agent, "path": name, "team": "t1"}})
            roll = rnd.random()
            if roll < 0.25:
                f = rnd.choice([w for w in writers if w.client is not None])
                f.control({"flush": {"owner": "o1", "agent": f.agent}})
                flushes += 1
            elif roll < 0.40:
                k = rnd.choice(writers)
                if k.client is not None:
                    time.sleep(rnd.random() * 0.6)  # (somewhere in a write-back, a re-check, an index)
                    k.kill()
                    kills += 1
                    k.start()
            time.sleep(rnd.random() * 0.2)
        for w in writers:
            if w.client is None:
                w.start()
        for _ in range(2):  # each flushed once more after all the others: the union in the copy
            for w in writers:
                r = w.control({"flush": {"owner": "o1", "agent": w.agent}})
                if r != {"ok": True}:
                    print(f"writer {w.i}: flush answered {r}")
        for w in writers:
            w.end()
        # the copy alone, loaded as a fresh reader's cache loads it (every check of §7.2)
        copy = br.team_copy("t1")
        m = decode_manifest((copy / "manifest.json").read_bytes())
        named = set(m.names())
        absent = sorted(n for n in named if not (copy / n).exists())
        missing = []
        if not absent:
            st = Store(str(base / "loaded"))
            try:
                load_copy(st, m, lambda n: (copy / n).read_bytes(), "last", "team t1", {"home"})
                for word, ref in words.items():
                    if ref not in [st.passages_of([p])[0].ref for p, _ in bm25(st, word, 5)]:
                        missing.append(word)
            except CopyDamaged as e:
                absent.append(f"the copy is damaged: {e}")
            finally:
                st.close()
        damaged = [ln.strip() for p in base.glob("w*.log") for ln in p.read_text(errors="replace").splitlines()
                   if "damaged" in ln]
    finally:
        for w in writers:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
        br.stop()
    took = time.monotonic() - t0
    print("| writers | rounds | kills | flushes | words | missing in the copy | named files absent | "
          "'damaged' in the logs | s |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {a.writers} | {a.rounds} | {kills} | {flushes} | {len(words)} | {len(missing)} | "
          f"{len(absent)} | {len(damaged)} | {took:.0f} |")
    for word in missing[:10]:
        print(f"  missing: {word} ({words[word]})")
    for n in absent[:10]:
        print(f"  absent: {n}")
    for ln in damaged[:10]:
        print(f"  log: {ln}")
    print(f"(logs in {base})")
    return 1 if missing or absent or damaged else 0


if __name__ == "__main__":
    sys.exit(main())
