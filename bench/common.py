"""What the benchmarks share: the path, a process's memory and a sampler of it,
percentiles, the machine's description, writing one benchmark's section of
docs/BENCHMARKS.md, and a restart's first answer (a new `serve` answering one search).

The path: a script run as ``python bench/x.py`` has bench/ on its path; importing this
module (first, before lnkmem, fakes or tests) puts the repository's root on it, after
PYTHONPATH's folders (a tree chosen there for a before/after run wins) and before
site-packages, so the script imports this tree's lnkmem and the test harness (fakes/,
tests/). It is the one place the benchmarks set their path."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import threading
import time
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))  # bench/
ROOT = os.path.dirname(HERE)
_CHOSEN = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
if ROOT not in sys.path:
    _at = 1  # after the script's own folder
    while _at < len(sys.path) and os.path.abspath(sys.path[_at]) in _CHOSEN:
        _at += 1
    sys.path.insert(_at, ROOT)
DOC = os.path.join(ROOT, "docs", "BENCHMARKS.md")
INTRO = ("# Benchmarks\n\n"
         "Measured figures for lnkmem, each produced by a script under `bench/` and recorded here by it\n"
         "(`--record`). Each benchmark owns one section between `<!-- bench:NAME -->` and\n"
         "`<!-- /bench:NAME -->` markers and replaces only that section; numbers depend on the machine,\n"
         "which every section names.\n")


def pct(xs, p: float) -> float:
    """The p-th percentile of ``xs`` (nearest rank)."""
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(*extra: str) -> str:
    """CPU, cores, memory, kernel and Python, then ``extra`` (versions that matter)."""
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f", {int(f.readline().split()[1]) / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    tail = "".join(f", {e}" for e in extra if e)
    return (f"{cpu_model()}, {os.cpu_count()} cores{mem}; Linux {platform.release()}; "
            f"Python {platform.python_version()}{tail}")


def write_section(section: str, lines: list[str]) -> None:
    """Replace this benchmark's section (``lines`` between its markers), keeping the others;
    re-read right before writing, since other benchmarks own the other sections."""
    begin, end = f"<!-- bench:{section} -->", f"<!-- /bench:{section} -->"
    body = "\n".join([begin, *lines, end])
    os.makedirs(os.path.dirname(DOC), exist_ok=True)
    try:
        with open(DOC, encoding="utf-8") as f:
            doc = f.read()
    except FileNotFoundError:
        doc = INTRO
    i, j = doc.find(begin), doc.find(end)
    if i >= 0 and j > i:
        doc = doc[:i] + body + doc[j + len(end):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + body + "\n"
    tmp = f"{DOC}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(doc)
    os.replace(tmp, DOC)


def report(title: str, when: str, mach: str, text: str, figures: dict, t0: float,
           json_path: Optional[str] = None) -> None:
    """Print a benchmark's table, and write its raw figures when asked."""
    print(f"{title} — {when}")
    print(f"Machine: {mach}\n")
    print(text)
    print(f"\n(total {time.monotonic() - t0:.0f} s)")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(figures, when=when, machine=mach), f, indent=1)


def files_reread(index_stderr: str) -> int:
    """How many files `lnk-lnkmem index` says it (re)indexed, from its summary line; -1 when absent."""
    import re
    m = re.search(r"indexed ([\d,]+) files?, [\d,]+ unchanged", index_stderr)
    return int(m.group(1).replace(",", "")) if m else -1


def load_note() -> str:
    """"; load average X at start" for a report's machine line ("" where /proc has none)."""
    try:
        with open("/proc/loadavg") as f:
            return f"; load average {f.read().split()[0]} at start"
    except OSError:
        return ""


# --- a process's memory ------------------------------------------------------------------


def proc_memory(pid="self") -> dict[str, int]:
    """The memory lines of ``/proc/<pid>/status`` (VmRSS, VmHWM, RssAnon, RssFile,
    RssShmem, ...), in KiB; empty once the process is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("Vm", "Rss")):
                    k, v = line.split(":", 1)
                    out[k] = int(v.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def proc_memory_mib(pid="self", lines=("VmRSS", "VmHWM", "RssAnon", "RssFile")) -> dict[str, int]:
    """``lines`` of ``proc_memory``, in MiB (rounded down)."""
    m = proc_memory(pid)
    return {k: m[k] // 1024 for k in lines if k in m}


class MemorySampler:
    """One process's memory lines (``proc_memory``) read every ``every`` seconds on a
    thread: ``now`` the latest reading, ``peak(line)`` the largest since the start or the
    last ``mark()``, in KiB. ``"RssFile+RssShmem"`` is tracked too: the file pages a
    process maps, those of files on tmpfs included."""

    def __init__(self, pid="self", every: float = 0.05):
        self.pid, self.every = pid, every
        self.now: dict[str, int] = {}
        self.top: dict[str, int] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._read()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _read(self) -> dict[str, int]:
        m = proc_memory(self.pid)
        if m:
            m["RssFile+RssShmem"] = m.get("RssFile", 0) + m.get("RssShmem", 0)
        with self._lock:
            if m:
                self.now = m
            for k, v in m.items():
                self.top[k] = max(self.top.get(k, 0), v)
        return m

    def _run(self) -> None:
        while not self._halt.wait(self.every):
            self._read()

    def mark(self) -> dict[str, int]:
        """Start a new window; the memory lines now."""
        with self._lock:
            self.top = {}
        return self._read()

    def peak(self, line: str = "VmRSS") -> int:
        """The largest ``line`` seen in this window, a reading now included (KiB)."""
        self._read()
        with self._lock:
            return self.top.get(line, 0)

    def stop(self) -> None:
        self._halt.set()
        self._thread.join()


# --- a restart's first answer ------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """The CPU seconds (user + system) ``pid`` has used so far, every thread of it, those
    that have ended included (``/proc/<pid>/stat`` counts them; the live threads' own
    ``task/*/stat`` do not: `serve` imports the index on a thread that ends once the
    memory is made, whose CPU was missed that way)."""
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / TICK


def first_answer(prog: str, home: str, state: str, agent: str, query: str,
                 env: Optional[dict] = None) -> tuple[float, float, int]:
    """A restart as a user waits for it: ``prog serve`` started on ``state`` (an index that
    holds the tree), its `initialize` answered, then one search; (wall seconds from the
    spawn to that search's answer, the process's CPU seconds by then, the answer's hits)."""
    import subprocess
    t0 = time.perf_counter()
    p = subprocess.Popen([prog, "serve", home, state, agent], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=env)

    def send(o):
        p.stdin.write((json.dumps(o) + "\n").encode())
        p.stdin.flush()
    try:
        send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b", "version": "1"}}})
        p.stdout.readline()
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "search", "arguments": {"query": query}}})
        answer = json.loads(p.stdout.readline())
        wall, cpu = time.perf_counter() - t0, cpu_s(p.pid)
    finally:
        p.stdin.close()
        p.wait(60)
    hits = len(answer.get("result", {}).get("structuredContent", {}).get("hits", []))
    return wall, cpu, hits


def compiled(prog: str, env: Optional[dict] = None) -> str:
    """``prog`` (an ``lnk-lnkmem``) with its package's bytecode written, as an install
    compiles it: the benches' children run with PYTHONDONTWRITEBYTECODE and the program
    sets ``dont_write_bytecode``, so an editable checkout would otherwise compile every
    module from source at every start. The package is the one ``prog``'s Python imports
    (PYTHONPATH in ``env`` included: a tree chosen there for a before/after run)."""
    import subprocess
    py = os.path.join(os.path.dirname(prog), "python")
    subprocess.run([py if os.path.exists(py) else sys.executable, "-c",
                    "import compileall, os, lnkmem; compileall.compile_dir(os.path.dirname(lnkmem.__file__), quiet=1)"],
                   check=True, stdout=subprocess.DEVNULL, env=env)
    return prog
