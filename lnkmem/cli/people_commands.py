"""The commands for people (PROTOCOL.md §1.5): their arguments, help lines and examples.

`index`, `search` (lnkmem/cli/people.py), `status` (lnkmem/cli/status.py), `notes-history`
(lnkmem/cli/notes_history.py), `mcp-config`
(lnkmem/cli/mcp_config.py) and `help`; :func:`describe` also gives the commands Link
runs a help line for every argument and an example. This module is imported by
every command, `serve` included, to build the parser: it holds help text only, and
the commands' modules are imported when their command runs.
"""

from __future__ import annotations

import argparse

from lnkmem.core.errors import UsageError

# --- help --------------------------------------------------------------------------

class _Help(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog):
        super().__init__(prog, max_help_position=30)


EXAMPLES = {
    "index": "example:\n  lnk-lnkmem index ~/Home ~/agent/memory/lnkmem --agent ~/agent",
    "search": "examples:\n  lnk-lnkmem search ~/Home ~/agent/memory/lnkmem --agent ~/agent how do we deploy\n"
              "  lnk-lnkmem search ~/Home ./state '\"release notes\" -draft' --sources home --under home/docs/ --json",
    "status": "example:\n  lnk-lnkmem status ~/Home ~/agent/memory/lnkmem --agent ~/agent --json",
    "mcp-config": "examples:\n  lnk-lnkmem mcp-config claude ~/Home --agent ~/agent    # prints a `claude mcp add-json` command\n"
                  "  lnk-lnkmem mcp-config cursor ~/Home > .cursor/mcp.json",
    "notes-history": "examples:\n  lnk-lnkmem notes-history ~/agent/memory/lnkmem\n"
                     "  lnk-lnkmem notes-history ~/agent/memory/lnkmem --show 2\n"
                     "  lnk-lnkmem notes-history ~/agent/memory/lnkmem --agent ~/agent --restore 2",
    "help": "example:\n  lnk-lnkmem help search",
    "install": "example:\n  HOME=~/agent/memory/lnkmem lnk-lnkmem install",
    "command": "example:\n  LNK_MEMORY_SPEC='{\"tokens\": 2000}' lnk-lnkmem command ~/Home ~/agent/memory/lnkmem ~/agent",
    "serve": "example:\n  lnk-lnkmem serve ~/Home ~/agent/memory/lnkmem ~/agent",
    "serve-many": "example:\n  lnk-lnkmem serve-many /run/user/1000/mem/mem.sock \"$(cat agents.json)\" --stay",
}

# help lines for the arguments of the commands Link runs (their parsers live in cli.py)
ARG_HELP = {
    "folder": "Home: the folder to search",
    "state": "the one folder the engine writes (its index), e.g. <agent>/memory/lnkmem",
    "agent": "the agent folder holding chats/, skills/ and memory/ (optional)",
    "socket": "the Unix socket to serve on (its folder is made 0700)",
    "agents": "JSON text: {agent id: {\"argv\": [...], \"env\": {...}}} (optional with --cache or --embed)",
    "stay": "never end for want of sessions",
    "cache": "DIR: where bound agents' index caches live",
    "embed": "MODEL: the embedding model served for bound agents",
    "embed_url": "URL: that model's endpoint",
    "peer": "USER: serve this user's connections too (name or uid)",
    "group": "GROUP: make the socket 0660, owned by this group",
    "files_bridge": "SOCKET: Link's files bridge",
    "storage_bridge": "SOCKET: Link's storage bridge",
    "bridges": "DIR: a folder holding the bridges' sockets",
    "spec": "JSON: the agent's [tool.memory] (wins over $LNK_MEMORY_SPEC)",
    "notes": "PATH: the notes file; serves `remember` (wins over $LNK_MEMORY_NOTES)",
    "from": "every call names its conversation (as $LNK_MEMORY_FROM=1)",
    "from_": "every call names its conversation (as $LNK_MEMORY_FROM=1)",
}


def describe(parser: argparse.ArgumentParser) -> None:
    """Give every subcommand an example and every argument a help line (where none is set)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for name, sub in action.choices.items():
            sub.formatter_class = _Help
            if sub.epilog is None and name in EXAMPLES:
                sub.epilog = EXAMPLES[name]
            for a in sub._actions:
                if a.help is None and a.dest in ARG_HELP:
                    a.help = ARG_HELP[a.dest]


def _folder_args(s: argparse.ArgumentParser, agent_positional: bool = True) -> None:
    s.add_argument("folder", help="Home: the folder to search")
    s.add_argument("state", help="the folder for the index (made when missing), e.g. <agent>/memory/lnkmem")
    if agent_positional:
        s.add_argument("old_agent", nargs="?", metavar="agent", help=argparse.SUPPRESS)
    s.add_argument("--agent", metavar="DIR", help="the agent folder holding chats/, skills/ and memory/")


def add_parsers(sub) -> None:
    s = sub.add_parser("index", help="build or refresh the index, with a progress bar",
                       description="Build or refresh the index of Home (and the agent's chats, skills and notes).\n"
                                   "A bar on a terminal; a summary line at the end; Ctrl-C stops cleanly (run again to finish).")
    _folder_args(s)
    s = sub.add_parser("search", help="print ranked hits for a query",
                       description="Search the index (refreshed first) and print ranked hits.\n"
                                   "Query syntax: \"an exact phrase\", -word (not this), word* (prefix), plain words.")
    _folder_args(s, agent_positional=False)
    s.add_argument("query", nargs="+", help="the words to look for (quote them or not)")
    s.add_argument("--limit", type=int, default=10, metavar="N", help="the most hits to print (1-100; default 10)")
    s.add_argument("--sources", action="append", metavar="LIST",
                   help="only these sources, comma-separated: home, chats, skills, notes")
    s.add_argument("--under", metavar="REF", help="only refs starting with this, e.g. home/projects/")
    s.add_argument("--after", metavar="DATE", help="only hits newer than this RFC 3339 date or date-time")
    s.add_argument("--before", metavar="DATE", help="only hits older than this RFC 3339 date or date-time")
    s.add_argument("--json", action="store_true", help="print one JSON document (the MCP tool's structuredContent)")
    s.add_argument("--budget", type=int, metavar="TOKENS",
                   help="cut the answer to this many tokens, as an agent sees it (default: no cut)")
    s = sub.add_parser("status", help="what is indexed, how big, how fresh, how much is embedded",
                       description="Say what the index holds, by source; its size, last change and pending changes;\n"
                                   "the model and how much is embedded; whether another process is building it;\n"
                                   "the ignore files in force. Changes nothing.")
    _folder_args(s)
    s.add_argument("--json", action="store_true", help="print one JSON document")
    s = sub.add_parser("notes-history", help="list, print or restore the notes' earlier versions",
                       description="The notes' earlier versions, kept in <state>/notes-history/: before `remember` replaces\n"
                                   "the notes, the text it replaces is kept there (and the text it writes), the newest 50\n"
                                   "at most ($LNKMEM_NOTES_KEEP). List them (1 is the newest), print one, or put one back:\n"
                                   "a restore is a change like `remember`'s, and the text it replaces is kept too.")
    s.add_argument("state", help="the engine's state folder, e.g. <agent>/memory/lnkmem")
    s.add_argument("--show", metavar="N", help="print version N (its number in the list, or its id)")
    s.add_argument("--restore", metavar="N", help="make version N the notes again")
    s.add_argument("--notes", metavar="PATH", help="the notes file to restore into (else $LNK_MEMORY_NOTES, "
                                                   "else <agent>/memory/notes.md)")
    s.add_argument("--agent", metavar="DIR", help="the agent folder (its memory/notes.md)")
    s.add_argument("--json", action="store_true", help="print the list as one JSON document")
    s.add_argument("--texts", action="store_true", help="with --json: each version's text too")
    s = sub.add_parser("mcp-config", help="print the setup for an MCP client (claude, cursor, vscode, json)",
                       usage="lnk-lnkmem mcp-config [-h] [claude|cursor|vscode|json] folder [--agent DIR] "
                             "[--state DIR] [--name NAME]",
                       description="Print, ready to paste, how to add this engine to an MCP client, with absolute paths.\n"
                                   "claude: a `claude mcp add-json` command; cursor: .cursor/mcp.json; vscode: .vscode/mcp.json;\n"
                                   "json: the usual {\"mcpServers\": ...} (Claude Desktop and most clients).")
    s.add_argument("where", nargs="+", metavar="[client] folder",
                   help="the client (claude, cursor, vscode or json; default json), then Home")
    s.add_argument("--agent", metavar="DIR", help="the agent folder (chats/, skills/, memory/notes.md)")
    s.add_argument("--state", metavar="DIR",
                   help="the index folder (default: <agent>/memory/lnkmem, or ~/.local/state/lnkmem/<name>)")
    s.add_argument("--name", default="lnkmem", help="the server's name in the client (default: lnkmem)")
    s = sub.add_parser("help", help="show the help of the program or of one command")
    s.add_argument("topic", nargs="?", metavar="command", help="the command to explain")


# --- help ------------------------------------------------------------------------------

def cmd_help(args, parser: argparse.ArgumentParser) -> int:
    if args.topic is None:
        parser.print_help()
        return 0
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices.get(args.topic)
            if sub is None:
                raise UsageError(f"help: no command named {args.topic!r} (commands: {', '.join(action.choices)})")
            sub.print_help()
            return 0
    return 0


def run(name: str, args) -> int:
    """Run a people command (imported only now)."""
    if name == "status":
        from lnkmem.cli.status import cmd_status
        return cmd_status(args)
    if name == "notes-history":
        from lnkmem.cli.notes_history import cmd_notes_history
        return cmd_notes_history(args)
    if name == "mcp-config":
        from lnkmem.cli.mcp_config import cmd_mcp_config
        return cmd_mcp_config(args)
    from lnkmem.cli import people
    return {"index": people.cmd_index, "search": people.cmd_search}[name](args)


COMMANDS = ("index", "search", "status", "notes-history", "mcp-config")
