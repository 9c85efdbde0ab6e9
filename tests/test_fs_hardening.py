"""The filesystem as hostile input (issue 11; §3.2, §4.2, §7.1 rev. 2).

Names that are not UTF-8, files swapped for links while they are read, a
damaged `data.mdb`, Home files over 4 MiB, temp files left by kills, and
passage ids that must follow live data rather than edits. Every test drives
the real `lnk-lnkmem` over its real pipes or socket.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import Home, Many, Server, agent_entry, refs, until

OUTSIDE = "OUTSIDETEXT-91c2"


def _bad(p: Path, name: bytes) -> bytes:
    """The byte path of ``name`` under ``p`` (a name Python cannot spell in UTF-8)."""
    return os.fsencode(p) + b"/" + name


# --- 1. names that are not UTF-8 ---------------------------------------------------


def _odd_names(home: Home) -> None:
    for i in range(20):
        home.write(f"good{i:02}.md", f"The quokka number {i} smiles.\n")
    for name in (b"bad\xff.md", b"caf\xe9.md", b"\xc3\x28.txt"):
        with open(_bad(home.folder, name), "wb") as f:
            f.write(b"The quokka hides in a bad name.\n")
    os.mkdir(_bad(home.folder, b"dir\xfe"))
    with open(_bad(home.folder, b"dir\xfe/inner.md"), "wb") as f:
        f.write(b"The quokka hides in a bad folder.\n")
    os.mkdir(_bad(home.folder, b"sub"))
    with open(_bad(home.folder, b"sub/ok.md"), "wb") as f:
        f.write(b"The quokka in sub is fine.\n")
    with open(_bad(home.folder, b"sub/x\x80y.md"), "wb") as f:
        f.write(b"The quokka x y.\n")
    with open(_bad(home.agent / "chats", b"t\xff.jsonl"), "wb") as f:
        f.write(b'{"role": "user", "text": "quokka in a chat with a bad name"}\n')
    home.chat("good", [{"role": "user", "text": "the quokka chat is fine"}])


def test_names_not_utf8_are_skipped_and_counted_never_fatal(home):
    _odd_names(home)
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed(timeout=30)
        got = set(refs(s.search("quokka", limit=50)))
        want = {f"home/good{i:02}.md" for i in range(20)} | {"home/sub/ok.md", "chats/good.jsonl"}
        assert got == want
        # list of a folder holding odd names answers, without them
        listed = s.call("list", {"ref": "home"})
        assert not listed.get("isError"), listed
        names = {e["ref"] for e in listed["structuredContent"]["entries"]}
        assert {"home/good00.md", "home/sub"} <= names and len(names) == 21
        sub = s.call("list", {"ref": "home/sub"})
        assert [e["ref"] for e in sub["structuredContent"]["entries"]] == ["home/sub/ok.md"]
        chats_ = s.call("list", {"ref": "chats"})
        assert [e["ref"] for e in chats_["structuredContent"]["entries"]] == ["chats/good.jsonl"]
        # the watcher goes on: a new odd name, then a good file, both while serving
        with open(_bad(home.folder, b"later\xff.md"), "wb") as f:
            f.write(b"The wombat hides.\n")
        os.mkdir(_bad(home.folder, b"new\xfe"))
        home.write("later.md", "The wombat is found.\n")
        assert until(lambda: refs(s.search("wombat")) == ["home/later.md"], timeout=10)
        home.write("fresh/deep/x.md", "The dingo in a new folder.\n")  # a folder made while watching
        home.write("good03.md", "The quokka number 3 now sings.\n")  # a file changed
        with open(_bad(home.folder, b"new\xfe/inner.md"), "wb") as f:
            f.write(b"The dingo hides in a bad folder.\n")
        assert until(lambda: refs(s.search("dingo")) == ["home/fresh/deep/x.md"], timeout=10)
        assert until(lambda: refs(s.search("sings")) == ["home/good03.md"], timeout=10)
        assert s.proc.poll() is None


# --- 2. links swapped in while reading ---------------------------------------------


def _swapper(folder: Path, name: str, target: Path, inside: bytes, stop: threading.Event) -> threading.Thread:
    """Swap ``folder/name`` between a file and a link to ``target``, atomically, until stopped."""

    def run():
        link, real = folder / ".swap-link", folder / ".swap-real"
        while not stop.is_set():
            try:
                os.symlink(target, link)
                os.rename(link, folder / name)
                real.write_bytes(inside)
                os.rename(real, folder / name)
            except OSError:
                pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _reads(s, ref: str, n: int) -> list[dict]:
    """``n`` reads of ``ref`` sent at once, their answers."""
    ids = []
    for _ in range(n):
        i = next(s.ids)
        ids.append(i)
        s.send({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": "read", "arguments": {"ref": ref}}})
    return [s.response(i, timeout=60) for i in ids]


def test_a_file_swapped_for_a_link_outside_is_never_read(home, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{OUTSIDE} beyond Home\n")
    docs = home.folder / "docs"
    home.write("docs/f.md", "The quokka inside.\n")
    home.write("docs/g.md", "The numbat inside.\n")
    stop = threading.Event()
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        threads = [_swapper(docs, "f.md", outside / "secret.txt", b"The quokka inside.\n", stop),
                   _swapper(home.folder, "docs2", outside, b"", stop)]  # a folder swapped too
        try:
            seen = []
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                seen += _reads(s, "home/docs/f.md", 200)
                seen.append(s.call("list", {"ref": "home/docs2"}))
                seen.append(s.search(OUTSIDE))
            served = sum(1 for r in seen if not r.get("isError") and "quokka" in str(r))
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not [r for r in seen if "beyond Home" in str(r) or "secret.txt" in str(r)]
        assert served > 0  # the file itself was read whenever it was one
        os.rename(outside / "secret.txt", outside / "secret2.txt")  # settle: f.md last written as a file
        home.write("docs/f.md", "The quokka inside.\n")
        assert until(lambda: refs(s.search("quokka")) == ["home/docs/f.md"], timeout=10)
        assert refs(s.search(OUTSIDE)) == []


# --- 3. a damaged data.mdb -----------------------------------------------------------


def _indexed_home(home: Home, n: int = 40) -> None:
    for i in range(n):
        home.write(f"notes/n{i:03}.md", f"The pangolin note {i}. " + " ".join(f"w{i}x{j}" for j in range(80)) + "\n")


def _hits(c, query: str) -> list:
    """The refs a search answers, or None for a tool error (a damaged index being rebuilt)."""
    r = c.search(query, limit=50)
    return None if r.get("isError") else refs(r)


def _data(home: Home) -> Path:
    return home.state / "index" / "data.mdb"


def _damage(path: Path, how: str, seed: int) -> None:
    import random
    rnd = random.Random(seed)
    size = path.stat().st_size
    pages = size // 4096
    if how == "truncate":
        os.truncate(path, [size // 2, size - 4096, 3 * 4096 + 17, 100][seed % 4])
        return
    with open(path, "r+b") as f:
        for k in range(3):
            pg = rnd.randrange(0, 2) if how == "flip" and k == 0 and seed % 2 else rnd.randrange(2, pages)
            f.seek(pg * 4096)
            page = bytearray(f.read(4096))
            if how == "zero":
                page = bytearray(len(page))
            else:
                for _ in range(64):
                    page[rnd.randrange(len(page))] ^= 1 << rnd.randrange(8)
            f.seek(pg * 4096)
            f.write(page)


@pytest.mark.parametrize("how", ["truncate", "zero", "flip"])
def test_damaged_data_mdb_between_runs_is_rebuilt_never_a_crash(home, how):
    _indexed_home(home)
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        assert len(_hits(s, "pangolin") or ()) == 40
    for seed in range(2):
        _damage(_data(home), how, seed)
        with Server.start(home) as s:
            s.initialize()
            s.wait_indexed(timeout=60)
            assert sorted(refs(s.search("pangolin", limit=50))) == [f"home/notes/n{i:03}.md" for i in range(40)]
            assert refs(s.search("w7x3")) == ["home/notes/n007.md"]
            s.close()
            assert s.proc.returncode == 0, s.stderr[-2000:]


@pytest.mark.parametrize("how", ["truncate", "zero"])
def test_data_mdb_damaged_while_serving_is_rebuilt(home, how):
    _indexed_home(home)
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        if how == "truncate":
            os.truncate(_data(home), 4096 * 3)
        else:
            with open(_data(home), "r+b") as f:
                for pg in range(2, _data(home).stat().st_size // 4096, 3):
                    f.seek(pg * 4096)
                    f.write(bytes(4096))
        r = s.search("pangolin", limit=50)  # an error for this call, or an answer: never a crash
        assert s.proc.poll() is None
        assert r.get("isError") or r["structuredContent"]["hits"] is not None
        assert until(lambda: len(_hits(s, "pangolin") or ()) == 40, timeout=30)
        assert refs(s.search("w7x3")) == ["home/notes/n007.md"]
        assert s.proc.poll() is None


def test_serve_many_damaged_index_of_one_agent_never_ends_anothers_sessions(tmp_path):
    a, b = Home(tmp_path / "a"), Home(tmp_path / "b")
    a.write("a.md", "The aardvark digs.\n")
    _indexed_home(b, 20)
    sock = tmp_path / "run" / "s.sock"
    agents = {"a": agent_entry(a), "b": agent_entry(b)}
    with Many(sock, agents, ["--stay"]) as m:
        with m.hello("b") as cb:
            cb.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
            assert until(lambda: len(_hits(cb, "pangolin") or ()) == 20, timeout=30)
    # b's index damaged while no session of b is open, then b says Hello while a works
    os.truncate(_data(b), 4096 + 17)
    with Many(sock, agents, ["--stay"]) as m:
        with m.hello("a") as ca:
            ca.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
            assert until(lambda: refs(ca.search("aardvark")) == ["home/a.md"], timeout=30)
            with m.hello("b") as cb:
                cb.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
                assert until(lambda: len(_hits(cb, "pangolin") or ()) == 20, timeout=30)
                # and damaged while serving: b's calls fail or answer, a's go on
                os.truncate(_data(b), 4096 * 2)
                cb.search("pangolin")
                assert refs(ca.search("aardvark")) == ["home/a.md"]
                assert until(lambda: len(_hits(cb, "pangolin") or ()) == 20, timeout=30)
            assert refs(ca.search("aardvark")) == ["home/a.md"]
        assert m.proc.poll() is None


# --- 5. temp files left by kills -------------------------------------------------------


def test_temp_files_left_by_killed_processes_are_removed_at_start(home):
    import subprocess
    home.write("a.md", "The tapir.\n")
    dead = subprocess.Popen(["true"])
    dead.wait()
    tmp = home.state / "tmp"
    (tmp / f"p{dead.pid}").mkdir(parents=True)
    (tmp / f"p{dead.pid}" / "doc-k2j3h4.pdf").write_bytes(b"%PDF half written")
    old = time.time() - 3600
    left = [tmp / "doc-a1b2c3d4.docx", home.state / "notes-x7y8z9w0"]
    for p in left:
        p.write_bytes(b"half written")
        os.utime(p, (old, old))
    fresh = home.state / "notes-q1w2e3r4"  # a live writer's, perhaps: kept
    fresh.write_bytes(b"being written")
    keep = home.state / "keep.txt"
    keep.write_bytes(b"not a temp file")
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        assert not (tmp / f"p{dead.pid}").exists()
        assert not any(p.exists() for p in left)
        assert fresh.exists() and keep.exists()


# --- 4. `read` of a Home file over 4 MiB ---------------------------------------------


def test_read_of_a_home_file_over_4_mib_counts_and_serves_every_line(home):
    n = 300_000  # about 5.7 MiB
    with open(home.folder / "big.log", "w") as f:
        for i in range(1, n + 1):
            f.write(f"line {i:06} of the big log\n")
    assert (home.folder / "big.log").stat().st_size > 4 * 1024 * 1024
    with Server.start(home) as s:
        s.initialize()
        r = s.call("read", {"ref": "home/big.log", "lines": [n - 2, n]})
        sc = r["structuredContent"]
        assert sc["total_lines"] == n and sc["lines"] == [n - 2, n] and not sc["truncated"]
        assert sc["text"] == "\n".join(f"line {i:06} of the big log" for i in range(n - 2, n + 1))
        whole = s.call("read", {"ref": "home/big.log"})["structuredContent"]
        assert whole["total_lines"] == n and whole["truncated"] and whole["lines"][0] == 1
        assert whole["text"].startswith("line 000001 of the big log\nline 000002")
        assert whole["text"].count("\n") + 1 == whole["lines"][1]
        past = s.call("read", {"ref": "home/big.log", "lines": [n + 1, n + 5]})
        assert past["isError"] and str(n) in past["content"][0]["text"]


# --- 6. passage ids follow live data, not edits ---------------------------------------


def _next_pid(home: Home) -> int:
    import lmdb
    env = lmdb.open(str(home.state / "index"), readonly=True, lock=False, max_dbs=8)
    try:
        with env.begin(db=env.open_db(b"meta", create=False)) as txn:
            return int(txn.get(b"next_pid"))
    finally:
        env.close()


def test_passage_ids_follow_live_data_not_edits(home):
    def para(r: int, i: int, j: int) -> str:
        return f"Round r{r}x{i} paragraph {j} of the kiwi file.\n" + "filler words here " * 40 + "\n\n"

    files, paras, rounds = 6, 25, 25
    with Server.start(home) as s:
        s.initialize()
        for r in range(rounds):
            for i in range(files):
                tmp = home.folder / f".f{i}.tmp"
                tmp.write_text("".join(para(r, i, j) for j in range(paras)))
                os.rename(tmp, home.folder / f"f{i}.md")
            assert until(lambda: set(refs(s.search(f"r{r}x{files - 1}"))) == {f"home/f{files - 1}.md"}, timeout=20)
        assert until(lambda: all(set(refs(s.search(f"r{rounds - 1}x{i}"))) == {f"home/f{i}.md"} for i in range(files)))
        live = len(s.search("kiwi", limit=50)["structuredContent"]["hits"])
        assert live == 50
    # every passage made was counted: rounds x files x passages without reuse
    assert _next_pid(home) <= 3 * files * paras


def test_serve_many_one_agent_never_reads_anothers_files_through_a_swapped_link(tmp_path):
    a, b = Home(tmp_path / "a"), Home(tmp_path / "b")
    a.write("docs/f.md", "The quokka of a.\n")
    b.write("private.md", "PRIVATE-OF-B the numbat.\n")
    stop = threading.Event()
    sock = tmp_path / "run" / "s.sock"
    with Many(sock, {"a": agent_entry(a), "b": agent_entry(b)}, ["--stay"]) as m:
        with m.hello("a") as ca, m.hello("b") as cb:
            for c in (ca, cb):
                c.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}})
            assert until(lambda: refs(cb.search("numbat")) == ["home/private.md"], timeout=20)
            t = _swapper(a.folder / "docs", "f.md", b.folder / "private.md", b"The quokka of a.\n", stop)
            try:
                seen = []
                deadline = time.monotonic() + 2
                while time.monotonic() < deadline:
                    seen.append(ca.call("read", {"ref": "home/docs/f.md"}))
                    if len(seen) % 20 == 0:
                        seen.append(ca.search("numbat PRIVATE"))
            finally:
                stop.set()
                t.join()
            assert not [r for r in seen if "PRIVATE-OF-B" in str(r) or "numbat" in str(r).replace("'numbat PRIVATE'", "")]
            assert any("quokka" in str(r) for r in seen)


# --- 8. a filesystem fuzzer: odd names, links swapped while reading ---------------------


def _odd_name(rnd) -> bytes:
    kind = rnd.randrange(9)
    if kind == 0:  # not UTF-8
        return bytes([rnd.choice([0x80, 0xC3, 0xE9, 0xFE, 0xFF, 0xED])]) + b"n" + bytes([rnd.randrange(0x80, 0x100)])
    if kind == 1:  # newlines and control characters
        return b"a" + bytes([rnd.choice([9, 10, 13, 1, 27, 127])]) + b"b"
    if kind == 2:  # as long as a name may be, in multi-byte characters
        return ("\u00e9" * 127).encode()
    if kind == 3:  # hidden
        return b"." + rnd.choice([b"x", b"", b"."]) + b"h"
    if kind == 4:  # backslashes, percent escapes, dots inside
        return rnd.choice([b"a\\b", b"%2e%2e", b"a..b", b"..a", b"~", b"-rf", b"a b "])
    if kind == 5:  # other scripts, marks that turn text around
        return rnd.choice(["\u202eevil", "\U0001f600", "\u4e2d\u6587", "e\u0301", "\u200b"]).encode()
    if kind == 6:  # surrogate-like bytes (CESU) and overlong forms
        return rnd.choice([b"\xed\xa0\x80x", b"\xc0\xafx", b"\xe0\x80\xafx"])
    return f"plain{rnd.randrange(10**6)}".encode()


def _servable(name: bytes) -> bool:
    try:
        s = name.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not s.startswith(".") and "\\" not in s


@pytest.mark.parametrize("seed", [1, 2])
def test_filesystem_fuzzer_odd_names_and_links_swapped(home, tmp_path, seed):
    import random
    rnd = random.Random(seed)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("beyond Home kz0q\n")
    made: dict[bytes, tuple[str, bool]] = {}  # path -> (marker, servable)
    root = os.fsencode(home.folder)
    for n in range(60):
        parts = [_odd_name(rnd) for _ in range(rnd.choice([1, 1, 2]))]
        rel = b"/".join(parts)
        if rel in made or any(p in (b"", b".", b"..") for p in parts):
            continue
        try:
            if len(parts) > 1:
                os.makedirs(root + b"/" + parts[0], exist_ok=True)
            marker = f"m{n}x{seed}"
            with open(root + b"/" + rel, "wb") as f:
                f.write(f"The kestrel {marker}.\n".encode())
        except (OSError, IsADirectoryError, NotADirectoryError):
            continue
        made[rel] = (marker, all(_servable(p) for p in parts))
    home.write("swap/f.md", "The kestrel swapped kz1q.\n")
    stop = threading.Event()
    with Server.start(home) as s:
        s.initialize()
        s.wait_indexed()
        t = _swapper(home.folder / "swap", "f.md", outside / "secret.txt", b"The kestrel swapped kz1q.\n", stop)
        try:
            for rel, (marker, ok) in made.items():
                hits = refs(s.search(marker))
                ref = "home/" + rel.decode("utf-8", "surrogateescape")
                if not ok:
                    assert hits == [], (rel, hits)
                    continue
                assert hits == [ref], (rel, hits)
                r = s.call("read", {"ref": ref})
                assert not r.get("isError") and marker in r["structuredContent"]["text"], (rel, r)
                parent = ref.rsplit("/", 1)[0]
                listed = s.call("list", {"ref": parent})
                assert ref in [e["ref"] for e in listed["structuredContent"]["entries"]], (rel, listed)
                r = s.call("read", {"ref": "home/swap/f.md"})
                assert "beyond Home" not in str(r)
            assert "beyond Home" not in str(s.search("kestrel kz0q kz1q", limit=50))
            # whatever a listing shows can be read
            for e in s.call("list", {"ref": "home"})["structuredContent"]["entries"]:
                if e["kind"] == "file" and e["ref"] != "home/swap/f.md":
                    assert not s.call("read", {"ref": e["ref"]}).get("isError"), e
        finally:
            stop.set()
            t.join()
        assert s.proc.poll() is None
