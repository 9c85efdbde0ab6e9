"""Driving the real `lnk-lnkmem` program from tests: subprocesses, pipes, JSON lines."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import queue
import subprocess
import sys
import threading
import time
import tracemalloc
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("home", "chats", "skills", "notes")  # what a ref begins with
BIN = Path(sys.executable).parent
PROGRAM = str(BIN / "lnk-lnkmem")


def deleted_indexes(pid: int) -> list:
    """The index files (``*.mdb``) process ``pid`` maps or holds open though they were unlinked."""
    held = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                pass
        with open(f"/proc/{pid}/maps") as f:
            held.update(line.split(None, 5)[-1].strip() for line in f if line.count(" ") >= 5)
    except OSError:
        return []
    return sorted(h for h in held if h.endswith(".mdb (deleted)"))


def run_cli(*args: str, env: Optional[dict] = None, timeout: float = 60, input: Optional[bytes] = None):
    e = base_env()
    e.update(env or {})
    return subprocess.run([PROGRAM, *args], capture_output=True, env=e, timeout=timeout,
                          input=input if input is not None else b"")


def index_home(home: "Home", env: Optional[dict] = None, state: Optional[Path] = None, timeout: float = 60) -> str:
    """`lnk-lnkmem index` over a Home (into ``state`` when given, else the Home's own);
    it must succeed. Returns what it printed on stderr (its summary and its log)."""
    r = run_cli("index", str(home.folder), str(state or home.state), str(home.agent), env=env, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stderr.decode()


def base_env() -> dict:
    """The test process's environment for a child, less Link's and the engine's own names:
    LNK_*, LNKMEM_*, and OPENBLAS_NUM_THREADS, which the program sets for itself (a test
    that imported it in process would otherwise hand it on, as if the starter had set it)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LNK_") and not k.startswith("LNKMEM_") and k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class Home:
    """An agent's Home and agent folder laid out in a temporary directory."""

    def __init__(self, base: Path):
        self.base = base
        self.folder = base / "home"
        self.agent = base / "agent"
        self.state = self.agent / "memory" / "lnkmem"
        self.notes = self.agent / "memory" / "notes.md"
        for d in (self.folder, self.agent / "chats", self.agent / "skills", self.agent / "memory"):
            d.mkdir(parents=True, exist_ok=True)

    def write(self, rel: str, text: str) -> Path:
        p = self.folder / rel if not rel.startswith(("chats/", "skills/")) else self.agent / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        return p

    def chat(self, thread: str, messages: list[dict]) -> Path:
        p = self.agent / "chats" / f"{thread}.jsonl"
        p.write_text("".join(json.dumps(m) + "\n" for m in messages))
        return p

    def args(self) -> list[str]:
        return [str(self.folder), str(self.state), str(self.agent)]


class Server:
    """A running `lnk-lnkmem serve`, spoken to over its stdin/stdout."""

    def __init__(self, argv: list[str], env: dict, cwd: Optional[str] = None):
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=cwd)
        self.lines: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self.stderr = b""
        self.ids = itertools.count(1)
        self.pending: dict[Any, dict] = {}
        threading.Thread(target=self._pump, daemon=True).start()
        self._err_pump = threading.Thread(target=self._pump_err, daemon=True)
        self._err_pump.start()

    @classmethod
    def start(cls, home: Home, env: Optional[dict] = None, notes: bool = True, extra_argv=()) -> "Server":
        e = base_env()
        if notes:
            e["LNK_MEMORY_NOTES"] = str(home.notes)
        e.update(env or {})
        return cls([PROGRAM, "serve", *home.args(), *extra_argv], e)

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _pump_err(self) -> None:  # as it comes: a test may read the log of a live server
        fd = self.proc.stderr.fileno()
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            self.stderr += chunk

    def stderr_to_the_end(self, timeout: float = 15) -> bytes:
        """All the process wrote on stderr, once it closed it (it ended)."""
        self._err_pump.join(timeout)
        assert not self._err_pump.is_alive(), "stderr still open"
        return self.stderr

    def send_raw(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, obj: Any) -> None:
        self.send_raw(json.dumps(obj).encode() + b"\n")

    def recv(self, timeout: float = 10) -> dict:
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise EOFError(f"server closed its output; stderr: {self.stderr[-2000:]!r}")
        return json.loads(line)

    def response(self, id_, timeout: float = 10) -> dict:
        deadline = time.monotonic() + timeout
        while id_ not in self.pending:
            msg = self.recv(max(0.01, deadline - time.monotonic()))
            self.pending[msg.get("id")] = msg
        return self.pending.pop(id_)

    def request(self, method: str, params: Optional[dict] = None, timeout: float = 10) -> dict:
        id_ = next(self.ids)
        msg = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        return self.response(id_, timeout)

    def initialize(self, version: str = "2025-11-25") -> dict:
        r = self.request("initialize", {"protocolVersion": version, "capabilities": {},
                                        "clientInfo": {"name": "tests", "version": "0"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return r

    def call(self, tool: str, args: Optional[dict] = None, thread: Optional[str] = None, timeout: float = 20) -> dict:
        params: dict = {"name": tool, "arguments": args or {}}
        if thread is not None:
            params["_meta"] = {"link.local/thread": thread}
        r = self.request("tools/call", params, timeout)
        assert "result" in r, r
        return r["result"]

    def search(self, query: str, **kw) -> dict:
        return self.call("search", {"query": query, **kw})

    def wait_indexed(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.search("zzzzprobe")
            if "indexing" not in r["structuredContent"]:
                return
            time.sleep(0.05)
        raise TimeoutError("indexing did not finish")

    def close(self, timeout: float = 15) -> int:
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            try:
                self.close()
            except Exception:
                self.proc.kill()


def refs(result: dict) -> list[str]:
    return [h["ref"] for h in result["structuredContent"]["hits"]]


@contextmanager
def allocates_at_most(limit: int):
    """Fails when the block's heap (Python's and numpy's, as tracemalloc sees them) peaks
    above ``limit`` bytes more than it held on entry: work bounded by what an input is,
    not by what it claims (a bomb inflated, a count of billions believed), said without
    a clock."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        yield
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    assert peak <= limit, f"the heap grew {peak:,} bytes (at most {limit:,})"


def until(pred, timeout: float = 30, step: float = 0.05):
    """``pred()`` once it is true, polled every ``step`` s; its last value after ``timeout``
    (30 s: generous, as it ends at the first sight; a check that something does NOT happen
    names its own, shorter, span: ``assert not until(..., timeout=5)``)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            return v
        time.sleep(step)


class SocketClient:
    """A connection to `serve-many`: the first line, then MCP lines."""

    def __init__(self, path: str, timeout: float = 10):
        import socket as _socket
        self.sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(str(path))
        self.file = self.sock.makefile("rb")
        self.ids = itertools.count(1)
        self.pending: dict[Any, dict] = {}

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, obj: Any) -> None:
        self.send_raw(json.dumps(obj).encode() + b"\n")

    def recv(self) -> Optional[dict]:
        line = self.file.readline()
        return json.loads(line) if line else None

    def first(self, obj: Any) -> Optional[dict]:
        self.send(obj)
        return self.recv()

    def request(self, method: str, params: Optional[dict] = None) -> dict:
        id_ = next(self.ids)
        msg = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            msg["params"] = params
        self.send(msg)
        while id_ not in self.pending:
            r = self.recv()
            if r is None:
                raise EOFError("connection closed")
            self.pending[r.get("id")] = r
        return self.pending.pop(id_)

    def call(self, tool: str, args: Optional[dict] = None, thread: Optional[str] = None) -> dict:
        params: dict = {"name": tool, "arguments": args or {}}
        if thread is not None:
            params["_meta"] = {"link.local/thread": thread}
        r = self.request("tools/call", params)
        assert "result" in r, r
        return r["result"]

    def search(self, query: str, **kw) -> dict:
        return self.call("search", {"query": query, **kw})

    def closed(self) -> bool:
        """Whether the engine closed the connection (reads until EOF)."""
        try:
            return self.file.read() == b""
        except OSError:
            return True

    def close(self) -> None:
        try:
            self.file.close()
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> "SocketClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Many:
    """A running `lnk-lnkmem serve-many`."""

    def __init__(self, sock: Path, agents: Optional[dict], flags=(), env: Optional[dict] = None):
        self.socket = sock
        e = base_env()
        e.setdefault("LNKMEM_LINGER_S", "30")
        e.update(env or {})
        argv = [PROGRAM, "serve-many", str(sock)] + ([json.dumps(agents)] if agents is not None else []) + list(flags)
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=e)
        deadline = time.monotonic() + 10
        while self.proc.poll() is None and time.monotonic() < deadline:
            if self._listening():
                break
            time.sleep(0.01)

    def _listening(self) -> bool:
        import socket as _socket
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            s.connect(str(self.socket))
            return True
        except OSError:
            return False
        finally:
            s.close()

    def connect(self, timeout: float = 10) -> SocketClient:
        return SocketClient(str(self.socket), timeout)

    def hello(self, agent: str) -> SocketClient:
        c = self.connect()
        assert c.first({"agent": agent}) == {"ok": True}
        return c

    def stop(self, sig=None) -> int:
        import signal as _signal
        if self.proc.poll() is None:
            self.proc.send_signal(sig or _signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def stderr(self) -> str:
        return self.proc.stderr.read().decode() if self.proc.poll() is not None else ""

    def __enter__(self) -> "Many":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def agent_entry(home: "Home", env: Optional[dict] = None) -> dict:
    """What Link puts in Agents for a Home: the argv `command` prints, and an env."""
    e = {"LNK_MEMORY_NOTES": str(home.notes)}
    e.update(env or {})
    out = run_cli("command", *home.args(), env=e)
    assert out.returncode == 0, out.stderr
    return {"argv": json.loads(out.stdout)["argv"], "env": e}


def random_file(rng, ref: str, version: str, vocab: list, n=None, words=(1, 10), weights=None):
    """A NewFile for Store.commit made of random words: ``n`` passages (1-6 when not
    given), each of ``words`` (a range) drawn from ``vocab`` (by ``weights`` when given),
    with their counts; for tests that drive the store directly."""
    from lnkmem.index.commit import NewFile
    from lnkmem.index.format import Passage
    n = n or rng.randint(1, 6)
    ps, counts = [], []
    for i in range(n):
        drawn = rng.choices(vocab, weights, k=rng.randint(*words))
        c: dict = {}
        for w in drawn:
            c[w] = c.get(w, 0) + 1
        ps.append(Passage(ref, i + 1, i + 1, " ".join(drawn)))
        counts.append((c, len(drawn)))
    return NewFile(ref, version, 10, "text", ps, counts)


def tree_digest(*roots, skip=()) -> dict:
    """Every path under ``roots`` (but those under ``skip``) with what it is: a regular
    file's SHA-256, a link's target (and the SHA-256 of the file it leads to, where
    that file is not under ``skip``), "dir", or "other"; two digests are equal only if
    nothing under the roots was written, removed, renamed or made."""
    skip = tuple(Path(s) for s in skip)
    skip_real = tuple(Path(os.path.realpath(s)) for s in skip)

    def skipped(p: Path, among: tuple = skip) -> bool:
        return any(p == s or s in p.parents for s in among)

    def sha(p) -> str:
        with open(p, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    out: dict = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            d = Path(dirpath)
            if skipped(d):
                continue
            for n in filenames + dirnames:
                p = d / n
                if skipped(p):
                    continue
                if p.is_symlink():
                    to = Path(os.path.realpath(p))
                    led_to = ":" + sha(to) if to.is_file() and not skipped(to, skip_real) else ""
                    out[str(p)] = "link:" + os.readlink(p) + led_to
                elif p.is_file():
                    out[str(p)] = sha(p)
                else:
                    out[str(p)] = "dir" if p.is_dir() else "other"
    return out


class RandomText:
    """Files of random words for tests that drive the store directly: each passage of
    ``words`` (a range) drawn from ``vocab`` (by ``weights`` when given), ``passages``
    passages a file (1-6 when not given)."""

    def __init__(self, vocab: list, words=(1, 10), weights=None, passages: Optional[int] = None):
        self.vocab, self.words, self.weights, self.passages = vocab, words, weights, passages

    def file(self, rng, ref: str, version: str = "v1", n: Optional[int] = None):
        return random_file(rng, ref, version, self.vocab, n or self.passages, self.words, self.weights)


def assert_same_snapshot(a, b) -> None:
    """Two snapshots equal in everything a search or a commit reads: which ids are live
    and in which segment; for ids in a segment their length, source and ref; the sums."""
    import numpy as np
    assert a.gen == b.gen
    assert a.live == b.live
    assert a.total_len == b.total_len
    assert a.avgdl == b.avgdl
    assert a.segs == b.segs
    n = max(len(a.alive), len(b.alive))

    def pad(x, fill):
        return np.concatenate((x, np.full(n - len(x), fill, x.dtype)))

    for name, fill in (("alive", False), ("seg_of", -1)):
        assert np.array_equal(pad(getattr(a, name), fill), pad(getattr(b, name), fill)), name
    held = np.flatnonzero(pad(b.seg_of, -1) >= 0)
    assert held.max(initial=0) < min(len(a.alive), len(b.alive))
    for name in ("doclen", "src"):
        assert np.array_equal(getattr(a, name)[held], getattr(b, name)[held]), name
    assert [a.refs[i] for i in a.refid[held]] == [b.refs[i] for i in b.refid[held]]
