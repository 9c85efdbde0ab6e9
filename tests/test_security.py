"""Security (issue 7, part 3): no one let in, nothing let out.

Refs and paths that try to escape; a Home holding links into the agent folder
and out of Home; peers of other uids; foreign bridges; bad, reused and other
agents' proofs; `remember` from threads that are not the owner's; the key and
the proofs never in logs, errors, files, /proc/<pid>/cmdline or environ; and
nothing written outside <state>, the notes and the copy.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakes.harness import FakeServer
from lnkmem.bridges.http import proof
from tests.bridges import KEY, OTHER_KEY, Layout
from tests.helpers import PROGRAM, Home, Server, agent_entry, base_env, refs, tree_digest, until

SECRET = "SECRETTOKEN-7f3a"


def _everything(s: Server) -> str:
    """All a session may be asked for, as one text: for a secret never to be in."""
    out = [json.dumps(s.search(SECRET, limit=50)["structuredContent"]["hits"]), json.dumps(s.call("list")),
           json.dumps(s.search("secrettoken outside hidden private state", limit=50)["structuredContent"]["hits"])]
    for ref in ("home", "chats", "skills"):
        out.append(json.dumps(s.call("list", {"ref": ref})))
    return "\n".join(out)


ESCAPES = ["home/../agent/memory/private.txt", "home/../../outside/secret.txt", "/etc/passwd", "home//etc/passwd",
           "home/\x00/x", "home/a\\..\\..\\outside", "home/\u2025/outside", "home/%2e%2e/outside",
           "home/\uff0e\uff0e/outside", "chats/../memory/private.txt", "skills/../../outside/secret.txt",
           "notes/../memory/private.txt", "home/./../outside/secret.txt", "home/docs/../../outside/secret.txt",
           "home/.hidden/secret.md", "home/..", "chats/..", "home/link-out/secret.txt", "home/link-up/outside/secret.txt",
           "home/link-agent/memory/private.txt", "home/link-state/index/data.mdb", "home/link-notes",
           "home/link-passwd", "home/loop/x", "chats/link-home.md", "skills/s/link-out.md", "../outside/secret.txt",
           "home/" + "../" * 40 + "etc/passwd", "home/\u202e\u2066../outside"]


def _layout(base: Path) -> Home:
    h = Home(base)
    outside = base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET} outside Home\n")
    (h.agent / "memory" / "private.txt").write_text(f"{SECRET} in the agent folder\n")
    h.write("docs/plan.md", "The albatross glides for hours.\n")
    h.write(".hidden/secret.md", f"{SECRET} hidden\n")
    h.write("skills/s/SKILL.md", "albatross skill\n")
    h.chat("o1", [{"role": "user", "text": "albatross chat"}])
    h.notes.write_text("- albatross note\n")
    (h.folder / "inner.md").write_text("albatross inner file\n")
    links = {"link-out": outside, "link-up": base, "link-agent": h.agent, "link-state": h.state,
             "link-notes": h.notes, "link-passwd": Path("/etc/passwd"), "link-rel.md": Path("../outside/secret.txt"),
             "link-inner.md": h.folder / "inner.md", "link-chain.md": h.folder / "link-out" / "secret.txt"}
    for name, target in links.items():
        (h.folder / name).symlink_to(target)
    os.symlink("loop", h.folder / "loop")
    (h.agent / "chats" / "link-home.md").symlink_to(h.folder / "inner.md")
    (h.agent / "skills" / "s" / "link-out.md").symlink_to(outside / "secret.txt")
    os.mkfifo(h.folder / "fifo.md")  # a reader that opens it blocks: must not hang indexing
    h.state.mkdir(parents=True, exist_ok=True)
    (h.state / "planted.md").write_text(f"{SECRET} in state\n")
    return h


def test_refs_paths_and_links_never_escape(tmp_path):
    h = _layout(tmp_path)
    with Server.start(h) as s:
        s.initialize()
        s.wait_indexed(timeout=30)
        found = set(refs(s.search("albatross", limit=50)))
        assert found == {"home/docs/plan.md", "home/inner.md", "home/link-inner.md", "skills/s/SKILL.md",
                         "chats/o1.jsonl", "notes"}, found  # links inside a root followed, none out of it
        for ref in ESCAPES:
            r = s.call("read", {"ref": ref})
            assert r["isError"] and r["content"][0]["text"].strip(), (ref, r)
            assert SECRET not in json.dumps(r) and "root:x:" not in json.dumps(r)
            ls = s.call("list", {"ref": ref})
            assert SECRET not in json.dumps(ls), ref
            if not ls["isError"]:
                assert all(not e["ref"].split("/", 1)[-1].startswith(("link-out", "link-up", "link-agent", "link-state",
                                                                     "link-passwd", "..")) for e in ls["structuredContent"]["entries"])
            under = s.search("albatross secrettoken", under=ref)["structuredContent"]["hits"]
            assert SECRET not in json.dumps(under)
        top = {e["ref"] for e in s.call("list", {"ref": "home"})["structuredContent"]["entries"]}
        assert not top & {"home/link-out", "home/link-up", "home/link-agent", "home/link-state", "home/link-notes",
                          "home/link-passwd", "home/link-rel.md", "home/link-chain.md", "home/.hidden", "home/loop"}
        assert SECRET not in _everything(s)
        assert s.request("ping")["result"] == {}


def test_agent_folder_inside_home_with_links_into_it(tmp_path):
    home = tmp_path / "h"
    agent = home / "agent"
    (agent / "chats").mkdir(parents=True)
    (agent / "memory").mkdir()
    (agent / "memory" / "private.txt").write_text(f"{SECRET} private\n")
    (agent / "chats" / "t.jsonl").write_text(json.dumps({"role": "user", "text": "heron chat"}) + "\n")
    (home / "doc.md").write_text("heron doc\n")
    (home / "to-agent").symlink_to(agent)
    (home / "to-private.md").symlink_to(agent / "memory" / "private.txt")
    (home / "to-chat.md").symlink_to(agent / "chats" / "t.jsonl")
    state = agent / "memory" / "lnkmem"
    with Server([PROGRAM, "serve", str(home), str(state), str(agent)], base_env()) as s:
        s.wait_indexed()
        assert sorted(refs(s.search("heron"))) == ["chats/t.jsonl", "home/doc.md"]
        for ref in ("home/to-agent/memory/private.txt", "home/to-private.md", "home/to-chat.md", "home/agent/chats/t.jsonl",
                    "home/agent/memory/private.txt"):
            r = s.call("read", {"ref": ref})
            assert r["isError"] and SECRET not in json.dumps(r), ref
        assert SECRET not in json.dumps(s.search(SECRET)["structuredContent"]["hits"])


# --- peers, bridges and proofs -------------------------------------------------------------

PEER = r"""
import os, socket, sys
os.setgroups([int(sys.argv[3])]); os.setgid(int(sys.argv[3])); os.setuid(int(sys.argv[2]))
s = socket.socket(socket.AF_UNIX); s.settimeout(5); s.connect(sys.argv[1])
try:
    s.sendall(sys.argv[4].encode() + b"\n")
    print(s.makefile("rb").readline().decode().strip() or "CLOSED")
except (BrokenPipeError, ConnectionResetError):
    print("CLOSED")
"""


BRIDGES = Layout(bindings={"a1": {"owner": "o1", "key": KEY}, "a2": {"owner": "o2", "key": OTHER_KEY}},
                 homes={"a1": {"docs/plan.md": "The cormorant dives.\n"}, "a2": {"docs/plan.md": "The cormorant dives.\n"}},
                 walkable=True)  # a path another uid may walk


def _binds(server: FakeServer) -> list:
    return [e for e in server.log() if e["path"] == "/v1/bind"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_a_peer_of_another_uid_never_reaches_a_bridge(bridges):
    with bridges.serve_many(bridges.base, "p", extra=["--group", "65534"]) as m:
        out = subprocess.run([sys.executable, "-c", PEER, str(m.socket), "65534", "65534", json.dumps(bridges.bound())],
                             capture_output=True, timeout=20, env=base_env())
        assert out.stdout.decode().strip() == "CLOSED", out
    assert _binds(bridges.files) == [] and _binds(bridges.storage) == []


def test_foreign_bridges_and_proofs(bridges):
    foreign = FakeServer.start("fakes.storage_bridge", "--unix", bridges.base / "foreign" / "s.sock", "--root",
                               bridges.base / "froot", "--config", bridges.config)
    bdir = bridges.base / "bdir"
    (bdir / "a2").mkdir(parents=True)
    os.symlink(bridges.base / "foreign" / "s.sock", bdir / "a2" / "storage.sock")  # a2's own, not a1's
    try:
        with bridges.serve_many(bridges.base, "f", extra=["--bridges", str(bdir)]) as m:
            def first(line):
                with m.connect(timeout=30) as c:
                    r = c.first(line)
                    if "error" in r:
                        assert r["error"].strip() and KEY not in r["error"] and OTHER_KEY not in r["error"]
                        assert c.closed()
                    return r
            # sockets that are not this machine's bridges: refused before any connection
            for sock in (str(bridges.base / "foreign" / "s.sock"), "relative/storage.sock", str(bdir / "a2" / "storage.sock"),
                         str(bridges.base / "nowhere.sock"), str(bridges.storage_sock) + "\x00", ""):
                line = bridges.bound()
                line["bound"]["storage"]["socket"] = sock
                assert "error" in first(line), sock
            line = bridges.bound()
            line["bound"]["files"] = str(bridges.base / "foreign" / "s.sock")
            assert "not one of this machine's bridges" in first(line)["error"]
            assert foreign.log() == [] and _binds(bridges.files) == [] and _binds(bridges.storage) == []
            # a link to the machine's own bridge resolves to it: served
            (bridges.base / "alias").mkdir()
            os.symlink(bridges.files_sock, bridges.base / "alias" / "f.sock")
            line = bridges.bound()
            line["bound"]["files"] = str(bridges.base / "alias" / "f.sock")
            good = m.connect(timeout=30)
            assert good.first(line) == {"ok": True}
            assert until(lambda: refs(good.search("cormorant")) == ["home/docs/plan.md"], timeout=20)
            # bad proofs: a wrong key, another agent's key, an agent not bound at the bridge
            assert "refused" in first(bridges.bound(key="c3" * 32))["error"]
            assert "refused" in first(bridges.bound(agent="a2", owner="o2", key=KEY))["error"]
            assert "refused" in first(bridges.bound(agent="a9", owner="o1"))["error"]
            assert "refused" in first(bridges.bound(owner="o2"))["error"]  # a1's key, another owner
            # none of them ended or weakened the good binding
            assert refs(good.search("cormorant")) == ["home/docs/plan.md"]
            assert good.call("remember", {"add": "still mine"})["isError"] is False
            # the same line again (reused): one binding, both sessions served
            with m.connect(timeout=30) as again:
                assert again.first(line) == {"ok": True}
                assert refs(again.search("cormorant")) == ["home/docs/plan.md"]
            good.close()
        assert foreign.log() == []
    finally:
        foreign.stop()


def test_a_link_to_a_bridge_swapped_after_the_check_never_gets_a_connection(bridges):
    """Issue 46: a Bound line's socket path is checked (it resolves to one of this machine's
    bridges) and then connected by what was checked, not by the path named: a link on the
    way swapped to another socket afterwards (here once the bridges dropped every open
    connection, so that each request connects again) never gets a connection, a proof or a
    file's name, and the binding goes on through the machine's own bridges."""
    base = bridges.base
    impostors = [FakeServer.start(f"fakes.{kind}_bridge", "--unix", base / "imp" / f"{kind}.sock", "--root",
                                  base / f"imp-{kind}", "--config", bridges.config) for kind in ("files", "storage")]
    alias = base / "alias"
    alias.mkdir()
    (alias / "f.sock").symlink_to(bridges.files_sock)
    (alias / "s.sock").symlink_to(bridges.storage_sock)
    try:
        with bridges.serve_many(base, "w") as m, m.connect(timeout=30) as c:
            line = bridges.bound()
            line["bound"]["files"] = str(alias / "f.sock")
            line["bound"]["storage"]["socket"] = str(alias / "s.sock")
            assert c.first(line) == {"ok": True}
            assert until(lambda: refs(c.search("cormorant")) == ["home/docs/plan.md"], timeout=30)
            for name, kind in (("f.sock", "files"), ("s.sock", "storage")):  # each link now names the impostor
                (alias / f"{name}.new").symlink_to(base / "imp" / f"{kind}.sock")
                os.replace(alias / f"{name}.new", alias / name)
            for real in (bridges.files, bridges.storage):
                real.fault("down", count=0)  # every open connection closed; the next requests served
            bridges.write_home("docs/late.md", "The albatross glides for days.\n")
            with m.connect() as ctl:
                assert ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "home/docs/late.md"}}) == {"ok": True}
            assert until(lambda: refs(c.search("albatross")) == ["home/docs/late.md"], timeout=30)
            assert c.call("remember", {"add": "the real bridge keeps this"}, thread="o1")["isError"] is False
        assert (bridges.store("memory") / "notes.md").read_text() == "- the real bridge keeps this\n"
        assert [imp.log() for imp in impostors] == [[], []]
    finally:
        for imp in impostors:
            imp.stop()


def test_remember_only_in_the_owners_threads(bridges):
    h = Home(bridges.base / "local-a1")
    agents = {"a1": agent_entry(h, env={"LNK_MEMORY_FROM": "1", "LNK_OWNER": "o1"})}
    strangers = ["agent-a2", "team-t1", "task-42", "stranger", "o2", "o1x", "O1", "o1\u200b", "\uff4f1", " o1",
                 "agent-o1", "team-o1/x", "task-o1"]
    with bridges.serve_many(bridges.base, "r", agents=agents) as m:
        with m.hello("a1") as c:  # a Hello session: the local notes
            for t in strangers:
                r = c.call("remember", {"add": f"from {t}"}, thread=t)
                assert r["isError"] and "owner" in r["content"][0]["text"], t
            assert not h.notes.exists()
            assert c.call("remember", {"add": "mine"}, thread="o1/main")["isError"] is False
        with m.connect(timeout=30) as c:  # a Bound session: the notes in the storage bridge
            assert c.first(bridges.bound()) == {"ok": True}
            for t in strangers:
                r = c.call("remember", {"add": f"from {t}"}, thread=t)
                assert r["isError"] and "owner" in r["content"][0]["text"], t
            r = c.request("tools/call", {"name": "remember", "arguments": {"add": "no thread"}})
            assert r["error"]["code"] == -32602
            assert c.call("remember", {"add": "bound mine"}, thread="o1")["isError"] is False
    assert h.notes.read_text() == "- mine\n"
    assert (bridges.store("memory") / "notes.md").read_text() == "- bound mine\n"
    puts = [e for e in bridges.storage.log() if e["method"] == "PUT" and e["path"].endswith("notes.md")]
    assert len(puts) == 1


# --- secrets never shown, nothing written where it should not be -----------------------------

def test_secrets_never_shown_and_nothing_written_elsewhere(bridges):
    secrets = [KEY, KEY.upper(), OTHER_KEY] + [proof(k, p, o, a) for k, o, a in ((KEY, "o1", "a1"), (OTHER_KEY, "o2", "a2"))
                                               for p in ("files", "storage", "embedding")]
    base = bridges.base
    h = Home(base / "local-a1")
    h.write("docs/d.md", "The pelican's beak holds more than its belly.\n")
    h.notes.write_text("- local note\n")
    fake_home = base / "engine-home"
    fake_home.mkdir()
    bfile = base / "ebind.json"
    bfile.write_text(json.dumps(bridges.bindings))
    model = FakeServer.start("fakes.embedding_server", "--unix", base / "e" / "e.sock", "--model", "fake-mini",
                             "--bindings", bfile)
    agents = {"a1": agent_entry(h, env={"LNK_OWNER": "o1"})}
    env = {"LNKMEM_LOG": "debug", "HOME": str(fake_home), "LNKMEM_WRITEBACK_S": "0.2"}
    links = (base / "files", base / "storage", base / "run", base / "files.log", base / "storage.log")  # Link's own
    skip = links + (base / "s", base / "cache-s", h.state, h.notes, base / "e")
    before = tree_digest(base, skip=skip)
    answers = []
    try:
        m = bridges.serve_many(bridges.base, "s", agents=agents, env=env,
                               extra=["--embed", "fake-mini", "--embed-url", model.listen])
        try:
            procs = [f"/proc/{m.proc.pid}/cmdline", f"/proc/{m.proc.pid}/environ"]
            with m.connect(timeout=30) as c:
                answers.append(c.first(bridges.bound()))
                assert until(lambda: refs(c.search("cormorant")) == ["home/docs/plan.md"], timeout=20)
                answers.append(c.call("remember", {"add": "a bound note"}))
                for t in range(3):
                    with m.connect(timeout=30) as bad:
                        answers.append(bad.first(bridges.bound(key=OTHER_KEY)))
                line = bridges.bound()
                line["bound"]["storage"]["socket"] = str(base / "foreign.sock")
                with m.connect(timeout=30) as bad:
                    answers.append(bad.first(line))
                line = bridges.bound()
                line["bound"]["owner"] = "bad owner"
                with m.connect(timeout=30) as bad:
                    answers.append(bad.first(line))
                bridges.storage.fault("503", count=3, retry_after=0)
                with m.connect(timeout=60) as ctl:
                    answers.append(ctl.first({"flush": {"owner": "o1", "agent": "a1"}}))
                with m.hello("a1") as hc:
                    answers.append(hc.search("pelican"))
                    answers.append(hc.call("remember", {"add": "a local note"}))
                for p in procs:
                    answers.append(Path(p).read_bytes().decode("latin-1"))
            m.stop(signal.SIGTERM)
            err = m.proc.stderr.read().decode()
        finally:
            m.stop()
    finally:
        model.stop()
    assert "DEBUG" in err
    blobs = {"stderr": err, "answers": json.dumps(answers)}
    for dirpath, _, names in os.walk(base):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink() and p not in (bridges.config, bfile):  # Link's own, holding keys
                blobs[str(p)] = p.read_bytes().decode("latin-1")
    assert len(blobs) > 10
    for s in secrets:
        assert [where for where, b in blobs.items() if s in b] == []
    # written: only <state>, the notes, the cache and the copy (and Link's own bridges and logs)
    after = tree_digest(base, skip=skip)
    assert after == before
    assert list(fake_home.iterdir()) == []  # nothing in $HOME
    assert h.notes.read_text() == "- local note\n- a local note\n"
    copy_writes = [e["path"] for e in bridges.storage.log() + bridges.files.log() if e["method"] in ("PUT", "DELETE")]
    assert copy_writes and all("/v1/c/memory/lnkmem/" in p or p.endswith("/v1/c/memory/notes.md") for p in copy_writes)
