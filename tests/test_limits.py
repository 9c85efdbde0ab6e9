"""Issue 34: one long name, one deep folder or one truncated file never takes a memory down.

A ref as long as a file system allows (4,096 bytes of path), an identifier longer than
LMDB's key limit, a folder chain 1,500 deep, `data.mdb` truncated below its meta pages
while serving. Every test drives the real `lnk-lnkmem` over its real pipes or socket,
over real LMDB files.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import zlib
from pathlib import Path

import msgspec
import pytest

from tests.bridges import Bridges
from tests.helpers import Home, Many, Server, agent_entry, refs, run_cli, until

PATH_MAX = 4096
NAME_MAX = 255


def _hits(c, query: str, **kw) -> list:
    r = c.search(query, limit=50, **kw)
    assert not r.get("isError"), r
    return refs(r)


def _long_rel(root: Path, total: int, leaf: str) -> str:
    """A path below ``root`` whose whole path (``root`` included) is ``total`` bytes:
    folders of up to 200 bytes, then ``leaf``."""
    room = total - len(os.fsencode(root)) - 1 - len(leaf)
    parts = []
    while room > 0:
        n = min(200, room - 1) if room > 1 else 0
        if n <= 0:
            break
        parts.append(chr(ord("a") + len(parts) % 26) * n)
        room -= n + 1
    rel = "/".join(parts + [leaf])
    return rel


def _make(root: Path, rel: str, text: str) -> None:
    """Write ``root/rel`` (longer than a path the process may name at once is fine:
    made through folder descriptors)."""
    parts = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for p in parts[:-1]:
            try:
                os.mkdir(p, dir_fd=fd)
            except FileExistsError:
                pass
            nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        f = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=fd)
        try:
            os.write(f, text.encode())
        finally:
            os.close(f)
    finally:
        os.close(fd)


# --- 1. refs of any length a file system allows --------------------------------------


def test_refs_over_lmdbs_key_limit_are_indexed_searched_read_and_listed(home):
    for i in range(30):
        home.write(f"plain/p{i:02}.md", f"The ocelot number {i} naps.\n")
    medium = "m/" + _long_rel(home.folder, 520 + len(os.fsencode(home.folder)), "medium.md")  # a ref of ~530 bytes
    longest = _long_rel(home.folder, PATH_MAX - 1, "longest.md")  # the longest path the kernel takes
    assert len(os.fsencode(home.folder / longest)) == PATH_MAX - 1
    _make(home.folder, medium, "The quetzal flies over the medium path.\n")
    _make(home.folder, longest, "The quetzal hides at the end of the longest path.\nsecond line\n")
    # an identifier whose key (segment and term) is over LMDB's 511 bytes: 128 letters of 4 bytes
    ident = "\U00020000" * 64 + "-" + "\U00020001" * 63
    home.write("ident.md", f"The capybara wrote {ident} once.\n")
    m_ref, l_ref = "home/" + medium, "home/" + longest
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed(timeout=60)
        assert len(_hits(s, "ocelot")) == 30
        assert sorted(_hits(s, "quetzal")) == sorted([m_ref, l_ref])
        assert _hits(s, "capybara") == ["home/ident.md"]
        r = s.call("read", {"ref": l_ref})
        assert not r.get("isError"), r
        assert r["structuredContent"]["text"].startswith("The quetzal hides")
        folder = l_ref.rsplit("/", 1)[0]
        r = s.call("list", {"ref": folder})
        assert [e["ref"] for e in r["structuredContent"]["entries"]] == [l_ref]
        assert _hits(s, "quetzal", under=folder) == [l_ref]
        assert _hits(s, "quetzal", under=m_ref.rsplit("/", 1)[0]) == [m_ref]
        # an edit of the long one replaces its passages; its removal removes them
        _make(home.folder, longest, "The quetzal moved. A tapir came.\n")
        assert until(lambda: _hits(s, "tapir") == [l_ref], timeout=20)
        assert sorted(_hits(s, "quetzal")) == sorted([m_ref, l_ref])
        s.close()
        assert s.proc.returncode == 0, s.stderr[-2000:]
    assert b"Traceback" not in s.stderr and b"indexing failed" not in s.stderr, s.stderr[-2000:]
    # a restart: the long refs' records are found again (not indexed anew, not lost)
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed(timeout=60)
        assert sorted(_hits(s, "quetzal")) == sorted([m_ref, l_ref])
        assert _hits(s, "tapir") == [l_ref]
        fd = os.open(home.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:  # (the whole path is too long to unlink by name from here)
            parent, leaf = longest.rsplit("/", 1)
            pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd) if len(parent) < PATH_MAX else None
        finally:
            os.close(fd)
        os.unlink(leaf, dir_fd=pfd)
        os.close(pfd)
        assert until(lambda: _hits(s, "quetzal") == [m_ref], timeout=20)
        assert _hits(s, "tapir") == []
        assert len(_hits(s, "ocelot")) == 30


def test_a_long_ref_is_written_into_the_copy_and_loaded_from_it(tmp_path):
    b = Bridges(tmp_path / "link")
    try:
        rel = "/".join(["q" * 200, "r" * 200, "s" * 150, "long.md"])  # a ref of ~570 bytes
        b.write_home(rel, "The axolotl lives at the end of a long ref.\n")
        b.write_home("short.md", "The axolotl also lives here.\n")
        ref = "home/" + rel
        with b.serve_many(tmp_path, "one") as m, m.connect() as c:
            assert c.first(b.bound()) == {"ok": True}
            assert until(lambda: sorted(refs(c.search("axolotl"))) == sorted([ref, "home/short.md"]), timeout=20)
            with m.connect() as ctl:
                assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        assert ref in b.copy_refs()
        b.storage.request("DELETE", "/_log")
        with b.serve_many(tmp_path, "two") as m, m.connect() as c:  # another cache: loaded from the copy
            assert c.first(b.bound()) == {"ok": True}
            assert until(lambda: sorted(refs(c.search("axolotl"))) == sorted([ref, "home/short.md"]), timeout=20)
            got = b.storage.log()
            assert any("/seg-" in e["path"] and e["method"] == "GET" for e in got), got
            assert c.call("read", {"ref": ref})["structuredContent"]["text"].startswith("The axolotl lives")
            assert m.proc.poll() is None
        assert b"Traceback" not in m.proc.stderr.read()
    finally:
        b.stop()


def test_a_file_the_store_refuses_is_left_out_never_the_batch(tmp_path):
    """One file of a batch that the store cannot take (here its passages and its
    postings disagree, the store's own check) is reported and left out; the other files
    of the batch are committed, and its record stays as it was."""
    import random
    from lnkmem.index.build import indexer
    from lnkmem.index.commit import Batch, NewFile
    from lnkmem.index.format import Passage
    from lnkmem.index.store import Store
    from tests.helpers import random_file
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta"]
    store = Store.open(str(tmp_path / "index"))
    try:
        store.commit(Batch([random_file(rng, "home/bad.md", "v1", words, 2)]))
        b = indexer.Build(store, 3, [], None)
        good = [random_file(rng, f"home/g{i}.md", "v1", words) for i in range(2)]
        bad = NewFile("home/bad.md", "v2", 10, "text", [Passage("home/bad.md", 1, 1, "alpha")], [({"alpha": 1}, 1)] * 2)
        b.commit_batch(Batch([good[0], bad, good[1]]))
        assert b.failed == 1
        held = store.file_versions()
        assert held == {"home/g0.md": ("v1", 10), "home/g1.md": ("v1", 10), "home/bad.md": ("v1", 10)}
    finally:
        store.close()


# --- 2. trees of any depth --------------------------------------------------------------

DEPTH = 1500


def _deep(root: Path, depth: int, every: int, word: str) -> list[str]:
    """A chain of ``depth`` folders ``d`` below ``root``, a file every ``every`` levels;
    their refs (made through descriptors: the chain is longer than a path may be)."""
    out = []
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(1, depth + 1):
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if level % every == 0:
                name = f"f{level}.md"
                f = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
                os.write(f, f"The {word} at level {level}.\n".encode())
                os.close(f)
                out.append("home/" + "d/" * level + name)
    finally:
        os.close(fd)
    return out


def _undeep(root: Path) -> None:
    """Remove the chain of ``d`` folders below ``root`` (shutil.rmtree recurses: pytest's
    clean-up could not): each time the top folder's own ``d`` is moved up beside it and
    the emptied top removed."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while "d" in os.listdir(top):
            fd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=top)
            try:
                for name in os.listdir(fd):
                    if name == "d":
                        os.rename("d", "d.next", src_dir_fd=fd, dst_dir_fd=top)
                    else:
                        os.unlink(name, dir_fd=fd)
            finally:
                os.close(fd)
            os.rmdir("d", dir_fd=top)
            if "d.next" in os.listdir(top):
                os.rename("d.next", "d", src_dir_fd=top, dst_dir_fd=top)
    finally:
        os.close(top)


@pytest.fixture
def deep_home(home):
    yield home
    _undeep(home.folder)


@pytest.mark.parametrize("watcher", ["watchfiles", "inotify"])
def test_a_folder_chain_1500_deep_is_walked_listed_read_and_watched(deep_home, watcher):
    home = deep_home
    deep = _deep(home.folder, DEPTH, 30, "okapi")
    assert len(deep) == 50
    home.write("top.md", "The okapi on top.\n")
    with Server.start(home, env={"LNKMEM_LOG": "info"}) as s:
        s.initialize()
        s.wait_indexed(timeout=120)
        got = set()  # (a search's ignore check looks at every folder above a hit: ~0.5 s at 1,500)
        for level in (30, 300, 630, 990, 1320, DEPTH):
            got.update(_hits(s, f"okapi level {level}")[:1])
        assert got == {r for r in deep if int(r.rsplit("f", 1)[1][:-3]) in (30, 300, 630, 990, 1320, DEPTH)}
        if watcher == "inotify":  # a name that is not UTF-8 changed in Home: the engine watches with inotify itself
            with open(os.fsencode(home.folder) + b"/odd\xff.md", "wb") as f:
                f.write(b"The odd name.\n")
            assert until(lambda: b"watching with inotify" in s.stderr, timeout=30), s.stderr[-2000:]
        last = deep[-1]
        assert s.call("read", {"ref": last})["structuredContent"]["text"] == f"The okapi at level {DEPTH}."
        folder = last.rsplit("/", 1)[0]
        assert [e["ref"] for e in s.call("list", {"ref": folder})["structuredContent"]["entries"]] == [last]
        assert _hits(s, "okapi", under=folder + "/") == [last]
        # a file added at the bottom while serving is found
        fd = os.open(home.folder, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(DEPTH):
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        f = os.open("late.md", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(f, b"The wombat came late.\n")
        os.close(f)
        os.close(fd)
        assert until(lambda: _hits(s, "wombat") == [folder + "/late.md"], timeout=30)
        s.close()
        assert s.proc.returncode == 0, s.stderr[-3000:]
    assert b"recursion" not in s.stderr and b"Traceback" not in s.stderr, s.stderr[-3000:]
    # the people's `index` walks it too
    r = run_cli("index", str(home.folder), str(home.state), "--agent", str(home.agent))
    assert r.returncode == 0 and b"recursion" not in r.stderr, r.stderr[-2000:]
    r = run_cli("status", str(home.folder), str(home.state), "--agent", str(home.agent), "--json")
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-2000:]
    assert json.loads(r.stdout)
    if watcher == "watchfiles":  # under 64 descriptors: a walk holds a few, not one a level
        import resource
        import subprocess
        from tests.helpers import PROGRAM, base_env
        r = subprocess.run([PROGRAM, "index", str(home.folder), str(home.base / "state64"), "--agent", str(home.agent)],
                           capture_output=True, env=base_env(), timeout=120,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)))
        assert r.returncode == 0 and b"indexed 52 files" in r.stderr and b"skipped 0" in r.stderr, r.stderr[-2000:]


# --- 3. data.mdb truncated below its meta pages while serving ------------------------


def _pangolins(home: Home, n: int = 20) -> None:
    for i in range(n):
        home.write(f"notes/n{i:03}.md", f"The pangolin note {i}. " + " ".join(f"w{i}x{j}" for j in range(40)) + "\n")


def _hits_or_none(c, query: str):
    r = c.search(query, limit=50)
    return None if r.get("isError") else refs(r)


def _init(c) -> None:
    c.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "t", "version": "0"}})


@pytest.mark.parametrize("size", [0, 100, 4096, 8191])
def test_data_mdb_truncated_below_its_meta_pages_never_ends_another_agents_sessions(tmp_path, size):
    """serve-many (a child of the test: a SIGBUS is its death, never the suite's) with two
    agents; b's data.mdb is cut to ``size`` bytes while b and a are searched without a
    pause: the process lives, a is answered throughout, b's calls fail and then b is
    rebuilt and answers again."""
    a, b = Home(tmp_path / "a"), Home(tmp_path / "b")
    a.write("a.md", "The aardvark digs.\n")
    _pangolins(b)
    sock = tmp_path / "run" / "s.sock"
    with Many(sock, {"a": agent_entry(a), "b": agent_entry(b)}, ["--stay"]) as m:
        with m.hello("a") as ca, m.hello("b") as cb:
            _init(ca)
            _init(cb)
            assert until(lambda: refs(ca.search("aardvark")) == ["home/a.md"], timeout=30)
            assert until(lambda: len(_hits_or_none(cb, "pangolin") or ()) == 20, timeout=30)
            stop = threading.Event()
            errors: list = []
            searched = [0]

            def hammer():  # b searched without a pause while its file is cut
                try:
                    with m.hello("b") as c2:
                        _init(c2)
                        while not stop.is_set():
                            c2.search("pangolin w3x7")
                            searched[0] += 1
                except Exception as e:  # (the process died under it)
                    errors.append(e)

            t = threading.Thread(target=hammer)
            t.start()
            assert until(lambda: searched[0] >= 3 or errors, timeout=30)  # searching before the cut
            cut = searched[0]
            os.truncate(b.state / "index" / "data.mdb", size)
            assert until(lambda: searched[0] >= cut + 10 or errors, timeout=30)  # ... and after it
            stop.set()
            t.join(30)
            assert m.proc.poll() is None, (m.proc.returncode, m.proc.stderr.read()[-3000:])
            assert not errors, errors
            assert refs(ca.search("aardvark")) == ["home/a.md"]
            assert until(lambda: len(_hits_or_none(cb, "pangolin") or ()) == 20, timeout=30)
            assert refs(ca.search("aardvark")) == ["home/a.md"]
        assert m.proc.poll() is None
    assert m.proc.returncode == 0


_CUT_UNDER_A_READ = r"""
import json, os, random, sys
from lnkmem.index.commit import Batch
from lnkmem.index.store import Store
from lnkmem.core.errors import DamagedIndex
from tests.helpers import random_file
path, size = sys.argv[1], int(sys.argv[2])
rng = random.Random(5)
store = Store.open(path)
store.commit(Batch([random_file(rng, f"home/f{i}.md", "v1", [f"w{j}" for j in range(300)], 6, (50, 80))
                    for i in range(400)]))
read = 0
with store.env.begin() as txn:
    cur = txn.cursor(db=store.passages)
    cur.first()
    os.truncate(os.path.join(path, "data.mdb"), size)  # cut under a read already past every check
    for k, v in cur:
        read += 1
faulted = store.env.faulted()
try:
    store.file_count()
    after = "answered"
except DamagedIndex as e:
    after = str(e)
store.close()
print(json.dumps({"read": read, "faulted": faulted, "after": after}))
"""


@pytest.mark.parametrize("size", [0, 4096, 8191, 40960])
def test_a_cut_under_a_read_is_caught_not_a_sigbus(tmp_path, size):
    """The race no check can close: data.mdb cut after the store's checks, while a read
    goes through the map. In a child (a SIGBUS ends it, not the suite): the read ends,
    the store says its index is damaged, the process goes on."""
    import subprocess
    import sys
    from tests.helpers import ROOT, base_env
    r = subprocess.run([sys.executable, "-c", _CUT_UNDER_A_READ, str(tmp_path / "index"), str(size)],
                       capture_output=True, env=base_env(), cwd=ROOT, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    out = json.loads(r.stdout)
    assert out["faulted"] and "cut short" in out["after"], out


_CUT_BETWEEN_SEARCHES = r"""
import json, os, random, sys, time
from lnkmem.index.commit import Batch
from lnkmem.index.rank.search import bm25
from lnkmem.index.store import Store
from lnkmem.core.errors import DamagedIndex
from tests.helpers import random_file
path = sys.argv[1]
rng = random.Random(7)
store = Store.open(path)
store.commit(Batch([random_file(rng, f"home/f{i}.md", "v1", [f"w{j}" for j in range(300)], 6, (50, 80))
                    for i in range(400)]))
assert bm25(store, "w3 w7", 10)
os.truncate(os.path.join(path, "data.mdb"), 8192)  # between two searches: every page but the metas gone
searches, why, deadline = 0, None, time.monotonic() + 60
while why is None and time.monotonic() < deadline:
    searches += 1
    try:
        bm25(store, "w3 w7", 10)
    except DamagedIndex as e:
        why = str(e)
print(json.dumps({"watched": store.env.watch is not None, "searches": searches, "why": why}))
store.close()
"""


@pytest.mark.parametrize("mapguard", [True, False])
def test_a_file_cut_between_searches_is_found_by_the_searches(tmp_path, mapguard):
    """data.mdb cut between two searches (in a child: a SIGBUS ends it, not the suite). A
    search's guard looks at the file's size at most every guard.SIZE_EVERY_S where a cut under
    a read is caught anyway (the map watched): the searches after the cut are refused, the
    index damaged, the process alive. Where the map is not watched (LNKMEM_NO_MAPGUARD) the
    very first search after the cut is refused by the size, before any read of the map."""
    import subprocess
    import sys
    from tests.helpers import ROOT, base_env
    env = base_env()
    if not mapguard:
        env["LNKMEM_NO_MAPGUARD"] = "1"
    r = subprocess.run([sys.executable, "-c", _CUT_BETWEEN_SEARCHES, str(tmp_path / "index")],
                       capture_output=True, env=env, cwd=ROOT, timeout=180)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    out = json.loads(r.stdout)
    assert out["watched"] is mapguard and out["why"] is not None, out
    assert "data.mdb" in out["why"], out
    if not mapguard:
        assert out["searches"] == 1 and "holds 8192 bytes" in out["why"], out


# --- 4. single bit flips in data.mdb ----------------------------------------------------


@pytest.mark.parametrize("table", ["postings", "passages", "files"])
def test_bit_flips_in_stored_values_are_found_not_served(tmp_path, table):
    """A bit flipped in a stored value (LMDB keeps no page checksum): in a posting list
    other passages matched, or none; in a passage its text changed; in a file record its
    times or kind. Nothing noticed. Each flip here (one at a time, on a copy of an index
    closed whole, the file's mtime moved by the write) must be found at the next start
    and the index rebuilt: every answer is the clean index's."""
    import shutil
    import lmdb
    home = Home(tmp_path / "h")
    for i in range(90):  # the word in two files of three, 1-4 times: a list of uneven gaps and tfs
        word = " ".join(["pangolin"] * (1 + i % 4)) if i % 3 else "aardvark"
        home.write(f"notes/n{i:03}.md", f"The {word} note {i}. " + " ".join(f"w{i}x{j}" for j in range(30)) + "\n")
    r = run_cli("index", str(home.folder), str(home.state), "--agent", str(home.agent))
    assert r.returncode == 0, r.stderr
    index = home.state / "index"

    def answers(s):
        return [s.search("pangolin", limit=50)["structuredContent"], s.search("w7x3")["structuredContent"],
                s.search("note", limit=50, after="2000-01-01")["structuredContent"]]

    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        clean = answers(s)
        s.close()
    assert len(clean[0]["hits"]) == 50
    env = lmdb.open(str(index), readonly=True, lock=False, max_dbs=16)
    with env.begin() as txn:
        db = env.open_db(table.encode(), txn=txn, create=False)
        values = [bytes(v) for k, v in txn.cursor(db=db) if table != "postings" or k[4:] == b"pangolin"]
    env.close()
    data = (index / "data.mdb").read_bytes()
    value = max((v for v in values if data.count(v) == 1), key=len)
    at = data.find(value)
    assert at > 0 and len(value) > 20
    kept = tmp_path / "kept"
    shutil.copytree(index, kept)
    for bit in range(8, len(value) * 8, max(1, len(value) * 8 // 6)):  # 6 flips across the value
        shutil.rmtree(index)
        shutil.copytree(kept, index)
        flipped = bytearray(data)
        flipped[at + bit // 8] ^= 1 << (bit % 8)
        (index / "data.mdb").write_bytes(flipped)
        with Server.start(home) as s:
            s.initialize()
            s.wait_indexed()
            assert answers(s) == clean, f"a flip of bit {bit} of a {table} value was served"
