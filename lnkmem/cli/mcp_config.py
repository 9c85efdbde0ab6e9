"""`lnk-lnkmem mcp-config`: the setup for an MCP client, with absolute paths, ready to paste."""

from __future__ import annotations

import json
import os
import sys
from typing import Optional

from lnkmem.core.errors import UsageError
from lnkmem.cli.common import check_apart, check_folder, check_state, emit, program_path

CLIENTS = ("claude", "cursor", "vscode", "json")


def default_state(folder: str, agent: Optional[str]) -> str:
    if agent:
        return os.path.join(agent, "memory", "lnkmem")
    import hashlib
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    tag = hashlib.sha256(folder.encode()).hexdigest()[:8]
    name = os.path.basename(folder.rstrip("/")) or "root"
    return os.path.join(base, "lnkmem", f"{name}-{tag}")


def server_entry(program: str, folder: str, state: str, agent: Optional[str]) -> dict:
    args = ["serve", folder, state] + ([agent] if agent else [])
    entry: dict = {"command": program, "args": args}
    if agent:
        entry["env"] = {"LNK_MEMORY_NOTES": os.path.join(agent, "memory", "notes.md")}
    return entry


def mcp_config_text(client: str, name: str, entry: dict) -> tuple[str, str]:
    """(the snippet, where it goes) for one client."""
    import shlex
    if client == "claude":
        body = json.dumps({"type": "stdio", **entry})
        return (f"claude mcp add-json {shlex.quote(name)} {shlex.quote(body)}\n",
                "run this command (add `--scope user` to use it in every project)")
    if client == "vscode":
        return (json.dumps({"servers": {name: {"type": "stdio", **entry}}}, indent=2) + "\n",
                "put this in .vscode/mcp.json (or merge its \"servers\" into it)")
    where = ("put this in .cursor/mcp.json (or ~/.cursor/mcp.json)" if client == "cursor"
             else "merge this into your client's MCP servers (e.g. Claude Desktop's claude_desktop_config.json)")
    return json.dumps({"mcpServers": {name: entry}}, indent=2) + "\n", where


def cmd_mcp_config(args) -> int:
    where = list(args.where)
    if len(where) > 2:
        raise UsageError(f"mcp-config: too many arguments: {' '.join(where[2:])} (give a client and a folder)")
    client = where.pop(0) if len(where) == 2 else "json"
    if client not in CLIENTS:
        raise UsageError(f"mcp-config: unknown client {client!r} (choose from {', '.join(CLIENTS)})")
    from lnkmem.core.wire import ID_RE
    if not ID_RE.match(args.name) or args.name.endswith("\n"):
        raise UsageError(f"--name: {args.name!r} is not a plain name (letters, digits, '.', '_', '-')")
    folder = check_folder("folder", where[0])
    agent = check_folder("agent folder", args.agent) if args.agent is not None else None
    state = os.path.abspath(args.state) if args.state else default_state(folder, agent)
    check_apart(folder, state, agent)
    check_state(state, create=False)
    text, hint = mcp_config_text(client, args.name, server_entry(program_path(), folder, state, agent))
    emit(text)
    if sys.stderr.isatty():
        print(f"({hint})", file=sys.stderr)
    return 0
