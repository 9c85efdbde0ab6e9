"""`lnk-lnkmem`: the program Link runs (§1).

Every refusal is one line on stderr and exit 2; no traceback for bad input.
Heavy modules are imported only by the subcommand that needs them.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from typing import NoReturn, Optional

sys.dont_write_bytecode = True  # §2.2: no __pycache__ anywhere

from lnkmem.core import ownenv  # noqa: E402

ownenv.set_for_self()  # before anything imports numpy: no OpenBLAS threads spinning at start

from lnkmem.cli.common import PROG, program_path  # noqa: E402
from lnkmem.core import knobs  # noqa: E402
from lnkmem.core.errors import UsageError  # noqa: E402



class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        cmd = self.prog[len(PROG) + 1:]
        raise UsageError(f"{cmd + ': ' if cmd else ''}{message} (see {self.prog} --help)")


def _parser() -> _Parser:
    from lnkmem import __version__
    from lnkmem.cli import people_commands as cli_people
    p = _Parser(prog=PROG, description="lnkmem: a memory engine for Link agents (an MCP server)",
                epilog="Run `lnk-lnkmem COMMAND --help` for a command's arguments and an example.")
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="COMMAND")
    cli_people.add_parsers(sub)  # index, search, status, mcp-config, help: for people
    sub.add_parser("install", help="make the engine ready in $HOME")
    from lnkmem.memory.config import add_serve_flags
    for name, helptext in (("command", "print the Serve JSON for an agent"),
                           ("serve", "serve MCP over stdio")):
        s = sub.add_parser(name, help=helptext, allow_abbrev=False)
        s.add_argument("folder")
        s.add_argument("state")
        s.add_argument("agent", nargs="?")
        if name == "serve":
            add_serve_flags(s)  # §1.2: what `command` wrote into argv
    s = sub.add_parser("serve-many", help="serve many agents on a Unix socket")
    s.add_argument("socket")
    s.add_argument("agents", nargs="?")
    s.add_argument("--stay", action="store_true")
    s.add_argument("--cache")
    s.add_argument("--embed")
    s.add_argument("--embed-url")
    s.add_argument("--peer")
    s.add_argument("--group")
    s.add_argument("--files-bridge")
    s.add_argument("--storage-bridge")
    s.add_argument("--bridges")
    cli_people.describe(p)  # a help line for every argument, an example for every command
    return p


def _config(args, need_folder: bool = True):
    from lnkmem.memory.config import from_args
    return from_args(args.folder, args.state, args.agent, os.environ, need_folder=need_folder,
                     spec=getattr(args, "spec", None), notes=getattr(args, "notes", None),
                     from_flag=getattr(args, "from_", False), store_driver=getattr(args, "store_driver", None))


def cmd_install(args) -> int:
    from lnkmem.memory.spec import parse_spec
    parse_spec(os.environ.get("LNK_MEMORY_SPEC"))  # §1.1: like every command (exit 2)
    home = os.environ.get("HOME")
    if not home:
        print(f"{PROG}: install: HOME is not set", file=sys.stderr)
        return 1
    try:
        import httpx, lmdb, msgspec, numpy, snowballstemmer, watchfiles  # noqa: F401,E401
        check = os.path.join(home, "install-check")
        os.makedirs(check, mode=0o700, exist_ok=True)
        env = lmdb.open(check, map_size=1 << 20, max_dbs=1)
        with env.begin(write=True) as txn:
            txn.put(b"ok", b"1")
        env.close()
        shutil.rmtree(check, ignore_errors=True)
    except Exception as e:
        print(f"{PROG}: install: the engine cannot run here: {type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


def cmd_command(args) -> int:
    from lnkmem.core.wire import Serve, encode
    cfg = _config(args)
    # §1.2 rev. 2: argv alone carries everything the agent is served with
    argv = [program_path(), "serve", cfg.folder, cfg.state] + ([cfg.agent] if cfg.agent else []) + cfg.serve_flags()
    allow = ["search", "read", "list"] + (["remember"] if cfg.notes_path else [])
    serve = Serve(argv=argv, allow=allow, shared=True, programs=["link-documents"])
    if cfg.spec.model:
        serve.models, serve.model = True, cfg.spec.model
    sys.stdout.write(encode(serve).decode() + "\n")
    return 0


def cmd_serve(args) -> int:
    from lnkmem.serve.stdio import serve_stdio
    return serve_stdio(_config(args))


def cmd_serve_many(args) -> int:
    from lnkmem.serve.many import serve_many
    return serve_many(args)


COMMANDS = {"install": cmd_install, "command": cmd_command, "serve": cmd_serve, "serve-many": cmd_serve_many}


def main(argv: Optional[list[str]] = None) -> int:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("lnkmem: %(levelname)s: %(message)s"))
    try:
        level = knobs.check().log  # every LNKMEM_* knob, checked here, once
    except knobs.KnobError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    for name in ("lnkmem", "httpx", "httpcore") if level == "DEBUG" else ("lnkmem",):
        log = logging.getLogger(name)
        log.addHandler(handler)
        log.setLevel(level)
    import faulthandler
    import signal
    from lnkmem.core import memtrim
    memtrim.tune()  # before any thread: malloc arenas capped
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # a stack dump for people, on demand
    signal.signal(signal.SIGIO, signal.SIG_IGN)  # the notes' lease breaks (lnkmem.memory.notes) end nothing
    try:
        parser = _parser()
        if not (sys.argv[1:] if argv is None else argv):  # no arguments: the usage, as an error
            parser.print_help(sys.stderr)
            return 2
        args = parser.parse_args(argv)
        if args.cmd == "help":
            from lnkmem.cli.people_commands import cmd_help
            return cmd_help(args, parser)
        from lnkmem.cli import people_commands as cli_people
        if args.cmd in cli_people.COMMANDS:
            return cli_people.run(args.cmd, args)
        return COMMANDS[args.cmd](args)
    except UsageError as e:
        msg = " ".join(str(e).split())
        print(f"{PROG}: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
