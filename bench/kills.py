"""The kill loop (issue 7, part 2): SIGKILL at random moments, then check nothing is lost.

Run: ``.venv/bin/python bench/kills.py [--kills 200] [--seed 7] [--json FILE]``

Two kinds of run alternate, each ended by a SIGKILL at a random moment:

- **local**: `lnk-lnkmem serve` over stdio on a Home of generated files, with a
  model (``fakes.embedding_server``, slowed), while files change and
  `remember` adds notes: the kill lands while indexing, embedding or
  remembering (every fourth local run starts from no index at all, so that
  the whole Home is being indexed and embedded).
- **bound**: `lnk-lnkmem serve-many` bound to the fake files and storage
  bridges, write-back every 50 ms, while files change in the bridge's Home
  (``changed`` controls) and `remember` writes the notes through the storage
  bridge: the kill lands while indexing, writing the copy back or
  remembering.

After each kill (the engine is dead):

- a notes temp file (``.notes.md.lnkmem-*``) the kill left is the only other
  thing beside the notes, and is gone once a later start answered a remember;
- the notes hold every note whose `remember` was answered, each once, and
  nothing else (a bound `remember` left unanswered by the kill may land
  later, once: its PUT can still be in the storage bridge, another process);
- the local index (or the bound cache) opens and is consistent, or is
  detected as damaged (then the engine rebuilds it: counted); a copy of it,
  brought up to date in-process, holds exactly the passages a clean index
  of the same files holds; every stored vector belongs to a live passage;
- the bound copy, when there is one, is one whole version: every file its
  manifest names is there, and it loads into a consistent index.

With ``--scale-kills N [--scale 0.1]`` (issue 33), N more kills of `serve-many` bound
to a Home of ``bench/corpus.py`` files, alternating: during the write-back of a large
change (every other one aimed: the bridge holds the manifest's PUT 3 s and the kill
lands within 0.5 s of the first blob PUT, so the manifest lands after the engine died),
and during a cold load (an empty cache, the copy in the bucket). After each,
the copy in the bucket is one whole version (every file its manifest names is there;
names read from the manifest without knowing its layout). Every fourth kill and at
the end it settles twice (warm, then from an empty cache): the next start serves every
file of Home, the flush ends cleanly, the cold load finds no damage, and the bucket
holds the copy and no file its manifest does not name. ``--kills 0`` runs only these.

Every tenth bound run, and at the end, the engine is started once more and
let settle (indexed, flushed, SIGTERM): the copy must then hold exactly the
refs of the bridge's Home, the conversations and the notes, with the same
passages as a clean index, and every manifest write must have been
conditional. Prints a summary; ``--json`` writes the figures.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True

import argparse
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)

HERE = Path(common.HERE)
ROOT = Path(common.ROOT)

import msgspec  # noqa: E402

from fakes.harness import FakeServer  # noqa: E402
from lnkmem.memory.config import from_args  # noqa: E402
from lnkmem.core.errors import DamagedIndex  # noqa: E402
from lnkmem.replica.load import load, verify  # noqa: E402
from lnkmem.replica.manifest import decode_manifest  # noqa: E402
from lnkmem.index.store import Store  # noqa: E402
from tests.bridges import KEY, Bridges  # noqa: E402
from tests.helpers import PROGRAM, Home, Many, base_env  # noqa: E402

WORDS = ("alpha beta gamma delta river stone maple cedar falcon otter harbor lantern copper velvet meadow "
         "summit glacier ember willow quartz saffron tundra canyon orchid comet nebula prairie lagoon").split()


class Failure(AssertionError):
    pass


def check(cond, what: str) -> None:
    if not cond:
        raise Failure(what)


# --- what an index holds, compared --------------------------------------------------------

def contents(store: Store, versions: bool = True) -> dict:
    """ref -> (version?, sorted passages): what an index says of each file."""
    out = {}
    for ref, rec in store.all_files().items():
        ps = store.passages_of(rec.pids)
        check(all(p is not None for p in ps), f"{ref}: a passage of the file table is missing")
        body = sorted((p.first, p.last, p.text, p.thread, p.role, p.at) for p in ps)
        out[ref] = ((rec.version, rec.size) if versions else None, rec.kind, body)
    return out


def vectors_ok(store: Store) -> int:
    """Every stored vector belongs to a live passage, all of one length; returns their count."""
    n, dims = 0, set()
    with store.env.begin() as txn:
        for k, v in txn.cursor(db=store.vectors):
            check(txn.get(k, db=store.passages) is not None, "a vector of a passage that is gone")
            dims.add(len(v))
            n += 1
    check(len(dims) <= 1, f"vectors of several lengths: {dims}")
    return n


def open_checked(path: Path) -> tuple[Store, bool]:
    """Open an index as the engine would; (store, was it damaged)."""
    try:
        return Store(str(path)), False
    except (DamagedIndex, Exception):  # noqa: BLE001 - anything the engine's own open would wipe
        return Store.open(str(path)), True


def refreshed(cfg, state: Path):
    """The index at ``state`` brought up to date in-process, as `lnk-lnkmem index` would."""
    from lnkmem.memory.memory import Memory
    memory = Memory(cfg)
    memory.store = memory.open_store()
    memory.refresh_all()
    return memory.store


# --- the local runs ---------------------------------------------------------------------

class Local:
    def __init__(self, base: Path, rng: random.Random, model: FakeServer):
        self.base, self.rng, self.model = base, rng, model
        self.home = Home(base / "local")
        self.ref_state = base / "local-reference"
        self.notes: list[str] = []  # acknowledged adds, in order
        self.temps: set[str] = set()  # notes temp files a kill left, seen at the last check
        self.sent = 0
        for i in range(60):
            self.write(f"d{i % 6}/f{i}.md")
        for t in range(6):
            self.chat(f"t{t}")
        self.env = base_env()
        self.env.update({"LNK_MEMORY_NOTES": str(self.home.notes), "LNK_MEMORY_SPEC": '{"model": "fake-mini"}',
                         "LNK_MEMORY_MODEL": model.listen, "LNKMEM_BATCH_FILES": "3"})
        self.check_env = {k: v for k, v in self.env.items() if k != "LNK_MEMORY_MODEL"}  # checks embed nothing
        self.ref_cfg = from_args(str(self.home.folder), str(self.ref_state), str(self.home.agent), self.check_env)

    def text(self, n: int) -> str:
        paras = ["# " + " ".join(self.rng.choice(WORDS) for _ in range(3))]
        for _ in range(n):
            paras.append(" ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(20, 60))))
        return "\n\n".join(paras) + "\n"

    def write(self, rel: str) -> None:
        self.home.write(rel, self.text(self.rng.randint(1, 6)))

    def chat(self, thread: str) -> None:
        p = self.home.agent / "chats" / f"{thread}.jsonl"
        with open(p, "a") as f:
            for _ in range(self.rng.randint(1, 4)):
                f.write(json.dumps({"role": self.rng.choice(["user", "assistant"]),
                                    "text": " ".join(self.rng.choice(WORDS) for _ in range(15))}) + "\n")

    def mutate(self) -> None:
        for _ in range(self.rng.randint(3, 10)):
            self.write(f"d{self.rng.randint(0, 7)}/f{self.rng.randint(0, 90)}.md")
        files = sorted(self.home.folder.rglob("*.md"))
        if len(files) > 40:
            self.rng.choice(files).unlink()
        self.chat(f"t{self.rng.randint(0, 8)}")

    def run(self, k: int) -> dict:
        self.mutate()
        fresh = k % 4 == 0
        if fresh:
            shutil.rmtree(self.home.state, ignore_errors=True)
        self.model.fault("slow", delay=0.03 * self.rng.randint(0, 4))
        proc = subprocess.Popen([PROGRAM, "serve", *self.home.args()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self.env)
        answers: "queue.Queue[dict]" = queue.Queue()

        def pump() -> None:
            for line in proc.stdout:
                try:
                    answers.put(json.loads(line))
                except ValueError:
                    answers.put({"bad": line.decode(errors="replace")})
        threading.Thread(target=pump, daemon=True).start()
        err = []
        threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True).start()
        pending: dict[str, str] = {}

        def send(obj) -> None:
            try:
                proc.stdin.write(json.dumps(obj).encode() + b"\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
        send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {"protocolVersion": "2025-11-25"}})
        when = self.rng.uniform(0.05, 1.4)
        t0 = time.monotonic()
        moment = "start"
        while time.monotonic() - t0 < when:
            if self.rng.random() < 0.5:
                self.sent += 1
                note = f"note k{k} n{self.sent} {self.rng.choice(WORDS)}"
                rid = f"r{self.sent}"
                pending[rid] = note
                send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                      "params": {"name": "remember", "arguments": {"add": note}}})
                moment = "remember"
            else:
                send({"jsonrpc": "2.0", "id": f"s{k}", "method": "tools/call",
                      "params": {"name": "search", "arguments": {"query": self.rng.choice(WORDS)}}})
            time.sleep(self.rng.uniform(0.01, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(0.05)
        indexing = False
        answered = 0
        while not answers.empty():
            a = answers.get()
            check("bad" not in a, f"a line that is not JSON on stdout: {a}")
            rid = a.get("id")
            if rid in pending:
                check("result" in a, f"remember answered with an error: {a}")
                answered += 1
                if not a["result"]["isError"]:
                    self.notes.append(pending.pop(rid))
                else:
                    check("notes" in a["result"]["content"][0]["text"], f"remember refused: {a}")
                    pending.pop(rid)
            if isinstance(a.get("result"), dict) and "indexing" in (a["result"].get("structuredContent") or {}):
                indexing = True
        for line in (b"".join(err)).decode(errors="replace").splitlines():
            check("Traceback" not in line, "a traceback on stderr")
        return {"fresh": fresh, "moment": moment, "indexing": indexing, "after_s": round(when, 3),
                "unanswered": list(pending.values()), "answered": answered}

    def verify(self, info: dict) -> dict:
        # the notes: every answered add, once; unanswered ones whole or absent; nothing else
        text = self.home.notes.read_text() if self.home.notes.exists() else ""
        check(text == "" or text.endswith("\n"), "the notes end mid-line")
        lines = text.splitlines()
        for note in self.notes:
            check(lines.count(f"- {note}") == 1, f"an answered note is lost or doubled: {note}")
        allowed = {f"- {n}" for n in self.notes} | {f"- {n}" for n in info["unanswered"]}
        stray = [ln for ln in lines if ln not in allowed]
        check(not stray, f"lines nobody wrote in the notes: {stray[:3]}")
        self.notes = [ln[2:] for ln in lines]  # an unanswered one that landed is kept from now on
        # §2.2 rev. 2: the temp file of a notes write killed before its rename may stay
        # until the next start, which removes it: checked once a later run answered a remember
        beside = {p.name for p in self.home.notes.parent.iterdir()}
        temps = {n for n in beside if n.startswith(".notes.md.lnkmem-")}
        check(beside - temps <= {"lnkmem", "notes.md"}, f"files beside the notes: {sorted(beside)}")
        left = temps - self.temps
        if info.get("answered"):
            check(not (temps & self.temps), f"a temp file a kill left survived the next start: {temps & self.temps}")
        else:  # that run may have been killed before its start got that far
            temps |= self.temps
        self.temps = temps
        # the index: consistent (or detected damaged), and right once brought up to date
        damaged = False
        vecs = unembedded = 0
        idx = self.home.state / "index"
        if (idx / "data.mdb").exists():
            with tempfile.TemporaryDirectory(dir=self.base) as tmp:
                shutil.copytree(idx, Path(tmp) / "index")
                store, damaged = open_checked(Path(tmp) / "index")
                vecs = vectors_ok(store)
                unembedded = store.snapshot.live - vecs
                store.close()
                cfg = from_args(str(self.home.folder), tmp, str(self.home.agent), self.check_env)
                killed = refreshed(cfg, Path(tmp))
                got = contents(killed)
                vectors_ok(killed)
                killed.close()
            ref = refreshed(self.ref_cfg, self.ref_state)
            want = contents(ref)
            ref.close()
            check(set(got) == set(want), f"refs differ: {sorted(set(got) ^ set(want))[:5]}")
            bad = [r for r in want if got[r] != want[r]]
            check(not bad, f"passages differ for {bad[:5]}")
        return {"damaged": damaged, "vectors": vecs, "unembedded": unembedded, "temp_notes_left": len(left)}


# --- the bound runs ---------------------------------------------------------------------

def copy_store(bridges: Bridges, where: Path) -> tuple[Store, bool] | None:
    """The copy in the storage bridge loaded into a fresh index (one whole version), or None."""
    d = bridges.store("memory") / "lnkmem"
    man = d / "manifest.json"
    if not man.exists():
        return None
    manifest = decode_manifest(man.read_bytes())
    names = manifest.names()
    missing = [n for n in names if not (d / n).exists()]
    check(not missing, f"the copy's manifest names files that are not there: {missing[:3]}")
    shutil.rmtree(where, ignore_errors=True)
    store = Store(str(where))
    load(store, verify(manifest, lambda n: (d / n).read_bytes(), "agent o1/a1"), "check")
    store.load_snapshot()  # raises DamagedIndex when the tables disagree
    return store, True


class Bound:
    def __init__(self, base: Path, rng: random.Random):
        self.base, self.rng = base, rng
        self.bridges = Bridges(base / "link")
        self.cache = base / "bound-cache"
        self.notes: list[str] = []
        # Unanswered adds whose PUT may still land: the storage bridge is another process, and
        # a PUT it received before the kill is written when the bridge gets to it, which under
        # load can be after the next check has read the notes. Each may appear later, once.
        self.limbo: set[str] = set()
        self.sent = 0
        for i in range(30):
            self.write(f"b{i % 4}/g{i}.md")
        (self.bridges.store("conversations") / "c1.jsonl").write_text(
            json.dumps({"role": "user", "text": "the otter holds the lantern"}) + "\n")
        self.local = Home(base / "bound-reference-home")  # only for the reference's state path

    def write(self, rel: str) -> None:
        words = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(20, 120)))
        self.bridges.write_home(rel, f"# {rel}\n\n{words}\n")

    def engine(self, env: dict | None = None) -> Many:
        e = {"LNKMEM_WRITEBACK_S": "0.05"}
        e.update(env or {})
        return Many(self.base / "run" / "m.sock", {}, self.bridges.flags() + ["--cache", str(self.cache)], env=e)

    def run(self, k: int, hold: float | None = None) -> dict:
        """One run killed at a random moment, or ``hold`` seconds after the first remember is sent."""
        changed = []
        for _ in range(self.rng.randint(2, 6)):
            rel = f"b{self.rng.randint(0, 5)}/g{self.rng.randint(0, 40)}.md"
            self.write(rel)
            changed.append(rel)
        m = self.engine()
        pending: dict[str, str] = {}
        moment = "bind"
        when = self.rng.uniform(0.1, 1.5)
        t0 = time.monotonic()
        errors = []
        sent_remember = threading.Event()

        def work() -> None:
            nonlocal moment
            try:
                c = m.connect(timeout=5)
                if c.first(self.bridges.bound()) != {"ok": True}:
                    return
                for rel in changed:
                    with m.connect(timeout=5) as ctl:
                        moment = "changed"
                        ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": f"home/{rel}"}})
                    self.sent += 1
                    note = f"bound k{k} n{self.sent}"
                    pending[note] = note
                    moment = "remember"
                    sent_remember.set()
                    r = c.call("remember", {"add": note})
                    if not r["isError"]:
                        self.notes.append(pending.pop(note))
                    moment = "write-back"
            except (OSError, EOFError, ValueError, AssertionError):
                pass
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        t = threading.Thread(target=work, daemon=True)
        t.start()
        if hold is None:
            t.join(max(0.0, when - (time.monotonic() - t0)))
        else:
            sent_remember.wait(60)
            time.sleep(hold)
            when = time.monotonic() - t0
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
        t.join(5)
        err = m.proc.stderr.read().decode(errors="replace")
        check("Traceback" not in err, f"a traceback: {err[-500:]}")
        check(not errors, f"client errors: {errors}")
        return {"moment": moment, "after_s": round(when, 3), "unanswered": list(pending)}

    def verify(self, info: dict) -> dict:
        notes = self.bridges.store("memory") / "notes.md"
        text = notes.read_text() if notes.exists() else ""
        lines = text.splitlines()
        for note in self.notes:
            check(lines.count(f"- {note}") == 1, f"an answered note is lost or doubled: {note}")
        self.limbo |= set(info["unanswered"])
        allowed = {f"- {n}" for n in self.notes} | {f"- {n}" for n in self.limbo}
        stray = [ln for ln in lines if ln not in allowed]
        check(not stray, f"lines nobody wrote in the notes: {stray[:3]}")
        check(len(lines) == len(set(lines)), "a note written twice")
        self.notes = [ln[2:] for ln in lines]
        self.limbo -= set(self.notes)  # landed: from now on it must stay, once
        got = copy_store(self.bridges, self.base / "copy-check")
        if got:
            got[0].close()
        damaged = False
        idx = self.cache / "o1" / "a1" / "index"
        if (idx / "data.mdb").exists():
            with tempfile.TemporaryDirectory(dir=self.base) as tmp:
                shutil.copytree(idx, Path(tmp) / "index")
                store, damaged = open_checked(Path(tmp) / "index")
                vectors_ok(store)
                store.close()
        return {"damaged": damaged, "copy": bool(got)}

    def settle(self) -> dict:
        """Start once more, let it index and flush, end it: the copy must hold everything."""
        m = self.engine({"LNKMEM_WRITEBACK_S": "3600"})
        try:
            c = m.connect(timeout=60)
            check(c.first(self.bridges.bound()) == {"ok": True}, "bind failed at settle")
            deadline = time.monotonic() + 60
            while "indexing" in c.search("zz")["structuredContent"]:
                check(time.monotonic() < deadline, "indexing never finished")
                time.sleep(0.05)
            with m.connect(timeout=60) as ctl:
                check(ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "home"}}) == {"ok": True}, "changed")
            with m.connect(timeout=60) as ctl:
                check(ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}, "flush failed")
            c.close()
        finally:
            check(m.stop() == 0, "serve-many did not end cleanly")
        store, _ = copy_store(self.bridges, self.base / "copy-check")
        got = contents(store, versions=False)
        store.close()
        home = self.bridges.home()
        want_refs = {f"home/{p.relative_to(home).as_posix()}" for p in home.rglob("*") if p.is_file()
                     and not p.relative_to(home).as_posix().startswith("memory/lnkmem/")}
        want_refs |= {f"chats/{p.name}" for p in self.bridges.store("conversations").iterdir()}
        if (self.bridges.store("memory") / "notes.md").exists():
            want_refs.add("notes")
        check(set(got) == want_refs, f"the copy's refs differ: {sorted(set(got) ^ want_refs)[:5]}")
        # the same passages as a clean index of the same files, read locally
        from lnkmem.bridges.local import LocalPlace
        from lnkmem.memory.layout import Layout, NotesPlace
        from lnkmem.memory.memory import Memory
        from lnkmem.memory.notes import LocalNotes
        ref_state = self.base / "bound-reference"
        shutil.rmtree(ref_state, ignore_errors=True)
        places = {"home": LocalPlace(str(home), exclude=[str(home / "memory" / "lnkmem")]),
                  "chats": LocalPlace(str(self.bridges.store("conversations"))),
                  "notes": NotesPlace(LocalNotes(str(self.bridges.store("memory") / "notes.md"), str(ref_state)))}
        cfg = from_args(str(self.local.folder), str(ref_state), None, {})
        mem = Memory(cfg, Layout(places, None, 0, str(ref_state / "index"), tmpdir=str(ref_state / "tmp")))
        mem.store = mem.open_store()
        mem.refresh_all()
        want = contents(mem.store, versions=False)
        mem.store.close()
        bad = [r for r in want if got.get(r, (None, None, None))[1:] != want[r][1:]]
        check(not bad, f"the copy's passages differ for {bad[:5]}")
        puts = [json.loads(ln) for ln in (self.bridges.base / "storage.log").read_text().splitlines()]
        puts = [e for e in puts if e["method"] == "PUT" and e["path"].endswith("manifest.json")]
        check(all(e["if_match"] or e["if_none_match"] == "*" for e in puts), "an unconditional manifest write")
        return {"refs": len(got), "manifest_writes": len(puts), "conflicts": sum(e["status"] == 412 for e in puts)}


# --- kills at scale: a large write-back and a cold load (issue 33) -----------------------------

_BLOB = re.compile(r"[A-Za-z0-9_./-]+-[0-9a-f]{16,}(-[0-9]+)?(\.[A-Za-z0-9]+)?")  # a size after the hash (copy-4)


def named(manifest: bytes) -> set:
    """The files a copy's manifest names: every string in it (keys too) that is a
    content-addressed name -- read without knowing the manifest's layout."""
    found: set = set()

    def walk(x) -> None:
        if isinstance(x, str):
            if _BLOB.fullmatch(x):
                found.add(x)
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(k)
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(json.loads(manifest))
    return found


def bucket(bridges: Bridges) -> tuple[bytes | None, set]:
    """(the manifest's bytes or None, every other file of the copy) in the storage bridge."""
    d = bridges.store("memory") / "lnkmem"
    files = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()} if d.exists() else set()
    man = d / "manifest.json"
    return (man.read_bytes() if man.exists() else None), files - {"manifest.json"}


class Scale:
    """`serve-many` bound to a Home of ``bench/corpus.py`` files (``scale``), killed while
    it writes back a large index, or while it loads the copy into an empty cache."""

    def __init__(self, base: Path, rng: random.Random, scale: float = 0.1, say=print):
        import importlib.util
        self.base, self.rng, self.say = base, rng, say
        self.bridges = Bridges(base / "scale-link", bindings={"a1": {"owner": "o1", "key": KEY}})
        spec = importlib.util.spec_from_file_location("lnkmem_bench_corpus", HERE / "corpus.py")
        corpus = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(corpus)
        out = base / "scale-corpus"
        corpus.generate(str(out), scale=scale, seed=7, log=lambda *a: None)
        home = self.bridges.home()
        shutil.copytree(out / "home", home, dirs_exist_ok=True)
        self.cache = base / "scale-cache"
        self.t_write = self.t_cold = 10.0  # measured by the first settles
        self.changes = 0

    def want(self) -> set:
        home = self.bridges.home()
        return {f"home/{p.relative_to(home).as_posix()}" for p in home.rglob("*") if p.is_file()
                and not p.relative_to(home).as_posix().startswith("memory/")}

    def engine(self, env: dict | None = None) -> Many:
        e = {"LNKMEM_WRITEBACK_S": "1", "LNKMEM_QUIET_S": "0.3"}
        e.update(env or {})
        return Many(self.base / "scale-run" / "m.sock", {}, self.bridges.flags() + ["--cache", str(self.cache)], env=e)

    def mutate(self) -> None:
        home = self.bridges.home()
        files = sorted(p for p in home.rglob("*.md"))
        for p in self.rng.sample(files, min(len(files), self.rng.randint(5, 200))):
            self.changes += 1
            with open(p, "a") as f:
                f.write(f"\n\nchange {self.changes}: " + " ".join(self.rng.choice(WORDS) for _ in range(30)) + "\n")

    def run(self, k: int, cold: bool) -> dict:
        """One run killed at a random moment: of a write-back (after files changed), or of a
        cold load (an empty cache, the copy in the bucket)."""
        if cold:
            shutil.rmtree(self.cache, ignore_errors=True)
        else:
            self.mutate()
        self.bridges.storage.request("DELETE", "/_log")
        when = self.rng.uniform(0.2, 1.2 * (self.t_cold if cold else self.t_write))
        m = self.engine()
        t0 = time.monotonic()
        try:
            c = m.connect(timeout=10)
            check(c.first(self.bridges.bound()) == {"ok": True}, "bind failed")
            if not cold:
                with m.connect(timeout=10) as ctl:
                    ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "home"}})
            if not cold and k % 4 == 0:
                # aimed: the bridge holds the manifest's PUT 3 s (it lands after the kill, as a
                # request a real bridge received does); killed within 0.5 s of the first blob PUT
                self.bridges.storage.fault("slow", delay=3.0, count=1, path="/v1/c/memory/lnkmem/manifest.json")
                deadline = time.monotonic() + 3 * self.t_write
                while time.monotonic() < deadline and not any(
                        e["method"] == "PUT" and "/lnkmem/" in e["path"] for e in self.bridges.storage.log()):
                    time.sleep(0.02)
                when = time.monotonic() - t0 + self.rng.uniform(0.0, 0.5)
            time.sleep(max(0.0, when - (time.monotonic() - t0)))
        except (OSError, EOFError, ValueError):
            pass
        m.proc.send_signal(signal.SIGKILL)
        m.proc.wait()
        err = m.proc.stderr.read().decode(errors="replace")
        check("Traceback" not in err, f"a traceback: {err[-500:]}")
        self.bridges.storage.fault("ok")
        time.sleep(3.2 if not cold and k % 4 == 0 else 0)  # a held manifest lands (or not) first
        log = self.bridges.storage.log()
        lnk = [e for e in log if "/lnkmem/" in e["path"]]
        puts = [e for e in lnk if e["method"] == "PUT"]
        if puts and any(e.get("fault") == "slow" for e in puts):
            moment = "write-back, its manifest landing after the kill"
        elif puts and not puts[-1]["path"].endswith("manifest.json"):
            moment = "write-back, before its manifest"  # blobs sent, the manifest not
        elif puts:
            moment = "after a write-back"
        elif any(e["method"] == "GET" and not e["path"].endswith("manifest.json") for e in lnk):
            moment = "cold load"
        else:
            moment = "indexing" if not cold else "bind"
        return {"moment": moment, "after_s": round(when, 2), "cold": cold}

    def verify(self) -> dict:
        """After a kill: the copy in the bucket is one whole version (all it names is there);
        files it does not name may wait for the next write-back (counted)."""
        manifest, files = bucket(self.bridges)
        if manifest is None:
            return {"copy": False, "orphans": len(files)}
        names = named(manifest)
        missing = names - files
        check(not missing, f"the manifest names files that are not there: {sorted(missing)[:3]}")
        idx = self.cache / "o1" / "a1" / "index"
        damaged = False
        if (idx / "data.mdb").exists():
            with tempfile.TemporaryDirectory(dir=self.base) as tmp:
                shutil.copytree(idx, Path(tmp) / "index")
                store, damaged = open_checked(Path(tmp) / "index")
                store.close()
        return {"copy": True, "orphans": len(files - names), "damaged": damaged}

    def settle(self, cold: bool = False) -> dict:
        """Start (an empty cache when ``cold``), serve every file, flush, end cleanly; then the
        bucket holds one copy and nothing else, and the cache every file of Home."""
        if cold:
            shutil.rmtree(self.cache, ignore_errors=True)
        m = self.engine({"LNKMEM_WRITEBACK_S": "3600"})
        t0 = time.monotonic()
        try:
            c = m.connect(timeout=60)
            check(c.first(self.bridges.bound()) == {"ok": True}, "bind failed at settle")
            deadline = time.monotonic() + 600
            while "indexing" in c.search("zz")["structuredContent"]:
                check(time.monotonic() < deadline, "indexing never finished")
                time.sleep(0.1)
            ready = time.monotonic() - t0
            with m.connect(timeout=60) as ctl:
                check(ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}, "flush failed")
            took = time.monotonic() - t0
            c.close()
        finally:
            rc = m.stop()
        err = m.proc.stderr.read().decode(errors="replace")
        check(rc == 0, f"serve-many did not end cleanly ({rc}): {err[-300:]}")
        check("Traceback" not in err, f"a traceback: {err[-500:]}")
        if cold:
            check("damaged" not in err, f"the copy was called damaged at a cold load: {err[-300:]}")
            self.t_cold = ready
        else:
            self.t_write = took
        store = Store(str(self.cache / "o1" / "a1" / "index"))
        served = {r for r in store.all_files() if r.startswith("home/")}
        store.close()
        want = self.want()
        check(served == want, f"the index does not serve every file: {sorted(served ^ want)[:5]}")
        manifest, files = bucket(self.bridges)
        check(manifest is not None, "no copy after a flush")
        names = named(manifest)
        check(names <= files, f"the manifest names files that are not there: {sorted(names - files)[:3]}")
        orphans = files - names
        check(not orphans, f"{len(orphans)} files of the bucket no manifest names: {sorted(orphans)[:3]}")
        return {"files": len(served), "copy_files": len(names), "seconds": round(took, 1)}


def run_scale(kills: int, seed: int, base: Path, scale: float, say=print) -> dict:
    """Kills of `serve-many` during a large write-back and a cold load, alternating; settled
    (warm, then cold) every fourth kill and at the end."""
    rng = random.Random(seed)
    figures = {"kills": 0, "moments": {}, "settles": 0, "orphans_after_kill_max": 0, "damaged_detected": 0,
               "failures": [], "files": 0, "copy_files": 0}
    t0 = time.monotonic()
    sc = Scale(base, rng, scale, say)
    try:
        first = sc.settle()  # the copy made: the write-back's length measured
        figures["files"] = first["files"]
        sc.settle(cold=True)  # the cold load's length measured
        say(f"scale {scale}: {first['files']} files; write-back run {sc.t_write:.1f}s, cold load {sc.t_cold:.1f}s")
        for k in range(kills):
            cold = k % 2 == 1
            try:
                info = sc.run(k, cold)
                res = sc.verify()
                figures["kills"] += 1
                figures["orphans_after_kill_max"] = max(figures["orphans_after_kill_max"], res["orphans"])
                figures["damaged_detected"] += bool(res.get("damaged"))
                key = f"{'cold' if cold else 'write'}:{info['moment']}"
                figures["moments"][key] = figures["moments"].get(key, 0) + 1
                if k % 4 == 3 or k == kills - 1:
                    figures["settles"] += 1
                    got = sc.settle()
                    figures["copy_files"] = got["copy_files"]
                    sc.settle(cold=True)
            except Failure as e:
                figures["failures"].append(f"scale kill {k}: {e}")
                say(f"FAIL scale kill {k}: {e}")
    finally:
        sc.bridges.stop()
    figures["seconds"] = round(time.monotonic() - t0, 1)
    return figures


# --- the loop ---------------------------------------------------------------------------

def run(kills: int = 200, seed: int = 7, base: Path | None = None, say=print) -> dict:
    rng = random.Random(seed)
    own = base is None
    base = Path(tempfile.mkdtemp(prefix="lnkmem-kills-")) if own else base
    model = FakeServer.start("fakes.embedding_server", "--unix", base / "model.sock", "--model", "fake-mini")
    local, bound = Local(base, rng, model), Bound(base, rng)
    figures = {"kills": 0, "local": 0, "bound": 0, "damaged_detected": 0, "settles": 0, "notes_answered": 0,
               "moments": {}, "remember_in_flight": 0, "while_indexing": 0, "fresh_index_runs": 0, "temp_notes_left": 0, "lost": 0,
               "failures": []}
    t0 = time.monotonic()
    try:
        for k in range(kills):
            kind = "local" if k % 2 == 0 else "bound"
            try:
                if kind == "local":
                    info = local.run(k)
                    res = local.verify(info)
                    info["moment"] = "indexing" if info["indexing"] else ("embedding" if res["unembedded"] else "serving")
                    figures["while_indexing"] += info["indexing"]
                    figures["fresh_index_runs"] += info["fresh"]
                    figures["temp_notes_left"] += res["temp_notes_left"]
                else:
                    info = bound.run(k)
                    res = bound.verify(info)
                    if (k // 2) % 10 == 9 or k >= kills - 2:
                        figures["settles"] += 1
                        res.update(bound.settle())
                figures[kind] += 1
                figures["kills"] += 1
                figures["remember_in_flight"] += bool(info["unanswered"])
                figures["damaged_detected"] += res["damaged"]
                key = f"{kind}:{info['moment']}"
                figures["moments"][key] = figures["moments"].get(key, 0) + 1
            except Failure as e:
                figures["failures"].append(f"kill {k} ({kind}): {e}")
                figures["lost"] += 1
                say(f"FAIL kill {k} ({kind}): {e}")
            if (k + 1) % 20 == 0:
                say(f"{k + 1} kills, {len(figures['failures'])} failures, {time.monotonic() - t0:.0f}s")
        figures["notes_answered"] = len(local.notes) + len(bound.notes)
    finally:
        model.stop()
        bound.bridges.stop()
        if own:
            shutil.rmtree(base, ignore_errors=True)
    figures["seconds"] = round(time.monotonic() - t0, 1)
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--scale-kills", type=int, default=0,
                    help="then this many kills of a large write-back and of a cold load (issue 33)")
    ap.add_argument("--scale", type=float, default=0.1, help="the corpus scale of those runs (bench/corpus.py)")
    args = ap.parse_args()
    figures = run(args.kills, args.seed) if args.kills else {"failures": []}
    if args.scale_kills:
        base = Path(tempfile.mkdtemp(prefix="lnkmem-kills-scale-"))
        try:
            figures["scale"] = run_scale(args.scale_kills, args.seed, base, args.scale)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        figures["failures"] = figures["failures"] + figures["scale"]["failures"]
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 1 if figures["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
