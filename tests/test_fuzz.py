"""Fuzzing (issue 7, part 1): every input lnkmem reads, malformed every way.

Nothing may crash a session or the process, hang it, or change stored data;
every refusal says what was wrong. Pure parsers are fuzzed in-process; the
protocol is fuzzed against the real program: one long-lived `serve` fed many
generated lines, one `serve-many` fed many generated first lines, and bridges
and the model answering garbage (fakes/garbage_server.py).

Hypothesis runs derandomized (the same examples on every run); FUZZ_SCALE
multiplies the example counts for a longer run (docs/RELIABILITY.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import uuid
import zlib
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakes.harness import FakeServer
from lnkmem.memory import notesrules as notes_mod
from lnkmem.core.errors import ToolError, UsageError
from lnkmem.memory.threads import notes_refusal
from tests.helpers import Home, Many, Server, agent_entry, base_env, refs, run_cli, tree_digest, until

SCALE = float(os.environ.get("FUZZ_SCALE", "1"))


def fuzz(n: int) -> settings:
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)


# --- strategies -------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=30))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=12)
weird_text = st.text(max_size=40) | st.sampled_from([
    "", " ", "..", "../..", "/etc/passwd", "home/../../etc/passwd", "home/\x00x", "home/\u2025/x", "home/\uff0e\uff0e/x",
    "home\\..\\x", "notes/x", "chats/../../x", "\u202eevil", "o1", "agent-x", "team-t", "task-1", "a" * 5000])


def _line(obj) -> bytes:
    ascii_only = bool(zlib.crc32(repr(obj).encode("utf-8", "surrogatepass")) & 1)
    text = json.dumps(obj, ensure_ascii=ascii_only, allow_nan=False)
    return text.encode("utf-8", "surrogatepass")


TOOL_ARGS = st.fixed_dictionaries({}, optional={
    "query": weird_text | json_values, "limit": st.integers(-5, 60) | json_values,
    "sources": st.lists(st.sampled_from(["home", "chats", "skills", "notes", "web", ""]), max_size=5) | json_values,
    "under": weird_text | json_values, "ref": weird_text | json_values,
    "lines": st.lists(st.integers(-3, 10**12), max_size=3) | json_values,
    "add": weird_text | json_values, "remove": weird_text | json_values, "extra": json_values})
META = st.fixed_dictionaries({}, optional={
    "link.local/thread": weird_text | json_values,
    "io.modelcontextprotocol/protocolVersion": st.sampled_from(["2026-07-28", "2025-11-25", "1900-01-01"]) | json_values,
    "io.modelcontextprotocol/clientCapabilities": json_values})
PARAMS = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["search", "read", "list", "remember", "nope"]) | json_values,
    "arguments": TOOL_ARGS | json_values, "_meta": META | json_values,
    "protocolVersion": st.sampled_from(["2025-06-18", "2024-11-05", "x"]) | json_values,
    "requestId": st.integers(0, 5) | json_values, "capabilities": json_values})
METHODS = ["initialize", "notifications/initialized", "ping", "tools/list", "tools/call", "notifications/cancelled",
           "server/discover", "resources/list", "nope/nope", ""]
REQUESTS = st.fixed_dictionaries({}, optional={
    "jsonrpc": st.just("2.0") | json_values, "id": st.integers(-2**65, 2**65) | st.text(max_size=10) | json_values,
    "method": st.sampled_from(METHODS) | json_values, "params": PARAMS | json_values,
    "result": json_values, "error": json_values})
NO_NEWLINE = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" "))
MCP_LINES = st.one_of(REQUESTS.map(_line), REQUESTS.map(_line), json_values.map(_line), NO_NEWLINE,
                      st.text(max_size=200).map(lambda t: t.replace("\n", " ").encode("utf-8", "surrogatepass")))


# --- the MCP line protocol against one long-lived `serve` ---------------------------------

def _expect(line: bytes):
    """What §4 says one line gets: None (no answer), ("error", code, id) or ("answer", id)."""
    if not line.strip():
        return None
    try:
        msg = msgspec.json.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return ("error", -32700, None)
    if not isinstance(msg, dict):
        return ("error", -32600, None)
    has_id = "id" in msg
    id_ = msg.get("id")
    if has_id and not (isinstance(id_, str) or (isinstance(id_, int) and not isinstance(id_, bool))):
        return ("error", -32600, None)
    if msg.get("jsonrpc") != "2.0":
        return ("error", -32600, id_ if has_id else None) if (has_id or "method" in msg) else None
    method = msg.get("method")
    if not isinstance(method, str):
        if has_id and ("result" in msg or "error" in msg):
            return None
        return ("error", -32600, id_ if has_id else None)
    params = msg.get("params", {})
    if params is not None and not isinstance(params, dict):
        return ("error", -32602, id_) if has_id else None
    if not has_id:
        return None
    return ("answer", id_)


class Wire:
    """Lines to and from a running `serve`, with a probe after each line."""

    def __init__(self, server: Server):
        self.s = server
        self.seen: list[dict] = []

    def _next(self, timeout: float) -> dict:
        line = self.s.lines.get(timeout=timeout)
        assert line is not None, f"serve ended: {self.s.stderr[-2000:]!r}"
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        return json.loads(line)

    def exchange(self, line: bytes, timeout: float = 20) -> list[dict]:
        """Send ``line`` and a ping; the answers that came before the ping's, and any to ``want``."""
        probe = f"probe-{uuid.uuid4().hex}"
        want = _expect(line)
        self.s.send_raw(line + b"\n" + json.dumps({"jsonrpc": "2.0", "id": probe, "method": "ping"}).encode() + b"\n")
        got, probed = [], False
        deadline = time.monotonic() + timeout
        need_id = want is not None and want[0] == "answer"
        while not probed or (need_id and not any(r.get("id") == want[1] for r in got)):
            r = self._next(max(0.01, deadline - time.monotonic()))
            if r.get("id") == probe:
                assert r.get("result") == {}, r
                probed = True
            else:
                got.append(r)
        return got


def _check_answers(line: bytes, got: list[dict]) -> None:
    want = _expect(line)
    if want is None:
        assert got == [], (line[:200], got)
        return
    assert len(got) == 1, (line[:200], got)
    r = got[0]
    assert r.get("jsonrpc") == "2.0"
    if want[0] == "error":
        assert r["id"] == want[2] and r["error"]["code"] == want[1], (line[:200], r)
        assert r["error"]["message"].strip()
        return
    assert r["id"] == want[1]
    if "error" in r:
        assert r["error"]["code"] in (-32601, -32602, -32022), (line[:200], r)  # never -32603
        assert r["error"]["message"].strip()
    else:
        res = r["result"]
        if res.get("isError"):
            text = res["content"][0]["text"]
            assert text.strip() and "internal error" not in text, (line[:200], res)


@pytest.fixture
def served(home):
    home.write("docs/plan.md", "The wombat census starts in March.\n")
    home.chat("owner-zq81", [{"role": "user", "text": "count the wombats"}])
    home.notes.write_text("- The owner likes wombats.\n")
    env = {"LNK_MEMORY_FROM": "1", "LNK_OWNER": "owner-zq81", "LNK_MEMORY_SPEC": '{"tokens": 300}'}
    with Server.start(home, env=env) as s:
        s.initialize()
        assert until(lambda: "indexing" not in s.call("search", {"query": "zz"}, thread="owner-zq81")["structuredContent"],
                     timeout=30)
        yield s


def test_mcp_lines_fuzzed_against_serve(served, home):
    before = tree_digest(home.folder, home.agent / "chats", home.agent / "skills") | {"notes": home.notes.read_bytes()}
    wire = Wire(served)
    tried = []

    @fuzz(1500)
    @given(MCP_LINES)
    def one(line):
        tried.append(line)
        _check_answers(line, wire.exchange(line))

    one()
    fixed = [b"", b"   ", b"\r", b"\x00", b"\xff\xfe\xfd", b"[" * 100000, b"{" * 50000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
             b"[" * 999 + b"]" * 999, b'"' + b"\\u0000" * 1000 + b'"', b"1e999", b"NaN", b"-", b"{}", b"[]", b"null",
             b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', b'{"jsonrpc":"2.0","id":true,"method":"ping"}',
             b'{"jsonrpc":"2.0","id":' + b"9" * 5000 + b',"method":"ping"}',
             b'{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"search","arguments":{"query":"' + b"w" * 5000 + b'"}}}',
             b'{"jsonrpc":"2.0","id":"y","method":"tools/call","params":{"name":"read","arguments":{"ref":"home/docs/plan.md","lines":[1,' + b"9" * 30 + b']}}}']
    for line in fixed:
        _check_answers(line, wire.exchange(line))
    # remember from every kind of thread that is not the owner's: refused, notes untouched
    for i, thread in enumerate(["agent-bob", "team-t1", "task-7", "stranger", "owner-zq8", "owner-zq81x", "Owner-zq81",
                                "owner-zq81\u200b", "\uff4fwner-zq81", " owner-zq81", "", "agent-owner-zq81"]):
        line = _line({"jsonrpc": "2.0", "id": f"r{i}", "method": "tools/call",
                      "params": {"name": "remember", "arguments": {"add": "intruder"}, "_meta": {"link.local/thread": thread}}})
        got = wire.exchange(line)
        assert len(got) == 1 and (got[0].get("error") or got[0]["result"]["isError"]), (thread, got)
    # a line over 8 MiB: -32600, skipped, the server goes on
    served.send_raw(b'{"jsonrpc":"2.0","id":"big","method":"ping","params":{"x":"' + b"a" * (8 << 20) + b'"}}\n')
    big = wire._next(20)
    assert big["error"]["code"] == -32600 and big["id"] is None
    # still alive, still right, nothing changed
    assert served.proc.poll() is None
    assert refs(served.call("search", {"query": "wombat census"}, thread="owner-zq81"))[0] == "home/docs/plan.md"
    after = tree_digest(home.folder, home.agent / "chats", home.agent / "skills") | {"notes": home.notes.read_bytes()}
    assert after == before
    assert sorted(p.name for p in home.notes.parent.iterdir()) == ["lnkmem", "notes.md"]
    print("mcp lines", len(tried))
    assert len(tried) >= min(50, int(1500 * SCALE))


# --- first lines and controls against one `serve-many` -------------------------------

KEY = "a1" * 32
BOUND = st.fixed_dictionaries({}, optional={
    "owner": st.sampled_from(["o1", "bad owner", ""]) | json_values, "key": st.sampled_from([KEY, "xyz"]) | json_values,
    "files": weird_text | json_values, "storage": st.fixed_dictionaries({}, optional={
        "socket": weird_text | json_values, "places": st.dictionaries(st.text(max_size=12), st.text(max_size=5)) | json_values}),
    "notes": st.sampled_from(["4 KB", "9" * 400 + " KB", "lots"]) | json_values,
    "index": st.sampled_from(["memory", "home", "elsewhere"]) | json_values, "extra": json_values})
BINDING = st.fixed_dictionaries({}, optional={"owner": st.sampled_from(["o1", "o9"]) | json_values,
                                               "agent": st.sampled_from(["a1", "a2"]) | json_values,
                                               "path": weird_text | json_values, "team": weird_text | json_values})
FIRST = st.fixed_dictionaries({}, optional={
    "agent": st.sampled_from(["a1", "a2", "", "a b", "x" * 200]) | json_values, "bound": BOUND | json_values,
    "team": st.fixed_dictionaries({}, optional={"id": weird_text, "named": weird_text, "writes": json_values}) | json_values,
    "changed": BINDING | json_values, "flush": BINDING | json_values, "end": BINDING | json_values, "hello": json_values})
FIRST_LINES = st.one_of(FIRST.map(_line), FIRST.map(_line), FIRST.map(_line), json_values.map(_line), NO_NEWLINE)


def _first(sock_path: Path, data: bytes, timeout: float = 40) -> tuple[dict, socket.socket]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(str(sock_path))
    try:
        s.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before it read it all: the answer is there to read
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = s.recv(65536)
        assert chunk, f"closed without an answer to {data[:100]!r}"
        buf += chunk
    assert buf.count(b"\n") == 1
    return json.loads(buf), s


def _closed(s: socket.socket) -> bool:
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return True
    except OSError:
        return True


def test_first_lines_and_controls_fuzzed_against_serve_many(tmp_path):
    h = Home(tmp_path / "a1")
    h.write("docs/d.md", "Platypus eggs hatch in ten days.\n")
    h.notes.write_text("- keep\n")
    agents = {"a1": agent_entry(h, env={"LNK_OWNER": "o1"})}
    sock = tmp_path / "run" / "m.sock"
    with Many(sock, agents, ["--stay"], env={"LNKMEM_FIRST_LINE_S": "1"}) as m:
        with m.hello("a1") as c:
            until(lambda: "indexing" not in c.search("x")["structuredContent"], timeout=20)
        before = tree_digest(h.folder, h.agent / "chats") | {"notes": h.notes.read_bytes()}
        kinds = {"ok": 0, "error": 0}

        @fuzz(250)
        @given(FIRST_LINES)
        def one(line):
            answer, s = _first(sock, line + b"\n")
            try:
                assert set(answer) in ({"ok"}, {"error"}), answer
                if "error" in answer:
                    kinds["error"] += 1
                    assert isinstance(answer["error"], str) and answer["error"].strip()
                    assert KEY not in answer["error"]
                    assert _closed(s)
                else:
                    kinds["ok"] += 1
                    assert answer == {"ok": True}
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        obj = None
                    if isinstance(obj, dict) and obj.get("agent") == "a1" and "bound" not in obj:  # a Hello
                        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
                        assert json.loads(s.makefile("rb").readline()) == {"jsonrpc": "2.0", "id": 1, "result": {}}
            finally:
                s.close()

        one()
        print("first lines", kinds)
        assert kinds["error"] > 50 and kinds["ok"] >= 1, kinds
        # the edges of a first line
        answer, s = _first(sock, b"{" + b" " * (1 << 20) + b"}\n")
        assert "over" in answer["error"] and _closed(s)
        answer, s = _first(sock, b'{"agent": "a1"', timeout=5)  # no newline: the 1 s limit of this run (else 10 s)
        assert "within" in answer["error"]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(b'{"agent": "a1"}')
        s.shutdown(socket.SHUT_WR)  # half-closed before the line ended
        assert "ended before" in json.loads(s.makefile("rb").readline())["error"]
        s.close()
        answer, s = _first(sock, b'{"agent": "a1", "zz": ' + b"[" * 5000 + b"]" * 5000 + b"}\n")
        assert "error" in answer and _closed(s)
        # nothing changed, and the service serves as before
        assert m.proc.poll() is None
        with m.hello("a1") as c:
            assert refs(c.search("platypus eggs")) == ["home/docs/d.md"]
            for bad in (b"not json\n", b"[" * 100000 + b"\n", b'{"jsonrpc":"2.0","id":9,"method":5}\n'):
                c.send_raw(bad)
                assert c.recv()["error"]["code"] in (-32700, -32600)
            assert c.request("ping")["result"] == {}
        assert tree_digest(h.folder, h.agent / "chats") | {"notes": h.notes.read_bytes()} == before


# --- $LNK_MEMORY_SPEC, Agents, sizes: in-process and through the program ------------------

SPEC_KEYS = ("model", "tokens", "notes", "engine")
SPECS = st.one_of(
    st.text(max_size=60),
    json_values.map(json.dumps),
    st.fixed_dictionaries({}, optional={"model": st.text(max_size=250) | json_values,
                                        "tokens": st.integers(-10, 2_000_000) | json_values,
                                        "notes": st.from_regex(r"\s*[0-9]{1,500}(\.[0-9]{1,5})?\s*(b|kb|KiB|MB|mib|GB|x)?\s*",
                                                               fullmatch=True) | json_values,
                                        "engine": json_values, "other": json_values}).map(json.dumps))


@fuzz(600)
@given(SPECS)
def test_spec_any_text(text):
    from lnkmem.memory.spec import notes_limit, parse_spec
    try:
        spec = parse_spec(text)
    except UsageError as e:
        msg = str(e)
        assert msg.startswith("LNK_MEMORY_SPEC: ") and len(msg) > 20
        try:
            obj = json.loads(text)
        except ValueError:
            return
        if isinstance(obj, dict):
            named = msg[len("LNK_MEMORY_SPEC: "):].split(":")[0]
            assert named in obj or "expected" in msg or "not valid JSON" in msg or "unknown field" in msg, (text, msg)
        return
    assert notes_limit(spec) >= 0 and 1 <= spec.tokens <= 1_000_000
    assert spec.model is None or (0 < len(spec.model) <= 200)


@fuzz(300)
@given(st.sampled_from(SPEC_KEYS), json_values)
def test_spec_wrong_value_names_its_key(key, value):
    from lnkmem.memory.spec import parse_spec
    try:
        parse_spec(json.dumps({key: value}))
    except UsageError as e:
        assert f"LNK_MEMORY_SPEC: {key}" in str(e) and "expected" in str(e), str(e)


def test_spec_and_agents_refused_by_the_program(home, tmp_path):
    for spec, key in [('{"tokens": 0}', "tokens"), ('{"tokens": "10"}', "tokens"), ('{"model": ""}', "model"),
                      ('{"model": "a\\u0007b"}', "model"), ('{"notes": "4 GB"}', "notes"), ('{"notes": 4}', "notes"),
                      ('{"colour": "red"}', "colour"), ("[]", "object"), ("{", "JSON"), ('{"model": "' + "m" * 201 + '"}', "model"),
                      ('{"engine": ' + "[" * 3000 + "]" * 3000 + "}", "engine"), ("\udcff", "")]:
        r = run_cli("command", *home.args(), env={"LNK_MEMORY_SPEC": spec})
        err = r.stderr.decode()
        assert r.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, (spec, err)
        assert err.startswith("lnk-lnkmem: LNK_MEMORY_SPEC") and key in err, (spec, err)
    r = run_cli("command", *home.args(), env={"LNK_MEMORY_SPEC": '{"notes": "' + "9" * 400 + ' KB"}'})
    assert r.returncode == 0, r.stderr  # absurd but valid: no limit, no crash
    good = agent_entry(home)
    for agents in ("[]", "{", '{"a1": {"argv": [], "x": ' + "[" * 5000 + "]" * 5000 + "}}"):  # not an object: exit 2
        r = run_cli("serve-many", str(tmp_path / "s" / "m.sock"), agents, timeout=20)
        err = r.stderr.decode()
        assert r.returncode == 2 and err.count("\n") == 1 and "Traceback" not in err, (agents[:80], err)
        assert "agents" in err, (agents[:80], err)
    # rev. 2 (§5.2): a bad entry is refused for its agent alone, one line in the log; env keys
    # beyond the model and the agent's names are ignored
    argv = json.dumps(good["argv"])
    for agents, words in [('{"a b": ' + json.dumps(good) + "}", "ID"),
                          ('{"a1": {"argv": ["/bin/sh", "-c", "id"]}}', "lnk-lnkmem"),
                          ('{"a1": {"argv": ["lnk-lnkmem", "serve", "rel", "rel2"]}}', "absolute"),
                          ('{"a1": {"argv": ' + argv[:-1] + ', "--spec", "{"]}}', "--spec"),
                          ('{"a1": {"argv": ' + argv + ', "env": {"LNK_MEMORY_MODEL": 5}}}', "LNK_MEMORY_MODEL"),
                          ('{"a1": {"argv": ' + argv + ', "env": {"K": 5, "LNK_MEMORY_SPEC": "{"}}}', None)]:
        r = run_cli("serve-many", str(tmp_path / "s" / "m.sock"), agents, timeout=20, env={"LNKMEM_LINGER_S": "0.1"})
        err = r.stderr.decode()
        assert r.returncode == 0 and "Traceback" not in err, (agents[:80], err)
        if words is None:
            assert err == "", err
        else:
            assert err.count("\n") == 1 and "is not served" in err and words in err, (agents[:80], err)


@fuzz(300)
@given(st.text(max_size=40) | st.from_regex(r"[0-9]{1,400}(\.[0-9]{0,3})?\s?[kKmM]?[iI]?[bB]?", fullmatch=True))
def test_sizes(text):
    from lnkmem.memory.spec import parse_size
    from lnkmem.core.wire import Spec
    import re
    from decimal import Decimal
    said = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(b|kb|kib|mb|mib|)\s*", text, re.IGNORECASE)
    try:
        n = parse_size(text)
        assert said, text  # a number and B, KB, KiB, MB or MiB: nothing else is a size
        unit = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2}[said[2].lower()]
        want = min(Decimal(said[1]) * unit, Decimal(2) ** 62)
        assert abs(n - want) <= max(1, want / 2**50), (text, n)  # (within a float's rounding)
    except ValueError as e:
        assert not said, text
        assert "not a size" in str(e)
        with pytest.raises(msgspec.ValidationError):  # what the spec accepts always parses
            msgspec.convert({"notes": text}, Spec)


AGENT_TEXT = st.one_of(st.text(max_size=80), json_values.map(json.dumps),
                       st.dictionaries(st.text(max_size=10) | st.just("a1"),
                                       st.fixed_dictionaries({}, optional={"argv": st.lists(st.text(max_size=12), max_size=6) | json_values,
                                                                           "env": st.dictionaries(st.text(max_size=10), st.text(max_size=10)) | json_values,
                                                                           "allow": json_values}),
                                       max_size=3).map(json.dumps))


@fuzz(300)
@given(AGENT_TEXT)
def test_agents_any_text(text):
    from lnkmem.serve.many import parse_agents
    try:
        out = parse_agents(text)
    except UsageError as e:
        assert str(e).startswith("agents: ") and "\n" not in str(e)
        return
    assert isinstance(out, dict)


# --- conversations, notes and threads: pure functions --------------------------------------

CHAT_LINES = st.one_of(
    json_values.map(json.dumps),
    st.fixed_dictionaries({}, optional={"role": st.sampled_from(["user", "assistant", "tool"]) | json_values,
                                        "text": st.text(max_size=50) | json_values, "at": json_values, "from": json_values,
                                        "content": st.lists(st.fixed_dictionaries({"type": st.just("text") | json_values,
                                                                                   "text": st.text(max_size=20) | json_values}))
                                        | json_values}).map(json.dumps),
    st.fixed_dictionaries({"type": st.sampled_from(["user", "assistant", "x"]) | json_values,
                           "message": st.fixed_dictionaries({}, optional={"role": json_values, "content": json_values}) | json_values,
                           "timestamp": json_values}).map(json.dumps),
    st.text(max_size=100), st.just("[" * 5000), st.just('{"role": "user", "text": "half'))


@fuzz(300)
@given(st.lists(CHAT_LINES, max_size=12), st.booleans())
def test_conversation_lines(lines, trailing):
    from lnkmem.index.text import chats
    data = "\n".join(lines) + ("\n" if trailing else "")
    msgs, skipped = chats.messages(data)
    nonblank = sum(1 for ln in data.split("\n") if ln.strip())
    assert len(msgs) + skipped == nonblank
    assert all(isinstance(m.role, str) and isinstance(m.text, str) and m.line >= 1 for m in msgs)
    pieces, _ = chats.chunk_conversation("t.jsonl", data)
    assert all(1 <= p.first <= p.last for p in pieces)
    rendered = list(chats.render(data, 1, None))
    assert len(rendered) == len(msgs)


@fuzz(300)
@given(st.text(max_size=300), st.none() | weird_text, st.none() | weird_text, st.integers(0, 400))
def test_notes_changes_lose_nothing(current, add, remove, limit):
    try:
        change = notes_mod.apply(current, add, remove, limit)
    except ToolError as e:
        assert str(e).strip()
        return
    before = current.splitlines()
    after = change.text.splitlines()
    if remove is not None:  # exactly one line went
        assert len(after) == len(before) - 1 + (add is not None)
    kept = after[:-1] if add is not None else after
    assert all(line in before for line in kept)
    assert change.bytes == len(change.text.encode()) <= limit


@fuzz(400)
@given(weird_text | st.text(max_size=20), st.sampled_from(["o1", "owner-zq81", "", "agent-x"]), st.booleans())
def test_thread_rules(thread, owner, required):
    why = notes_refusal(thread, owner, required)
    if not required:
        assert why is None
        return
    mine = bool(owner) and bool(thread) and (thread == owner or thread.startswith(owner + "/")) \
        and not thread.startswith(("agent-", "team-", "task-"))
    assert (why is None) == mine, (thread, owner, why)
    if why is not None:
        assert why.strip()


# --- bridges and the model answering garbage -------------------------------------------------

from fakes.garbage_server import GARBAGE_MODES  # noqa: E402

FAST_MODES = [m for m in GARBAGE_MODES if m not in ("hang", "drip", "huge")]


@pytest.fixture(scope="module")
def garbage(tmp_path_factory):
    d = tmp_path_factory.mktemp("garbage")
    g = FakeServer.start("fakes.garbage_server", "--unix", d / "g.sock")
    yield g
    g.stop()


def _garbage(g: FakeServer, **kw) -> None:
    status, _, body = g.request("POST", "/_garbage", kw)
    assert status == 200, body


# a dripping answer (a byte every 0.2 s, 1 MiB: 58 hours) is given up on by the client's own
# deadlines (a few seconds at the timeouts these tests give): it has stopped the drip well before
# this many bytes. Counted by the fake, not timed here: a loaded machine drips slower, never fails it
DRIP_GIVEN_UP_BY = 300


def _dripped(g: FakeServer) -> int:
    status, _, body = g.request("GET", "/_garbage")
    assert status == 200, body
    return json.loads(body)["dripped"]


@fuzz(30)
@given(st.sampled_from(GARBAGE_MODES), st.integers(1, 80), st.sampled_from([None, 1, 2]))
def test_embedder_against_garbage(garbage, mode, n, count):
    from lnkmem.bridges.embed import Circuit, Embedder, EmbeddingUnavailable
    kw = {"mode": mode, "count": count}
    if mode == "huge":
        kw["size"] = 65 << 20
    if mode in ("drip", "hang"):
        kw["delay"] = 0.2 if mode == "drip" else 1.5
    _garbage(garbage, **kw)
    e = Embedder(garbage.listen, "m", timeout=0.5, attempts=2, circuit=Circuit(0.01))
    try:
        v = e.embed([f"text {i}" for i in range(n)], patient=bool(n % 2))
        # a vector a text, all of one width, unit length: the width is the model's own (a model
        # answering one number a text, consistently, is taken at its word; wrongdims does that
        # for two texts), never a mix of widths (two batches of one call answered differently)
        assert v.ndim == 2 and v.shape[0] == n and v.shape[1] >= 1, v.shape
        assert np.isfinite(v).all() and np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-3)
    except EmbeddingUnavailable as ex:
        assert str(ex).strip()
    finally:
        e.close()
        dripped = _dripped(garbage)
        _garbage(garbage, mode="ok")
    assert dripped < DRIP_GIVEN_UP_BY, dripped


def test_a_model_answering_one_call_at_two_widths_is_refused_not_a_crash(tmp_path):
    """A call's texts go out in batches of MAX_BATCH; a model that answers one batch 8 wide and
    the next 4 wide is the model's fault, said so (EmbeddingUnavailable, which the embedding pass
    backs off from), not a ValueError out of numpy; the same model answering one width is taken."""
    from lnkmem.bridges.embed import MAX_BATCH, Circuit, Embedder, EmbeddingUnavailable
    srv = FakeServer.start("fakes.embedding_server", "--unix", tmp_path / "e.sock", "--dim", "8",
                           "--model", "m", "--widths", "8,4")
    texts = [f"text {i}" for i in range(MAX_BATCH + 1)]

    def embedder():  # (a fresh circuit each: the refusal opens one)
        return contextlib.closing(Embedder(srv.listen, "m", timeout=5, attempts=1, circuit=Circuit(0.01)))
    try:
        with embedder() as e, pytest.raises(EmbeddingUnavailable, match="4 wide for some texts and 8"):
            e.embed(texts)
        with embedder() as e:
            assert e.embed(texts).shape == (MAX_BATCH + 1, 8)
    finally:
        srv.stop()


@fuzz(40)
@given(st.sampled_from(GARBAGE_MODES), st.sampled_from(["list", "read", "clist", "cget", "put", "bind"]),
       st.sampled_from([None, 1]))
def test_bridge_places_against_garbage(garbage, mode, op, count):
    from lnkmem.bridges.http import BridgeClient, BridgeDown, Refused
    from lnkmem.bridges.place import Conflict, Forbidden, NotFound
    from lnkmem.bridges.remote import Collection, FilesPlace
    kw = {"mode": mode, "count": count}
    if mode == "huge":
        kw["size"] = 8 << 20
    if mode in ("drip", "hang"):
        kw["delay"] = 0.2 if mode == "drip" else 1.5
    _garbage(garbage, **kw)
    c = BridgeClient(garbage.socket_path, "files", "o1", "a1", KEY, timeout=0.5, patience=0.3)
    fp, co = FilesPlace(c), Collection(c, "memory", root="lnkmem")
    try:
        if op == "list":
            out = fp.list("")
            assert all(e.path and ".." not in e.path.split("/") and not e.path.startswith("/") for e in out)
        elif op == "read":
            fp.read("docs/garbage.md")
        elif op == "clist":
            co.list("")
        elif op == "cget":
            co.get("manifest.json")
        elif op == "put":
            co.write(f"x-{uuid.uuid4().hex}.bin", b"abc", None)
        else:
            c.bind(0.5)
    except (BridgeDown, NotFound, Forbidden, Conflict, Refused) as ex:
        assert str(ex).strip() and KEY not in str(ex)
    finally:
        c.close()
        dripped = _dripped(garbage)
        _garbage(garbage, mode="ok")
    assert dripped < DRIP_GIVEN_UP_BY, dripped


@fuzz(300)
@given(st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()) |
       st.fixed_dictionaries({"entries": st.lists(st.fixed_dictionaries(
           {}, optional={"path": weird_text | json_values, "name": weird_text | json_values,
                         "size": st.integers(-5, 10**12) | json_values, "version": st.text(max_size=5) | json_values}),
           max_size=4)}).map(lambda v: json.dumps(v).encode()))
def test_bridge_list_decoders(body):
    import httpx
    from lnkmem.bridges.http import BridgeDown
    from lnkmem.bridges.remote import collection_listing, files_listing, listing_entries
    for dec in (files_listing, collection_listing):
        try:
            listing_entries(dec, httpx.Response(200, content=body), "list")
        except BridgeDown as e:
            assert "not understood" in str(e)


def test_bound_session_rides_out_garbage_bridges_and_model(tmp_path):
    """A bound session whose bridges and model talk nonsense: every call is answered,
    refusals say why, and once they talk sense again the index recovers."""
    run = tmp_path / "run"
    g = FakeServer.start("fakes.garbage_server", "--unix", run / "g.sock")
    try:
        gs = str(run / "g.sock")
        _garbage(g, mode="wrongshape", path="/v1/list", count=1)  # the very first listing is nonsense
        flags = ["--files-bridge", gs, "--storage-bridge", gs, "--cache", str(tmp_path / "cache"),
                 "--embed", "m", "--embed-url", g.listen]
        line = {"agent": "a1", "bound": {"owner": "o1", "key": KEY, "files": gs, "notes": "4 KB",
                                         "storage": {"socket": gs, "places": {"conversations": "b", "memory": "b"}}}}
        with Many(tmp_path / "m" / "m.sock", {}, flags, env={"LNKMEM_WRITEBACK_S": "0.2"}) as m, m.connect(timeout=60) as c:
            assert c.first(line) == {"ok": True}
            assert until(lambda: "home/docs/garbage.md" in refs(c.search("quokkas", sources=["home"])), timeout=20), \
                "the index never recovered from one bad listing"
            for mode in FAST_MODES:
                _garbage(g, mode=mode, count=3)
                for tool, args in (("search", {"query": "quokkas"}), ("list", {"ref": "home/docs"}),
                                   ("read", {"ref": "home/docs/garbage.md"}), ("read", {"ref": "chats/t1.jsonl"}),
                                   ("remember", {"add": f"after {mode}"})):
                    r = c.call(tool, args)
                    if r["isError"]:
                        assert r["content"][0]["text"].strip() and KEY not in json.dumps(r)
                with m.connect(timeout=60) as ctl:
                    a = ctl.first({"changed": {"owner": "o1", "agent": "a1", "path": "home/docs"}})
                    assert a == {"ok": True} or a["error"].strip()
                _garbage(g, mode="ok")
            assert m.proc.poll() is None
            assert set(refs(c.search("quokkas", sources=["home", "chats"]))) == {"home/docs/garbage.md", "chats/t1.jsonl"}
            assert c.call("remember", {"add": "the end"})["isError"] is False
            with m.connect(timeout=60) as ctl:
                assert ctl.first({"flush": {"owner": "o1", "agent": "a1"}}) == {"ok": True}
    finally:
        g.stop()


def test_garbage_conversation_files_are_skipped_not_fatal(home):
    chats = home.agent / "chats"
    (chats / "bin.jsonl").write_bytes(os.urandom(5000))
    (chats / "latin.jsonl").write_bytes('{"role": "user", "text": "caf\xe9 ocelot"}\n'.encode("latin-1"))
    (chats / "deep.jsonl").write_text("[" * 100000 + "\n" + '{"role": "user", "text": "ocelot deep"}\n')
    (chats / "huge.jsonl").write_text('{"role": "user", "text": "' + "ocelot " * 700000 + '"}\n')  # over 4 MiB
    (chats / "long.jsonl").write_text('{"role": "user", "text": "' + "lynx " * 200000 + 'ocelot"}\n')
    (chats / "half.jsonl").write_text('{"role": "user", "text": "ocelot whole"}\n{"role": "user", "text": "ocelot ha')
    (chats / "types.jsonl").write_text("\n".join(json.dumps(x) for x in [
        {"role": 5, "text": "ocelot"}, {"role": "user", "text": ["ocelot"]}, {"role": "user", "content": [{"type": "image"}]},
        {"type": "user", "message": "ocelot"}, {"type": "user", "message": {"content": [{"type": "text", "text": "ocelot harness"}]}},
        None, [], "ocelot", {"role": "user", "text": "ocelot fine", "at": {"when": 1}}]) + "\n")
    (chats / "t.compact.md").write_bytes(b"ocelot compact \xff\xfe\n")
    (chats / ".hidden.jsonl").write_text('{"role": "user", "text": "ocelot hidden"}\n')
    with Server.start(home) as s:
        s.wait_indexed()
        found = set(refs(s.search("ocelot", limit=50)))
        assert {"chats/latin.jsonl", "chats/deep.jsonl", "chats/half.jsonl", "chats/types.jsonl",
                "chats/t.compact.md", "chats/long.jsonl"} <= found
        assert not found & {"chats/huge.jsonl", "chats/.hidden.jsonl", "chats/bin.jsonl"}
        for name in ("bin.jsonl", "deep.jsonl", "half.jsonl", "types.jsonl", "huge.jsonl", "long.jsonl"):
            r = s.call("read", {"ref": f"chats/{name}"})
            assert not r["isError"] or r["content"][0]["text"].strip()
        assert s.request("ping")["result"] == {}


# --- atheris: coverage-guided, for a longer look at the pure parsers ----------------------------

def _atheris(argv: list[str]) -> None:
    """``python tests/test_fuzz.py -max_total_time=60`` (libFuzzer flags): the parsers under
    atheris, which steers by coverage; any exception but the documented refusals is a crash."""
    import sys

    import atheris  # pip install atheris: not a dependency, only for this longer run
    import httpx

    from lnkmem.bridges.http import BridgeDown
    from lnkmem.bridges.remote import collection_listing, files_listing, listing_entries
    from lnkmem.index.text import chats
    from lnkmem.serve.many import parse_agents
    from lnkmem.memory.spec import notes_limit, parse_spec
    from lnkmem.core.wire import FirstLine, decode
    atheris.instrument_all()

    def one(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        which = fdp.ConsumeIntInRange(0, 5)
        raw = fdp.ConsumeBytes(fdp.remaining_bytes())
        text = raw.decode("utf-8", "replace")
        try:
            if which == 0:
                decode(raw, FirstLine)
            elif which == 1:
                notes_limit(parse_spec(text))
            elif which == 2:
                parse_agents(text)
            elif which == 3:
                chats.messages(text)
                chats.chunk_conversation("t.jsonl", text)
                list(chats.render(text, 1, None))
            elif which == 4:
                listing_entries(files_listing if len(raw) % 2 else collection_listing, httpx.Response(200, content=raw), "list")
            else:
                half = len(text) // 2
                notes_mod.apply(text[:half], text[half:] or None, text[half:half + 8] or None, 4000)
        except (ValueError, UsageError, BridgeDown, ToolError):
            pass

    atheris.Setup(argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    import sys
    _atheris(sys.argv)


# --- the index copy's files (§7.2 rev. 2, issue 11) ------------------------------------

def test_copy_files_fuzzed(tmp_path):
    """Truncate, flip, inflate, rename and swap the copy's files: every variant is
    refused as damaged, or loads into a cache that opens and answers."""
    import random
    from lnkmem.bridges.place import NotFound
    from lnkmem.replica.load import load
    from lnkmem.replica.manifest import CopyDamaged, blob_name
    from lnkmem.index.rank.search import bm25
    from lnkmem.index.store import Store
    from tests.test_copy_verify import OF, check_copy, store_copy
    mine = store_copy(tmp_path / "a", {f"d/f{i}.md": f"alpha{i} beta gamma {i}\n" * 3 for i in range(12)}, OF)
    theirs = store_copy(tmp_path / "b", {"x.md": "private zucchini\n"}, "agent o1/a2")
    rng = random.Random(11)
    names = [n for n in mine if n != "manifest.json"]
    outcomes = {"damaged": 0, "loaded": 0}
    deadline = time.monotonic() + 20 * SCALE
    for i in range(int(400 * SCALE)):
        if time.monotonic() > deadline:
            break
        files = dict(mine)
        op = rng.choice(["truncate", "flip", "inflate", "rename", "swap", "manifest", "drop"])
        victim = rng.choice(names + ["manifest.json"])
        data = files[victim]
        if op == "truncate":
            files[victim] = data[: rng.randrange(len(data))]
        elif op == "flip":
            b = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            files[victim] = bytes(b)
        elif op == "inflate":
            raw = zlib.decompress(data) if victim != "manifest.json" else data
            files[victim] = zlib.compress(raw + bytes(rng.randrange(1 << 22)))
        elif op == "rename" and victim != "manifest.json":
            files[blob_name(victim.split("-")[0], data + b"x")] = files.pop(victim)
        elif op == "swap":
            files = dict(theirs) if rng.random() < 0.5 else {**files, "manifest.json": theirs["manifest.json"]}
        elif op == "manifest":
            m = json.loads(files["manifest.json"])
            key = rng.choice(["segments", "pages", "head", "dict", "vectors", "model", "of", "format"])
            m[key] = rng.choice([None, [], ["../x"], "seg-" + "0" * 40 + "-9.bin", 3, [names[0]] * 2, [[names[0]]]])
            files["manifest.json"] = json.dumps(m).encode()
        elif op == "drop" and victim != "manifest.json":
            del files[victim]
        try:
            v = check_copy(files)
        except (CopyDamaged, NotFound):  # a missing file: damaged too once the manifest is seen again
            outcomes["damaged"] += 1
            continue
        store = Store.open(str(tmp_path / "cache" / str(i)))
        load(store, v, "v1")
        live = store.snapshot.live
        store.close()
        again = Store(store.path)  # the cache opens and answers
        assert again.snapshot.live == live
        bm25(again, "alpha3 beta", 5)
        again.close()
        outcomes["loaded"] += 1
    print("copy fuzz", outcomes)
    assert outcomes["damaged"] > 50, outcomes
