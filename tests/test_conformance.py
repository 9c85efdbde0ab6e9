"""Conformance against the real clients (issue 10, Deliver 3).

The official `mcp` Python SDK drives the real `lnk-lnkmem serve` over stdio
(initialize or discover, list, call every tool, with the SDK's client-side
outputSchema validation on); every answer the engine gives, in each protocol
version it serves, is validated with `jsonschema` against that version's
official JSON schema, vendored in tests/schemas/ (see its README).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from tests.helpers import PROGRAM, Server, base_env

SCHEMAS = Path(__file__).resolve().parent / "schemas"
LEGACY = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}

jsonschema = pytest.importorskip("jsonschema", reason="`jsonschema` is not installed (pip install -e '.[test]')")


# --- the official schemas ------------------------------------------------------------

@functools.cache
def _root(version: str) -> dict:
    return json.loads((SCHEMAS / f"{version}.json").read_text())


@functools.cache
def _validator(version: str, name: str):
    root = _root(version)
    key = "$defs" if "$defs" in root else "definitions"
    assert name in root[key], f"{version} defines no {name}"
    schema = dict(root)
    schema["$ref"] = f"#/{key}/{name}"
    return jsonschema.validators.validator_for(root)(schema)


def valid(version: str, name: str, instance) -> None:
    errors = sorted(_validator(version, name).iter_errors(instance), key=lambda e: list(e.absolute_path))
    assert not errors, f"not a valid {name} of {version}: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in errors[:5])


def _old(version: str) -> bool:
    return version < "2025-11-25"


def check_result(version: str, msg: dict, result_type: str) -> dict:
    assert "result" in msg, msg
    valid(version, "JSONRPCResponse" if _old(version) else "JSONRPCResultResponse", msg)
    valid(version, result_type, msg["result"])
    return msg["result"]


def check_error(version: str, msg: dict, code: int, name: str = "") -> dict:
    assert "error" in msg and msg["error"]["code"] == code, msg
    envelope = name or ("JSONRPCError" if _old(version) else "JSONRPCErrorResponse")
    if msg.get("id") is None:
        # about a message whose id could not be read: JSON-RPC 2.0 (and §4) say `id: null`, which
        # the MCP schemas' RequestId does not allow; all else about the answer must be valid
        assert "id" in msg and msg["id"] is None
        msg = dict(msg, id=0)
    valid(version, envelope, msg)
    return msg["error"]


def check_tool_result(version: str, msg: dict, tool: dict) -> dict:
    r = check_result(version, msg, "CallToolResult")
    if not r.get("isError"):
        jsonschema.Draft202012Validator(tool["outputSchema"]).validate(r["structuredContent"])
    return r


# --- a Home with something to find --------------------------------------------------------

@pytest.fixture
def laid_out(home):
    home.write("docs/plan.md", "# Plan\n\nWe launch the rocket on Tuesday.\n")
    home.write("skills/cook/SKILL.md", "# Cooking\n\nBoil pasta in salted water.\n")
    home.chat("o1", [{"role": "user", "text": "Where is the spare key?", "at": "2026-03-01T10:00:00Z"}])
    home.notes.write_text("- The owner likes green tea.\n- same\n- same\n")
    return home


VALID_CALLS = [
    ("search", {"query": "rocket", "limit": 5, "sources": ["home", "chats"], "under": "home/"}),
    ("search", {"query": "spare key"}),
    ("read", {"ref": "home/docs/plan.md", "lines": [1, 3]}),
    ("read", {"ref": "chats/o1.jsonl"}),
    ("read", {"ref": "notes"}),
    ("list", {}),
    ("list", {"ref": "home/docs"}),
    ("remember", {"add": "The launch moved to Wednesday."}),
]
TOOL_ERRORS = [
    ("search", {"query": "x", "sources": ["home", "home"]}),
    ("read", {"ref": "home/../../etc/passwd"}),
    ("remember", {"remove": "same"}),
]


def _every_answer(s: Server, version: str, modern: bool) -> None:
    """Every kind of answer the engine gives, each validated against ``version``'s schema."""
    params = (lambda p: dict(p, _meta=META)) if modern else (lambda p: p)
    check_result(version, s.request("ping", params({})), "EmptyResult" if not modern else "Result")
    tools = check_result(version, s.request("tools/list", params({})), "ListToolsResult")["tools"]
    by_name = {t["name"]: t for t in tools}
    assert set(by_name) == {"search", "read", "list", "remember"}
    for t in tools:
        valid(version, "Tool", t)
        jsonschema.Draft202012Validator.check_schema(t["inputSchema"])
        jsonschema.Draft202012Validator.check_schema(t["outputSchema"])
    for name, args in VALID_CALLS:
        r = check_tool_result(version, s.request("tools/call", params({"name": name, "arguments": args}), 20), by_name[name])
        assert r["isError"] is False, (name, args, r)
    for name, args in TOOL_ERRORS:
        r = check_tool_result(version, s.request("tools/call", params({"name": name, "arguments": args})), by_name[name])
        assert r["isError"] is True
    check_error(version, s.request("nope/nope", params({})), -32601)
    check_error(version, s.request("tools/call", params({"name": "nope"})), -32602)
    check_error(version, s.request("tools/call", params({"name": "search", "arguments": [1]})), -32602)
    check_error(version, s.request("tools/list", params({"cursor": "x"})), -32602)
    s.send_raw(b"not json\n")
    check_error(version, s.recv(), -32700)
    s.send({"jsonrpc": "2.0", "id": 5})
    check_error(version, s.recv(), -32600)


@pytest.mark.parametrize("version", LEGACY)
def test_every_answer_fits_the_schema_of_the_negotiated_version(laid_out, version):
    with Server.start(laid_out) as s:
        init = s.initialize(version)
        result = check_result(version, init, "InitializeResult")
        assert result["protocolVersion"] == version
        s.wait_indexed()
        _every_answer(s, version, modern=False)


def test_every_2026_07_28_answer_fits_its_schema(laid_out):
    with Server.start(laid_out) as s:
        d = check_result(MODERN, s.request("server/discover", {"_meta": META}), "DiscoverResult")
        assert MODERN in d["supportedVersions"] and set(LEGACY) <= set(d["supportedVersions"])
        s.wait_indexed()
        _every_answer(s, MODERN, modern=True)


# --- the 2026-07-28 MUSTs (§4 rev. 2) ------------------------------------------------------

def test_2026_07_28_a_request_without_client_capabilities_is_invalid_params(laid_out):
    with Server.start(laid_out) as s:
        only_version = {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}
        for method, extra in (("tools/list", {}), ("ping", {}), ("server/discover", {}),
                              ("tools/call", {"name": "search", "arguments": {"query": "rocket"}})):
            check_error(MODERN, s.request(method, dict(only_version, **extra)), -32602)


def test_2026_07_28_a_discover_without_meta_is_invalid_params(laid_out):
    with Server.start(laid_out) as s:
        check_error(MODERN, s.request("server/discover"), -32602)
        check_error(MODERN, s.request("server/discover", {"_meta": {}}), -32602)
        no_version = {"_meta": {"io.modelcontextprotocol/clientCapabilities": {}}}
        check_error(MODERN, s.request("server/discover", no_version), -32602)


def test_2026_07_28_every_listed_version_is_served_and_others_are_unsupported(laid_out):
    with Server.start(laid_out) as s:
        d = check_result(MODERN, s.request("server/discover", {"_meta": META}), "DiscoverResult")
        for v in d["supportedVersions"]:
            meta = {"io.modelcontextprotocol/protocolVersion": v, "io.modelcontextprotocol/clientCapabilities": {}}
            r = s.request("tools/list", {"_meta": meta})
            assert "result" in r, (v, r)  # never -32022
            check_result(v, r, "ListToolsResult")
        bad = dict(META, **{"io.modelcontextprotocol/protocolVersion": "2024-01-01"})
        e = check_error(MODERN, s.request("tools/list", {"_meta": bad}), -32022, "UnsupportedProtocolVersionError")
        assert e["data"]["supported"] == d["supportedVersions"]


def test_2026_07_28_non_object_params_or_arguments_are_invalid_params(laid_out):
    with Server.start(laid_out) as s:
        for arguments in ([1], "rocket", 3):
            check_error(MODERN, s.request("tools/call", {"_meta": META, "name": "search", "arguments": arguments}), -32602)
        s.send({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": ["search"]})
        check_error(MODERN, s.recv(), -32602)


def test_2026_07_28_arguments_breaking_the_input_schema_are_tool_errors(laid_out):
    with Server.start(laid_out) as s:
        tools = {t["name"]: t for t in s.request("tools/list", {"_meta": META})["result"]["tools"]}
        for args, word in (({"query": "x", "sources": ["notes", "notes"]}, "sources"), ({"query": 1}, "query"),
                           ({"query": "x", "limit": "3"}, "limit"), ({"query": "x", "more": 1}, "more")):
            r = check_tool_result(MODERN, s.request("tools/call", {"_meta": META, "name": "search", "arguments": args}),
                                  tools["search"])
            assert r["isError"] is True and word in r["content"][0]["text"]


# --- batches: 2025-03-26 only ------------------------------------------------------------------

def test_batches_at_2025_03_26_fit_the_batch_response_schema(laid_out):
    with Server.start(laid_out) as s:
        s.initialize("2025-03-26")
        s.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"},
                {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list", "arguments": {}}},
                {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "nope"}}])
        batch = json.loads(s.lines.get(timeout=20))
        valid("2025-03-26", "JSONRPCBatchResponse", batch)
        assert [m["id"] for m in batch] == [1, 2, 3, 4]
        valid("2025-03-26", "ListToolsResult", batch[1]["result"])
        valid("2025-03-26", "CallToolResult", batch[2]["result"])
        s.send([])
        check_error("2025-03-26", s.recv(), -32600)
    for version in ("2025-06-18", "2025-11-25"):
        with Server.start(laid_out) as s:
            s.initialize(version)
            s.send([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
            check_error(version, s.recv(), -32600)


# --- the official SDK as a client --------------------------------------------------------------

def _sdk():
    try:
        import anyio
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
    except ImportError as e:
        pytest.skip(f"the official MCP Python SDK (`mcp`) cannot be imported here: {e}")
    return anyio, ClientSession, StdioServerParameters, stdio_client


@pytest.mark.parametrize("era", ["initialize", "discover"])
def test_the_official_sdk_calls_every_tool(laid_out, era):
    anyio, ClientSession, StdioServerParameters, stdio_client = _sdk()
    env = {k: v for k, v in base_env().items() if k in ("PATH", "HOME", "PYTHONDONTWRITEBYTECODE", "LANG")}
    env["LNK_MEMORY_NOTES"] = str(laid_out.notes)
    params = StdioServerParameters(command=PROGRAM, args=["serve", *laid_out.args()], env=env)
    seen: dict = {}

    async def main() -> None:
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                if era == "initialize":
                    init = await session.initialize()
                    seen["version"] = init.protocol_version
                    assert init.server_info.name == "lnkmem" and init.instructions
                else:
                    d = await session.discover()
                    seen["version"] = session.protocol_version
                    assert MODERN in d.supported_versions
                await session.send_ping()
                listed = await session.list_tools()  # the SDK keeps each outputSchema to check results with
                assert {t.name for t in listed.tools} == {"search", "read", "list", "remember"}
                for t in listed.tools:
                    assert t.output_schema and t.input_schema.get("additionalProperties") is False
                hits = []
                for _ in range(100):  # the first pass on a fresh state
                    r = await session.call_tool("search", {"query": "rocket"})
                    hits = r.structured_content["hits"]
                    if hits and "indexing" not in r.structured_content:
                        break
                    await anyio.sleep(0.1)
                assert hits and hits[0]["ref"] == "home/docs/plan.md"
                for name, args in VALID_CALLS:
                    r = await session.call_tool(name, args)  # raises if structuredContent breaks outputSchema
                    assert r.is_error is False, (name, args, r)
                    assert r.structured_content and r.content[0].type == "text"
                for name, args in TOOL_ERRORS:
                    r = await session.call_tool(name, args)
                    assert r.is_error is True and r.content[0].text

    anyio.run(main)
    assert seen["version"] == ("2025-11-25" if era == "initialize" else MODERN)
    assert "The launch moved to Wednesday." in laid_out.notes.read_text()


# --- the engine's validator agrees with the reference one on every published inputSchema ------

def test_the_engine_holds_arguments_to_exactly_the_published_input_schema():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from lnkmem.core.wire import convert
    from lnkmem.protocol import tooldefs

    scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 60), st.floats(-3, 60, allow_nan=False),
                        st.sampled_from(["", "x", "home", "chats", "skills", "notes", "web", "home/", "a" * 5]),
                        st.text(max_size=6))
    values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(st.text(max_size=3), inner, max_size=2)),
                          max_leaves=6)
    for name, tool in tooldefs.TOOLS.items():
        schema = tool["inputSchema"]
        keys = st.sampled_from(list(schema["properties"]) + ["extra"])
        reference = jsonschema.Draft202012Validator(schema)

        @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
        @given(st.dictionaries(keys, values, max_size=4))
        def agree(args):
            try:  # the whole way a call's arguments go: the schema, then the wire type
                convert(tooldefs.validate_arguments(name, args), tooldefs.ARGS[name])
                ours = True
            except ValueError:
                ours = False
            assert ours == reference.is_valid(args), (name, args)

        agree()
