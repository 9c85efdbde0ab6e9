"""Contract revision 2 as Link really runs the engine (§1.1, §1.2, §1.4, §2.3, §3.3,
§5.2-§5.4, §5.6): argv alone carries what an agent is served with, Agents entries
refused one by one, Bound lines Link extends, `changed` paths as Link names them."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.bridges import KEY, Bridges, Layout
from tests.helpers import PROGRAM, Home, Many, Server, base_env, run_cli, until

BIG = " ".join(f"budget{i} harbour words to fill the answer" for i in range(400)) + "\n"


def command(home: Home, env: dict) -> dict:
    r = run_cli("command", *home.args(), env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def link_env(home: Home) -> dict:
    """The environment Link runs `command` with for a FROM agent with notes and a small budget."""
    return {"LNK_MEMORY_SPEC": '{"tokens": 50, "notes": "1 KB"}', "LNK_MEMORY_NOTES": str(home.notes),
            "LNK_MEMORY_FROM": "1"}


# --- §1.1, §1.2: command writes the flags, serve reads them ---------------------------------

def test_command_writes_its_environment_into_argv(home):
    serve = command(home, link_env(home))
    assert serve["argv"] == [PROGRAM, "serve", *home.args(), "--spec", '{"tokens":50,"notes":"1 KB"}',
                             "--notes", str(home.notes), "--from"]
    assert serve["allow"] == ["search", "read", "list", "remember"]
    plain = command(home, {})
    assert plain["argv"] == [PROGRAM, "serve", *home.args(), "--spec", '{"tokens":2000,"notes":"4 KB"}']


def _served_as(s, home: Home) -> dict:
    """What a session is served with, as the agent would notice it."""
    s.initialize()
    tools = sorted(t["name"] for t in s.request("tools/list")["result"]["tools"])
    no_thread = s.request("tools/call", {"name": "search", "arguments": {"query": "budget1"}})
    deadline = time.monotonic() + 20
    while True:
        r = s.call("search", {"query": "harbour"}, thread="o1/main")
        if r["structuredContent"]["hits"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    text_bytes = len(r["content"][0]["text"].encode())
    teammate = s.call("remember", {"add": "from a teammate"}, thread="agent-bob")
    mine = s.call("remember", {"add": "kept " + "x" * 2000}, thread="o1/main")  # over the 1 KB notes limit
    return {"tools": tools, "no_thread": no_thread.get("error", {}).get("code"),
            "hits": bool(r["structuredContent"]["hits"]), "within_budget": text_bytes <= 200,
            "teammate_refused": teammate["isError"], "limit_refused": mine["isError"] and "1000" in mine["content"][0]["text"]}


EXPECTED = {"tools": ["list", "read", "remember", "search"], "no_thread": -32602, "hits": True,
            "within_budget": True, "teammate_refused": True, "limit_refused": True}


def test_serve_with_the_argv_alone(home):
    home.write("big.md", BIG)
    argv = command(home, link_env(home))["argv"]
    env = base_env()
    env["LNK_OWNER"] = "o1"
    with Server(argv, env) as s:  # no LNK_MEMORY_* at all: the flags carry it
        assert _served_as(s, home) == EXPECTED
    assert not home.notes.exists() or "teammate" not in home.notes.read_text()


def test_a_flag_wins_over_the_environment(home):
    home.write("big.md", BIG)
    env = base_env()
    env.update(LNK_MEMORY_SPEC='{"tokens": 100000}', LNK_OWNER="o1", LNK_MEMORY_NOTES="/elsewhere/notes.md")
    argv = [PROGRAM, "serve", *home.args(), "--spec", '{"tokens": 50, "notes": "1 KB"}', "--notes", str(home.notes), "--from"]
    with Server(argv, env) as s:
        assert _served_as(s, home) == EXPECTED


@pytest.mark.parametrize("args, env, words", [
    (["serve", "{folder}", "/tmp/s", "--spec", '{"tokens": 0}'], {}, "--spec: tokens"),
    (["serve", "{folder}", "/tmp/s", "--spec", "nope"], {}, "--spec"),
    (["serve", "{folder}", "/tmp/s", "--notes", "relative.md"], {}, "--notes"),
    (["serve", "{folder}", "/tmp/s", "--spe", "{}"], {}, "--spe"),  # no abbreviations
    (["serve", "{folder}", "/tmp/s"], {"LNK_OWNER": "o1\n"}, "LNK_OWNER"),
    (["install"], {"LNK_MEMORY_SPEC": '{"tokens": "many"}'}, "tokens"),
])
def test_bad_flags_and_environment_exit_2(home, tmp_path, args, env, words):
    args = [a.replace("{folder}", str(home.folder)) for a in args]
    e = {"HOME": str(tmp_path / "inst")}
    e.update(env)
    r = run_cli(*args, env=e)
    err = r.stderr.decode()
    assert r.returncode == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "inst").exists()


# --- §5.2, §5.3: a Hello agent is served from its argv alone -------------------------------

def test_hello_is_served_exactly_as_serve_with_that_argv(home, tmp_path):
    home.write("big.md", BIG)
    argv = command(home, link_env(home))["argv"]
    env = base_env()
    env["LNK_OWNER"] = "o1"
    with Server(argv, env) as s:
        by_serve = _served_as(s, home)
    home.notes.unlink(missing_ok=True)
    # Link's Agents entry: the argv, and only the model and the agent's names in env
    agents = {"a1": {"argv": argv, "env": {"LNK_MEMORY_MODEL": "", "LNK_OWNER": "o1", "LNK_AGENT": "Ann",
                                           "LNK_MEMORY_SPEC": '{"tokens": 100000}', "LNK_MEMORY_FROM": "0"}}}
    with Many(tmp_path / "run" / "m.sock", agents) as m:
        c = m.hello("a1")
        by_hello = _served_as(_Sock(c), home)
        c.close()
    assert by_hello == by_serve == EXPECTED


def _served_with_model(s) -> dict:
    s.initialize()
    tools = sorted(t["name"] for t in s.request("tools/list")["result"]["tools"])
    no_thread = s.request("tools/call", {"name": "search", "arguments": {"query": "car"}})
    ranked = until(lambda: s.call("search", {"query": "buying a car"}, thread="t")["structuredContent"]["ranked"]
                   == "meaning+words", timeout=20)
    hit = s.call("search", {"query": "automobile"}, thread="t")["structuredContent"]["hits"][:1]
    mine = s.call("remember", {"add": "x"}, thread="o1/main")  # no owner known: refused
    return {"tools": tools, "no_thread": no_thread.get("error", {}).get("code"), "meaning": ranked,
            "hit": [h["ref"] for h in hit], "remember": (mine["isError"], "owner" in mine["content"][0]["text"])}


def test_hello_with_only_the_model_in_env_is_served_as_serve(home, tmp_path):
    from fakes.harness import FakeServer
    model = FakeServer.start("fakes.embedding_server", "--unix", tmp_path / "embed.sock", "--dim", "64",
                             "--model", "fake-mini")
    try:
        home.write("spring.md", "We purchased an automobile last spring; the vehicle runs well.\n")
        argv = command(home, {"LNK_MEMORY_SPEC": '{"model": "fake-mini", "tokens": 300}',
                              "LNK_MEMORY_NOTES": str(home.notes), "LNK_MEMORY_FROM": "1"})["argv"]
        env = base_env()
        env["LNK_MEMORY_MODEL"] = model.listen
        with Server(argv, env) as s:
            by_serve = _served_with_model(s)
        with Many(tmp_path / "run" / "m.sock", {"a1": {"argv": argv, "env": {"LNK_MEMORY_MODEL": model.listen}}}) as m:
            c = m.hello("a1")
            by_hello = _served_with_model(_Sock(c))
            c.close()
        assert by_hello == by_serve == {"tools": ["list", "read", "remember", "search"], "no_thread": -32602,
                                        "meaning": True, "hit": ["home/spring.md"], "remember": (True, True)}
    finally:
        model.stop()


class _Sock:
    """A socket session with the stdio server's interface, for _served_as."""

    def __init__(self, c):
        self.c = c

    def initialize(self):
        return self.c.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                             "clientInfo": {"name": "t", "version": "0"}})

    def request(self, method, params=None):
        return self.c.request(method, params)

    def call(self, tool, args=None, thread=None):
        return self.c.call(tool, args, thread)


def _entry(home: Home, **env) -> dict:
    return {"argv": command(home, {"LNK_MEMORY_NOTES": str(home.notes)})["argv"], "env": env}


def test_a_bad_agents_entry_is_refused_for_that_agent_alone(tmp_path):
    homes = {a: Home(tmp_path / a) for a in ("good", "late")}
    homes["good"].write("doc.md", "goodword lives here\n")
    good = _entry(homes["good"])
    late = _entry(homes["late"])
    (homes["late"].folder).rename(tmp_path / "late-away")  # its folder is missing at the start
    agents = {
        "good": good,
        "late": late,
        "python": {"argv": ["/usr/bin/python3", *good["argv"][1:]], "env": {}},
        "index": {"argv": [good["argv"][0], "index", *good["argv"][2:]], "env": {}},
        "badspec": {"argv": good["argv"][:5] + ["--spec", '{"tokens": 0}'], "env": {}},
        "shape": ["not", "an", "object"],
        "twin": {"argv": good["argv"], "env": {}},  # the same state folder as good
        "bad id!": good,
        "cwd": {**_entry(Home(tmp_path / "cwd")), "cwd": "/"},  # issue 46: a key no entry has
    }
    with Many(tmp_path / "run" / "m.sock", agents) as m:
        assert m.proc.poll() is None
        with m.hello("good") as c:
            assert until(lambda: c.search("goodword")["structuredContent"]["hits"], timeout=20)
        for agent, words in (("python", "argv[0]"), ("index", "serve"), ("badspec", "tokens"),
                             ("shape", "object"), ("twin", "state"), ("late", "folder"), ("cwd", "'cwd'")):
            with m.connect() as c:
                r = c.first({"agent": agent})
                assert set(r) == {"error"} and agent in r["error"] and words in r["error"], (agent, r)
        (tmp_path / "late-away").rename(homes["late"].folder)  # made since the start: served now
        homes["late"].write("doc.md", "lateword\n")
        with m.hello("late") as c:
            assert until(lambda: c.search("lateword")["structuredContent"]["hits"], timeout=20)
        m.stop()
        err = m.proc.stderr.read().decode()
    for agent in ("python", "index", "badspec", "shape", "twin", "cwd"):
        assert f"{agent} is not served" in err  # logged at the start


@pytest.mark.parametrize("agents", ["[]", "not json", '"text"', "{\"a\": 1"])
def test_serve_many_exits_2_only_when_agents_is_not_an_object(tmp_path, agents):
    r = run_cli("serve-many", str(tmp_path / "run" / "m.sock"), agents)
    err = r.stderr.decode()
    assert r.returncode == 2 and "agents" in err and err.count("\n") == 1


def test_agents_may_be_left_out_with_cache(tmp_path):
    with Many(tmp_path / "run" / "m.sock", None, ["--cache", str(tmp_path / "cache")]) as m:
        assert until(m.socket.exists)
        with m.connect() as c:
            assert "not served" in c.first({"agent": "a1"})["error"]
        assert m.proc.poll() is None


# --- IDs match the whole string --------------------------------------------------------------

def test_an_id_with_a_trailing_newline_is_refused_everywhere(tmp_path):
    h = Home(tmp_path / "h")
    bridges = Bridges(tmp_path / "link")
    try:
        with Many(tmp_path / "run" / "m.sock", {"a1": _entry(h)}, bridges.flags() + ["--cache", str(tmp_path / "c")]) as m:
            lines = [{"agent": "a1\n"},
                     {"agent": "a1\n", "bound": bridges.bound()["bound"]},
                     {"agent": "a1", "bound": dict(bridges.bound()["bound"], owner="o1\n")},
                     {"agent": "a1", "bound": dict(bridges.bound()["bound"], key=KEY + "\n")},
                     {"agent": "a1", "bound": bridges.bound()["bound"], "team": {"id": "t1\n", "named": "crew"}},
                     {"agent": "a1", "bound": bridges.bound()["bound"], "team": {"id": "t1", "named": "crew\n"}},
                     {"changed": {"owner": "o1", "agent": "a1\n", "path": "x"}},
                     {"flush": {"owner": "o1\n", "agent": "a1"}}]
            for line in lines:
                with m.connect(timeout=5) as c:
                    r = c.first(line)
                    assert set(r) == {"error"}, (line, r)
                    assert KEY not in r["error"]
    finally:
        bridges.stop()


# --- §5.4 rev. 2: Bound lines as Link sends them ------------------------------------------------

BRIDGES = Layout(teams={"t1": {"folder": "teams/t1", "names": {"a1": "crew"}, "grants": {"a1": "all"}}},
                 homes={"a1": {"docs/plan.md": "The narwhal migration plan.\n"}},
                 conversations={"t1.jsonl": '{"role": "user", "text": "where do walruses sleep"}\n'},
                 team_files={"t1": {"memory/charter.md": "The crew charters a schooner.\n"}})


def _hits(c, q):
    return [h["ref"] for h in c.search(q)["structuredContent"]["hits"]]


def test_unknown_fields_of_bound_storage_and_team_are_ignored(bridges, tmp_path):
    with bridges.serve_many(tmp_path) as m:
        line = bridges.bound()
        line["bound"]["region"] = "eu-west"
        line["bound"]["future"] = {"anything": [1, 2]}
        line["bound"]["storage"]["tier"] = 3
        with m.connect() as c:
            assert c.first(line) == {"ok": True}
            assert until(lambda: _hits(c, "narwhal") == ["home/docs/plan.md"], timeout=20)
        team = bridges.bound(notes=None)
        team["team"] = {"id": "t1", "named": "crew", "writes": True, "colour": "blue"}
        with m.connect() as c:
            assert c.first(team) == {"ok": True}
            assert until(lambda: _hits(c, "schooner") == ["home/charter.md"], timeout=20)
        for where, key, value, words in (("bound", "notes", 5, "notes"), ("bound", "files", 3, "files"),
                                         ("storage", "places", [], "places"), ("bound", "index", "disk", "index")):
            bad = bridges.bound()
            (bad["bound"] if where == "bound" else bad["bound"]["storage"])[key] = value
            with m.connect() as c:
                r = c.first(bad)
                assert set(r) == {"error"} and words in r["error"] and KEY not in r["error"], r


def test_a_bound_with_memory_and_home_on_the_machine_is_served(bridges, tmp_path):
    h = Home(tmp_path / "h")
    h.write("local.md", "The local otter lives on this machine.\n")
    agents = {"a1": {"argv": command(h, {"LNK_MEMORY_NOTES": str(h.notes)})["argv"], "env": {"LNK_OWNER": "o1"}}}
    # storage for the conversations only; no files bridge, no memory place: Home and memory are local
    line = bridges.bound(files=False, places=("conversations",), notes="4 KB")
    for round_ in range(2):
        with bridges.serve_many(tmp_path, agents=agents) as m, m.connect() as c:
            assert c.first(line) == {"ok": True}
            assert until(lambda: "home/local.md" in _hits(c, "otter"), timeout=20)
            assert until(lambda: _hits(c, "walruses") == ["chats/t1.jsonl"], timeout=20)
            if round_ == 0:
                assert c.call("remember", {"add": "the otter likes clams"})["isError"] is False
            assert until(lambda: "notes" in _hits(c, "clams"), timeout=10)
            with m.connect() as ctl:
                assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
    assert h.notes.read_text() == "- the otter likes clams\n"  # the agent's local notes (--notes)
    assert not (bridges.store("memory") / "lnkmem").exists()  # no copy anywhere: the local index is the memory's own
    assert not any(e["method"] in ("PUT", "DELETE") for e in bridges.storage.log() + bridges.files.log())
    # an agent that <agents> does not name, with no files bridge: its Home is not known here
    with bridges.serve_many(tmp_path, "n", agents={}) as m, m.connect() as c:
        r = c.first(line)
        assert "Home" in r["error"] and KEY not in r["error"]


def test_a_second_bound_line_with_other_places_is_refused(bridges, tmp_path):
    """§5.4 rev. 3: an agent already bound with the same key is served from the held
    binding only when the line's places are the first line's; a line naming other
    places is refused (one start has one plan), never served with the first's."""
    h = Home(tmp_path / "h")
    h.write("local.md", "The local otter lives on this machine.\n")
    agents = {"a1": {"argv": command(h, {"LNK_MEMORY_NOTES": str(h.notes)})["argv"], "env": {"LNK_OWNER": "o1"}}}
    local = bridges.bound(files=False, places=("conversations",), notes="4 KB")  # Home on the machine
    with bridges.serve_many(tmp_path, agents=agents) as m, m.connect() as c:
        assert c.first(local) == {"ok": True}
        assert until(lambda: "home/local.md" in _hits(c, "otter"), timeout=20)
        for other in (bridges.bound(places=("conversations",), notes="4 KB"),  # Home through the files bridge
                      bridges.bound(files=False, places=("conversations", "memory"), notes="4 KB"),
                      bridges.bound(files=False, places=("conversations",), notes="8 KB"),
                      bridges.bound(files=False, places=("conversations",), notes=None)):
            with m.connect() as c2:
                r = c2.first(other)
                assert set(r) == {"error"} and "other places" in r["error"] and KEY not in r["error"], (other, r)
        with m.connect() as c3:  # the same places: served from the held binding
            assert c3.first(local) == {"ok": True}
            assert "home/local.md" in _hits(c3, "otter")
            assert "home/docs/plan.md" not in _hits(c3, "narwhal")
        assert "home/local.md" in _hits(c, "otter")  # the first session goes on
        with m.connect() as ctl:  # after `end`, another plan is a new binding
            assert ctl.first({"end": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
        with m.connect() as c4:
            assert c4.first(bridges.bound(places=("conversations",), notes="4 KB")) == {"ok": True}
            assert until(lambda: "home/docs/plan.md" in _hits(c4, "narwhal"), timeout=20)


def test_notes_live_in_home_through_the_files_bridge(bridges, tmp_path):
    line = bridges.bound(places=("conversations",), notes="4 KB")  # files, and storage without a memory place
    with bridges.serve_many(tmp_path) as m, m.connect() as c:
        assert c.first(line) == {"ok": True}
        assert c.call("remember", {"add": "the narwhal plan is due in May"})["isError"] is False
        assert until(lambda: "notes" in _hits(c, "due"), timeout=10)
        assert "home/memory/notes.md" not in _hits(c, "due")  # one place, one ref
    assert (bridges.home() / "memory" / "notes.md").read_text() == "- the narwhal plan is due in May\n"
    assert not (bridges.store("memory") / "notes.md").exists()


def test_one_bridge_took_the_key_and_the_other_is_down(bridges, tmp_path):
    bridges.storage.stop()
    with bridges.serve_many(tmp_path) as m, m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: _hits(c, "narwhal") == ["home/docs/plan.md"], timeout=20)  # Home, through files
        # answered at once, not after the bridge's patience (30 s): a wait fails on the client's 10 s deadline
        r = c.call("read", {"ref": "chats/t1.jsonl"})
        assert r["isError"] and "storage bridge is unreachable" in r["content"][0]["text"]
        r = c.call("remember", {"add": "kept for later"})
        assert r["isError"] and "storage bridge is unreachable" in r["content"][0]["text"]
        from fakes.harness import FakeServer
        bridges.storage = FakeServer.start("fakes.storage_bridge", "--unix", bridges.storage_sock, "--root",
                                           bridges.storage_root, "--config", bridges.config, "--log",
                                           bridges.base / "storage.log")
        # retried in the background: the conversations and the notes come back
        assert until(lambda: _hits(c, "walruses") == ["chats/t1.jsonl"], timeout=30)
        assert c.call("remember", {"add": "kept for later"})["isError"] is False
    assert (bridges.store("memory") / "notes.md").read_text() == "- kept for later\n"


# --- §2.3 rev. 2: a bound agent that <agents> does not name --------------------------------------

def test_unnamed_bound_agent_notes_follow_the_thread_rules(bridges, tmp_path):
    with bridges.serve_many(tmp_path) as m, m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        for t in ("agent-x", "task-1", "team-t1", "stranger", "o10"):
            r = c.call("remember", {"add": f"from {t}"}, thread=t)
            assert r["isError"] and "owner" in r["content"][0]["text"], (t, r)
        assert not (bridges.store("memory") / "notes.md").exists()
        assert c.call("remember", {"add": "no thread named"})["isError"] is False
        assert c.call("remember", {"add": "the owner's"}, thread="o1/main")["isError"] is False
        assert c.call("remember", {"add": "the owner"}, thread="o1")["isError"] is False
    assert (bridges.store("memory") / "notes.md").read_text() == "- no thread named\n- the owner's\n- the owner\n"


# --- §5.6 rev. 2: `changed` paths as Link names them; bursts coalesced ---------------------------

def _changed(m, path, owner="o1", agent="a1"):
    with m.connect(timeout=60) as ctl:
        return ctl.first({"changed": {"owner": owner, "agent": agent, "path": path}})


def test_changed_with_a_home_path_a_conversation_name_and_memory_notes(bridges, tmp_path):
    with bridges.serve_many(tmp_path) as m, m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: _hits(c, "narwhal") == ["home/docs/plan.md"], timeout=20)
        # each change is in the index when `ok` comes: no waiting after it
        bridges.write_home("docs/plan.md", "The narwhal plan now names a kraken.\n")
        assert _changed(m, "docs/plan.md") == {"ok": True}  # a Home path as the files bridge names it
        assert _hits(c, "kraken") == ["home/docs/plan.md"]
        (bridges.store("conversations") / "t2.jsonl").write_text('{"role": "user", "text": "the lighthouse keeper"}\n')
        assert _changed(m, "chats/t2.jsonl") == {"ok": True}  # a conversation's name
        assert _hits(c, "lighthouse") == ["chats/t2.jsonl"]
        (bridges.store("memory") / "notes.md").write_text("- the owner keeps bees\n")
        assert _changed(m, "memory/notes.md") == {"ok": True}
        assert _hits(c, "bees") == ["notes"]
        bridges.write_home("docs/other.md", "A manatee drifts by.\n")
        assert _changed(m, "home/docs/other.md") == {"ok": True}  # the engine's own ref
        assert _hits(c, "manatee") == ["home/docs/other.md"]
        (bridges.home() / "docs" / "plan.md").unlink()
        assert _changed(m, "docs/plan.md") == {"ok": True}
        assert _hits(c, "kraken") == []
        # a path naming nothing known: its folder, and Home when that is unknown too, listed again
        bridges.write_home("fresh/deep/a.md", "An axolotl arrived unannounced.\n")
        assert _changed(m, "fresh/none-such.md") == {"ok": True}
        assert _hits(c, "axolotl") == ["home/fresh/deep/a.md"]
        bridges.write_home("fresh/deep/b.md", "A second axolotl, a quokka.\n")
        assert _changed(m, "fresh/deep/gone.md") == {"ok": True}
        assert _hits(c, "quokka") == ["home/fresh/deep/b.md"]
        for bad in ("../etc/passwd", "a/../../b", "/", "docs\\..\\x", "a\u0000b"):
            r = _changed(m, bad)
            assert set(r) == {"error"}, (bad, r)


def test_a_burst_of_changed_controls_is_coalesced(bridges, tmp_path):
    from concurrent.futures import ThreadPoolExecutor
    files = [f"burst/d{i % 4}/f{i}.md" for i in range(100)]
    for i, f in enumerate(files):
        bridges.write_home(f, f"base text {i}\n")
    with bridges.serve_many(tmp_path) as m, m.connect() as c:
        assert c.first(bridges.bound()) == {"ok": True}
        assert until(lambda: "indexing" not in c.search("zz")["structuredContent"] and _hits(c, "base"), timeout=30)
        for i, f in enumerate(files):
            bridges.write_home(f, f"changed text {i} word{i}x\n")
        before = len(bridges.files.log())
        with ThreadPoolExecutor(100) as pool:  # 1,000 controls, as a burst from Link: ten for each file
            answers = list(pool.map(lambda k: _changed(m, ("home/" if k % 2 else "") + files[k % len(files)]), range(1000)))
        assert answers == [{"ok": True}] * 1000
        listings = [e for e in bridges.files.log()[before:] if e["path"].startswith("/v1/list")]
        # about a listing of the four folders per pass, not one (or two) for each control
        assert len(listings) < 250, len(listings)
        for i in (0, 77, 99):
            assert _hits(c, f"word{i}x") == [f"home/{files[i]}"]


# --- §3.3 rev. 2: a converter installed since the last start ----------------------------------

def test_documents_indexed_by_name_are_converted_once_lnk_documents_appears(home, tmp_path):
    from fakes.lnk_documents import make_pdf
    from tests.helpers import ROOT
    (home.folder / "report.pdf").write_bytes(make_pdf("The albatross census counted 412 birds."))
    (home.folder / "broken.pdf").write_bytes(b"%PDF-1.4 not really a pdf at all")
    runs = tmp_path / "runs.jsonl"
    bare = {"PATH": "/usr/bin:/bin"}  # no lnk-documents anywhere
    with Server.start(home, env=bare) as s:
        s.wait_indexed()
        assert [h["ref"] for h in s.search("report")["structuredContent"]["hits"]] == ["home/report.pdf"]  # by name
        assert s.search("albatross")["structuredContent"]["hits"] == []
    installed = {"PATH": f"{ROOT / 'fakes' / 'bin'}:/usr/bin:/bin", "FAKE_LNK_DOCUMENTS_LOG": str(runs)}
    with Server.start(home, env=installed) as s:  # the first start after it appears
        s.wait_indexed()
        assert [h["ref"] for h in s.search("albatross census")["structuredContent"]["hits"]] == ["home/report.pdf"]
        # both were tried once (converted from the bytes read, so by a temporary name): one good, one failed
        assert until(lambda: runs.exists() and len(runs.read_text().splitlines()) == 2, timeout=10)
    first = [json.loads(x) for x in runs.read_text().splitlines()]
    assert sorted(r["status"] for r in first) == [0, 1]
    assert all(r["file"].endswith(".pdf") for r in first)
    with Server.start(home, env=installed) as s:  # converted (or failed) once: not again at every start
        s.wait_indexed()
        assert [h["ref"] for h in s.search("albatross")["structuredContent"]["hits"]] == ["home/report.pdf"]
    assert len(runs.read_text().splitlines()) == 2


def test_changed_paths_name_their_candidates_and_bursts_group_by_folder():
    from lnkmem.memory import changes
    every = ("home", "chats", "skills", "notes")
    assert changes.candidates("docs/plan.md", every) == ["home/docs/plan.md"]
    assert changes.candidates("home/docs/plan.md", every) == ["home/docs/plan.md", "home/home/docs/plan.md"]
    assert changes.candidates("chats/t1.jsonl", every) == ["chats/t1.jsonl", "home/chats/t1.jsonl"]
    assert changes.candidates("memory/notes.md", every) == ["notes", "home/memory/notes.md"]
    assert changes.candidates("memory/notes.md", ("home",)) == ["home/memory/notes.md"]
    assert sorted(changes.coalesce(["home/a/x", "home/a/y", "home/b/z", "chats/c"])) == ["chats/c", "home/a", "home/b/z"]
    assert changes.coalesce(["home/a/x", "home/a/y"], local=["home"]) == ["home/a/x", "home/a/y"]  # a walk costs more
    assert changes.coalesce(["home/x", "home/y", "home/a/b"]) == ["home"]
    for bad in ("..", "a/../../b", "a\\b", "a\0b", "", "/"):
        with pytest.raises(ValueError):
            changes.clean(bad)
    assert changes.clean("/docs//plan.md") == "docs/plan.md"
