"""`lnk-lnkmem serve-many`: one process, many agents, one Unix socket (§5).

One asyncio loop owns the socket and every MCP session; tool calls and index
work run on threads. Each agent's :class:`Memory` is opened once and shared
by all its sessions. A connection's peer is checked (SO_PEERCRED) before a
byte is read; its first line says what it is: a Hello, a Bound or team
session, or a control.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import pwd
import signal
import socket
import stat
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

from lnkmem.memory import changes
from lnkmem.serve.bound import Bindings, Job, close_s, stop_s
from lnkmem.serve.control import tell_changed
from lnkmem.memory.config import AgentConfig, check_id, from_serve_argv
from lnkmem.memory.served import Made, MemoryHandle
from lnkmem.core.errors import UsageError
from lnkmem.core.knobs import knobs
from lnkmem.protocol.mcp import OUT_HIGH, Session, pump
from lnkmem.core.wire import ID_RE, FirstLine, Ok, Refusal, decode, encode

log = logging.getLogger("lnkmem")

FIRST_LINE_MAX = 1024 * 1024
READ_CHUNK = 1 << 16


# --- the start: flags, agents, folder and socket ------------------------------------

@dataclass
class Options:
    socket: str
    agents: AgentsTable
    stay: bool
    cache: Optional[str]
    embed: Optional[str]
    embed_url: Optional[str]
    peer_uid: Optional[int]
    gid: Optional[int]
    files_bridge: Optional[str]
    storage_bridge: Optional[str]
    bridges: Optional[str]
    linger: float
    first_line_s: float


def _uid(user: str) -> int:
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise UsageError(f"--peer: no such user: {user}") from None


def _gid(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise UsageError(f"--group: no such group: {group}") from None


class AgentsTable(dict):
    """The agents served here (id -> AgentConfig), and those refused, with why (§5.2)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.refused: dict[str, str] = {}
        self.entries: dict[str, object] = {}  # a refused entry's raw value, looked at again later


ENTRY_KEYS = ("argv", "env")  # §5.2: what an Agents entry holds


def agent_config(agent: str, entry) -> AgentConfig:
    """One Agents entry as `serve` would serve its argv (§5.2); UsageError naming why not."""
    check_id("agent", agent)
    if not isinstance(entry, dict):
        raise UsageError("the entry must be an object with argv and env")
    if "argv" not in entry:
        raise UsageError("the entry has no argv")
    unknown = sorted(k for k in entry if k not in ENTRY_KEYS)
    if unknown:  # (nothing of an entry is ignored unseen: a key meant for the engine would be)
        raise UsageError(f"the entry has a key no entry holds: {ascii(unknown[0])} (an entry holds argv and env)")
    env = entry.get("env", {})
    if env is None:
        env = {}
    if not isinstance(env, dict):
        raise UsageError("env: must be an object")
    return from_serve_argv(entry["argv"], env)


def parse_agents(text: str) -> AgentsTable:
    """§5.2: the whole start fails only when <agents> is not a JSON object;
    a bad entry is refused for that agent alone (and logged)."""
    try:
        raw = decode(text, dict[str, Any])
    except ValueError as e:
        raise UsageError(f"agents: {e}") from None
    out = AgentsTable()
    states: dict[str, str] = {}
    for agent, entry in raw.items():
        try:
            cfg = agent_config(agent, entry)
            real = os.path.realpath(cfg.state)
            if real in states:
                raise UsageError(f"it shares the state folder {cfg.state} with agent {states[real]}")
        except UsageError as e:
            why = " ".join(str(e).split())
            out.refused[agent] = why
            out.entries[agent] = entry
            log.warning("agents: %s is not served: %s", ascii(agent)[1:-1] if not ID_RE.fullmatch(agent) else agent, why)
            continue
        states[real] = agent
        out[agent] = cfg
    return out


def parse_options(args) -> Options:
    from lnkmem.memory.spec import parse_spec
    parse_spec(os.environ.get("LNK_MEMORY_SPEC"))  # §1.4 rev. 3: like every subcommand (exit 2)
    if not os.path.isabs(args.socket) and not args.socket:
        raise UsageError("socket: an empty path")
    if bool(args.embed) != bool(args.embed_url):
        raise UsageError("--embed and --embed-url go together")
    if args.agents is None and not args.embed and not args.cache:
        raise UsageError("agents: missing (it may be left out only with --cache, or --embed and --embed-url)")
    agents = parse_agents(args.agents) if args.agents is not None else AgentsTable()
    for flag in ("files_bridge", "storage_bridge", "bridges", "cache"):
        v = getattr(args, flag)
        if v is not None and not os.path.isabs(v):
            raise UsageError(f"--{flag.replace('_', '-')}: not an absolute path: {v}")
    return Options(
        socket=os.path.abspath(args.socket), agents=agents, stay=args.stay, cache=args.cache,
        embed=args.embed, embed_url=args.embed_url,
        peer_uid=_uid(args.peer) if args.peer else None, gid=_gid(args.group) if args.group else None,
        files_bridge=args.files_bridge, storage_bridge=args.storage_bridge, bridges=args.bridges,
        linger=knobs().linger_s, first_line_s=knobs().first_line_s,
    )


def prepare_folder(folder: str, gid: Optional[int]) -> None:
    """§5.1: a folder no one else enters; made 0700 (0750 for --group) when ours."""
    me = os.geteuid()
    if not os.path.exists(folder):
        os.makedirs(folder, mode=0o700)
    st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"socket folder is not a folder: {folder}")
    if st.st_uid != me:
        raise UsageError(f"socket folder {folder} is owned by someone else (uid {st.st_uid})")
    if gid is not None:
        os.chown(folder, -1, gid)
        os.chmod(folder, 0o750)
    else:
        os.chmod(folder, 0o700)


def bind_socket(path: str, gid: Optional[int]) -> socket.socket:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise UsageError(f"socket: {path} exists and is not a socket; not removing it")
        os.unlink(path)  # a stale socket
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    if gid is not None:
        os.chown(path, -1, gid)
        os.chmod(path, 0o660)
    else:
        os.chmod(path, 0o600)
    sock.listen(128)
    sock.setblocking(False)
    return sock


def peer_uid(sock: socket.socket) -> Optional[int]:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return None
    _, uid, _ = struct.unpack("3i", creds)
    return uid


# --- the service ------------------------------------------------------------------------

TOOL_THREADS = 16  # the pool's threads for tool calls, every one started before the first session
# SIGTERM (or the linger's end): the open connections are given CONNECTIONS_S to end, then
# every binding and memory is ended at once (bound.close_s() for the write-backs, bound.stop_s()
# to stop): the process exits within about end_s() (85 s), however many agents it serves.
CONNECTIONS_S = 5.0


def end_s() -> float:
    """How long serve-many's end takes at most, about (its connections, then its bindings)."""
    return CONNECTIONS_S + close_s() + stop_s() + 5.0


def started_pool(n: int) -> ThreadPoolExecutor:
    """A pool of ``n`` threads for tool calls, all started now. A pool starts a thread at a
    call when none is idle, and the caller (the event loop) waits in ``Thread.start`` until
    the new thread runs: with the pool's other threads holding the GIL, milliseconds in which
    no session was read or answered (py-spy: bench_many's first round of 50 sessions)."""
    pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="lnkmem-tool")
    gate = threading.Barrier(n, timeout=10)  # each call held until n threads run one (none idle)

    def started() -> None:
        try:
            gate.wait()
        except threading.BrokenBarrierError:  # (a slow start: the rest start as calls come)
            pass

    for f in [pool.submit(started) for _ in range(n)]:
        f.result()
    return pool


class Service:
    def __init__(self, opts: Options):
        self.opts = opts
        self.pool = started_pool(TOOL_THREADS)
        self.memories: dict[str, object] = {}
        self.open_sessions = 0
        self.stopping: Optional[asyncio.Event] = None
        self.connections: set = set()  # (task, writer) of each connection being served
        self.linger_handle: Optional[asyncio.TimerHandle] = None
        self.allowed = {os.geteuid()} | ({opts.peer_uid} if opts.peer_uid is not None else set())
        self.bindings = Bindings(self)

    def refusal(self, agent: str) -> Optional[str]:
        """Why ``agent`` is not served from <agents> (§5.2), or None when it is.
        A refused entry is looked at again: a folder made since the start serves it."""
        agents = self.opts.agents
        if agent in agents:
            return None
        if agent not in agents.refused:
            return f"agent {agent} is not served here"
        try:
            cfg = agent_config(agent, agents.entries[agent])
            real = os.path.realpath(cfg.state)
            other = next((a for a, c in agents.items() if os.path.realpath(c.state) == real), None)
            if other is not None:
                raise UsageError(f"it shares the state folder {cfg.state} with agent {other}")
        except UsageError as e:
            agents.refused[agent] = " ".join(str(e).split())
            return f"agent {agent} is not served: {agents.refused[agent]}"
        del agents.refused[agent], agents.entries[agent]
        agents[agent] = cfg
        return None

    def memory(self, agent: str):
        m = self.memories.get(agent)
        if m is None:
            from lnkmem.memory.memory import Memory
            m = self.memories[agent] = Memory(self.opts.agents[agent]).start()
        return m

    # linger: end once no session has been open for a while
    def _arm_linger(self) -> None:
        if self.opts.stay or self.stopping is None:
            return
        if self.linger_handle:
            self.linger_handle.cancel()
        loop = asyncio.get_running_loop()
        self.linger_handle = loop.call_later(self.opts.linger, self._linger_end)

    def _linger_end(self) -> None:
        if self.open_sessions == 0:
            log.info("no session for %.1fs: ending", self.opts.linger)
            self.stopping.set()

    async def run(self, sock: socket.socket) -> None:
        self.stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        server = await asyncio.start_unix_server(self._connection, sock=sock, limit=FIRST_LINE_MAX + 2)
        self._arm_linger()
        async with server:
            await self.stopping.wait()
            server.close()
            await self._end_connections()
        await self._end_memories()

    async def _end_connections(self, timeout: float = CONNECTIONS_S) -> None:
        """A signal: close every open connection, so each session ends as at its
        client's close (its calls under way finish or are cancelled inside it),
        rather than being cancelled from outside by the loop's end."""
        for _, writer in list(self.connections):
            try:
                writer.transport.abort()
            except Exception:
                pass
        tasks = [t for t, _ in self.connections if t is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        uid = peer_uid(sock) if sock is not None else None
        if uid is None or uid not in self.allowed:
            writer.close()
            return
        self.open_sessions += 1
        if self.linger_handle:
            self.linger_handle.cancel()
            self.linger_handle = None
        me = (asyncio.current_task(), writer)
        self.connections.add(me)
        try:
            await self._serve_connection(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            # the loop ending: this task must not end cancelled (asyncio's stream
            # callback calls task.exception() on it, which raises and is logged)
            pass
        except Exception:
            log.exception("a connection failed")
        finally:
            self.connections.discard(me)
            self.open_sessions -= 1
            try:
                writer.close()
            except Exception:
                pass
            if self.open_sessions == 0:
                self._arm_linger()

    async def _first_line(self, reader: asyncio.StreamReader) -> tuple[Optional[bytes], Optional[str]]:
        try:
            line = await asyncio.wait_for(reader.readuntil(b"\n"), self.opts.first_line_s)
        except asyncio.TimeoutError:
            return None, f"no first line within {self.opts.first_line_s:g} s"
        except asyncio.LimitOverrunError:
            return None, f"the first line is over {FIRST_LINE_MAX} bytes"
        except asyncio.IncompleteReadError as e:
            if len(e.partial) > FIRST_LINE_MAX:
                return None, f"the first line is over {FIRST_LINE_MAX} bytes"
            return None, "the connection ended before its first line"
        if len(line) > FIRST_LINE_MAX + 1:
            return None, f"the first line is over {FIRST_LINE_MAX} bytes"
        return line, None

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, why = await self._first_line(reader)
        if line is None:
            await _reply(writer, Refusal(why))
            return
        try:
            first = decode(line, FirstLine)
        except ValueError as e:
            await _reply(writer, Refusal(f"first line: {e}"))
            return
        kind, why = classify(first)
        if why:
            await _reply(writer, Refusal(why))
            return
        if kind in ("changed", "flush", "end"):
            err = await self.control(kind, first)
            await _reply(writer, Refusal(err) if err else Ok())
            return
        if kind == "hello":
            why = self.refusal(first.agent)
            if why:
                await _reply(writer, Refusal(why))
                return
            memory = self.memory(first.agent)
            if memory.refused:  # its notes or state reached through a link (§2.2 rev. 3)
                self.memories.pop(first.agent, None)  # looked at again at the next Hello
                await _reply(writer, Refusal(f"agent {first.agent} is not served: {memory.refused}"))
                return
            await _reply(writer, Ok())
            await self.mcp(reader, writer, Made(memory))
            return
        # bound or team
        session, err = await self.bindings.open(first)
        if err:
            await _reply(writer, Refusal(err))
            return
        await _reply(writer, Ok())
        try:
            await self.mcp(reader, writer, Made(session.memory), session.first_call_error, session)
        finally:
            session.detach()

    async def mcp(self, reader, writer, memory_for: MemoryHandle, first_call_error: Optional[str] = None,
                  owner=None) -> None:
        """MCP over the connection, exactly as over stdio (§5.3), with the same
        bounds (§5.1): no more input is read while the session has its cap of
        calls under way or OUT_HIGH bytes of answers wait unread."""
        def send(data: bytes) -> None:
            if not writer.is_closing():
                writer.write(data + b"\n")

        writer.transport.set_write_buffer_limits(high=OUT_HIGH)

        async def drain() -> None:
            try:
                await writer.drain()
            except ConnectionError:
                pass

        session = Session(memory_for, send, self.pool, first_call_error)
        if owner is not None:  # (closed by its binding's end, from another thread)
            owner.serving(session, writer, asyncio.get_running_loop())
        await pump(session, lambda: reader.read(READ_CHUNK), drain)
        await drain()

    async def control(self, kind: str, first: FirstLine) -> Optional[str]:
        if kind == "changed":
            c = first.changed
            if self.bindings.holds(c.owner, c.agent):
                return await self.bindings.changed(c)
            cfg = self.opts.agents.get(c.agent)
            if cfg is None or (cfg.owner and cfg.owner != c.owner):
                return f"no agent {c.agent} of {c.owner} is served here"
            if c.team:
                return f"no team {c.team} of {c.agent} is served here"
            try:
                path = changes.clean(c.path)
            except ValueError as e:
                return f"changed: {e}"
            memory = self.memory(c.agent)
            if memory.refused:
                self.memories.pop(c.agent, None)
                return f"agent {c.agent} is not served: {memory.refused}"
            done = await tell_changed(memory, path)
            return None if done else "the change is still being indexed"
        b = first.flush if kind == "flush" else first.end
        if not self.bindings.holds(b.owner, b.agent):
            return f"no binding of agent {b.agent} of {b.owner} is held here"
        return await (self.bindings.flush(b) if kind == "flush" else self.bindings.end(b))

    async def _end_memories(self) -> None:
        """SIGTERM or the linger's end: every binding ended as `end` ends one (written back,
        then stopped) and every Hello agent's memory stopped, all at once, each whatever the
        others do; within end_s() together however many there are."""
        jobs = self.bindings.end_all() + self._stop_hello()
        await asyncio.get_running_loop().run_in_executor(None, _waited, jobs, end_s() - CONNECTIONS_S)

    def _stop_hello(self) -> list:
        jobs = [(f"agent {agent}", Job(m.stop)) for agent, m in list(self.memories.items())]
        self.memories.clear()
        return jobs

    def close(self) -> None:
        _waited(self._stop_hello(), stop_s())  # (none left after a run that ended as it should)
        self.pool.shutdown(wait=False, cancel_futures=True)


def _waited(jobs: list, within: float) -> None:
    """Wait for ``jobs`` ((what, bound.Job) each) ``within`` seconds together; say what failed
    or did not end in time."""
    deadline = time.monotonic() + within
    for what, job in jobs:
        if not job.wait(deadline):
            log.warning("%s: not ended within %g s", what, within)
        elif job.answer:
            log.warning("%s, at the end: %s", what, job.answer)


def classify(first: FirstLine) -> tuple[str, Optional[str]]:
    """Which kind of first line this is, or why it is none."""
    keys = [k for k in ("agent", "bound", "team", "changed", "flush", "end") if getattr(first, k) is not None]
    controls = [k for k in keys if k in ("changed", "flush", "end")]
    if controls:
        if len(keys) != 1:
            return "", f"a control line holds one of changed, flush or end, alone (got {', '.join(keys)})"
        return controls[0], None
    if first.agent is None:
        return "", "the first line names no agent"
    if first.team is not None and first.bound is None:
        return "", "team needs bound beside it"
    if first.bound is not None:
        return ("team" if first.team is not None else "bound"), None
    return "hello", None


async def _reply(writer: asyncio.StreamWriter, msg) -> None:
    writer.write(encode(msg) + b"\n")
    try:
        await writer.drain()
    except ConnectionError:
        pass


def serve_many(args) -> int:
    opts = parse_options(args)
    from lnkmem.serve.stdio import undumpable
    undumpable()  # §5.1: binding keys live in this process
    # (the allocator was tuned at start, cli.main: many agents' threads share two arenas)
    import lnkmem.memory.memory  # noqa: F401  (the index's imports now, not in the first Hello)
    import lnkmem.protocol.tools  # noqa: F401
    prepare_folder(os.path.dirname(opts.socket), opts.gid)
    try:
        sock = bind_socket(opts.socket, opts.gid)
    except OSError as e:
        raise UsageError(f"socket: cannot listen on {opts.socket}: {e.strerror}") from None
    ours = os.lstat(opts.socket).st_ino
    service = Service(opts)
    try:
        asyncio.run(service.run(sock))
    finally:
        service.close()
        try:  # remove our socket, never one a newer service made at that path since
            st = os.lstat(opts.socket)
            if stat.S_ISSOCK(st.st_mode) and st.st_ino == ours:
                os.unlink(opts.socket)
        except OSError:
            pass
    return 0
