"""Contract revision 2 as Link really runs the engine (§1.1, §1.2, §1.4, §2.3, §3.3,
§5.2-§5.4, §5.6): argv alone carries what an agent is served with, Agents entries
refused one by one, Bound lines Link extends, `changed` paths as Link names them."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.bridges import KEY, Bridges
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
    }
    with Many(tmp_path / "run" / "m.sock", agents) as m:
        assert m.proc.poll() is None
        with m.hello("good") as c:
            assert until(lambda: c.search("goodword")["structuredContent"]["hits"], timeout=20)
        for agent, words in (("python", "argv[0]"), ("index", "serve"), ("badspec", "tokens"),
                             ("shape", "object"), ("twin", "state"), ("late", "folder")):
            with m.connect() as c:
                r = c.first({"agent": agent})
                assert set(r) == {"error"} and agent in r["error"] and words in r["error"], (agent, r)
        (tmp_path / "late-away").rename(homes["late"].folder)  # made since the start: served now
        homes["late"].write("doc.md", "lateword\n")
        with m.hello("late") as c:
            assert until(lambda: c.search("lateword")["structuredContent"]["hits"], timeout=20)
        m.stop()
        err = m.proc.stderr.read().decode()
    for agent in ("python", "index", "badspec", "shape", "twin"):
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
