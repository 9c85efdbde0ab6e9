"""JSON-RPC 2.0 / MCP over lines, for one session (§4, §5.1).

Transport-agnostic: a transport gives a ``send`` callable for answers and runs
:func:`pump`, which feeds each received line to :meth:`Session.handle`. Tool
calls run on a thread pool so that a slow call neither blocks other requests
nor its own cancellation; a search known to be cheap runs on the loop itself
(:mod:`lnkmem.protocol.inline`: bounded, measured per memory). Dual-era: a request whose ``_meta`` names the
2026-07-28 protocol is served by its rules (``server/discover``, results with
``resultType``); ``initialize`` selects the classic rules (batches at
2025-03-26).

Bounded work (§5.1): a session has at most ``MAX_INFLIGHT`` calls under way
and its transport reads no more input meanwhile, nor while answers wait
unread; waits (for the memory to be built, the index to open or finish its
first pass, a change to be indexed) are awaited on the event loop, never on a
pool thread; and one memory's calls hold at most ``THREADS_PER_MEMORY`` pool
threads at once, so that one agent's load never starves another's sessions.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from concurrent.futures import Executor
from typing import Any, Awaitable, Callable, Optional

import msgspec

from lnkmem import __version__
from lnkmem.protocol import budget, inline, tooldefs
from lnkmem.core.aio import LoopSignal, until
from lnkmem.core.errors import ToolError
from lnkmem.core.knobs import knobs
from lnkmem.core.wire import convert
from lnkmem.memory.served import MemoryHandle, ServedMemory

log = logging.getLogger("lnkmem")

LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
MODERN_VERSIONS = ("2026-07-28",)
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"
META_SERVER = "io.modelcontextprotocol/serverInfo"
THREAD_KEY = "link.local/thread"
MAX_LINE = 8 * 1024 * 1024
BATCH_VERSIONS = ("2025-03-26",)  # the one revision with JSON-RPC batches
MAX_INFLIGHT = 8  # calls under way per session; its input is not read beyond that
OUT_HIGH = 4 * 1024 * 1024  # answers waiting unread before a session's input is paused
THREADS_PER_MEMORY = 4  # pool threads one memory's calls may hold at once
OPEN_WAIT_S = 10.0  # a call waits this long for its memory and index to open
FIRST_PASS_WAIT_S = 2.0  # a search on an empty index waits this long for the first pass
# a call waiting for its memory to be made and its index opened (a restart) looks this often: a
# poll whose step grew to 50 ms saw them ~25 ms late on average, every restart's first answer
START_POLL_S = 0.005
INDEXED_WAIT_S = 10.0  # `remember` waits this long for its change to be searchable

PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL = -32700, -32600, -32601, -32602, -32603
UNSUPPORTED_VERSION = -32022

SERVER_INFO = {"name": "lnkmem", "version": __version__}
INSTRUCTIONS = (
    "This is the agent's memory. `search` finds passages in its Home files, conversations "
    "(chats), skills and notes by words (and by meaning when a model is served); each hit has "
    "a ref and a line range. `read` a ref (optionally with lines) for the full text, and `list` "
    "a ref to browse folders. `remember` adds or removes one line of the agent's notes, in the "
    "owner's conversations only; keep notes short and durable. Results are cut to a token budget "
    "and say when they were."
)

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


class RpcError(Exception):
    def __init__(self, code: int, message: str, data: Any = None):
        super().__init__(message)
        self.code, self.message, self.data = code, message, data


def error_line(id_, code: int, message: str, data: Any = None) -> bytes:
    err: dict = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return _encoder.encode({"jsonrpc": "2.0", "id": id_, "error": err})


def result_line(id_, result: dict) -> bytes:
    return _encoder.encode({"jsonrpc": "2.0", "id": id_, "result": result})


def _valid_id(x) -> bool:
    return (isinstance(x, str) or (isinstance(x, int) and not isinstance(x, bool)))


class MemoryShare:
    """What one memory's calls share across sessions: their share of the pool, its
    `remember` calls one at a time, and what its recent searches cost."""

    def __init__(self) -> None:
        self.threads = asyncio.Semaphore(THREADS_PER_MEMORY)
        self.notes_lock = asyncio.Lock()
        self.search_costs = inline.SearchCosts()


_shares: "weakref.WeakKeyDictionary[Any, MemoryShare]" = weakref.WeakKeyDictionary()


def _share(memory) -> MemoryShare:
    try:
        got = _shares.get(memory)
    except TypeError:  # not weakly referable: a share of its own
        return MemoryShare()
    if got is None:
        got = _shares[memory] = MemoryShare()
    return got


class Session:
    """One MCP conversation with one client, over one memory.

    ``memory_for`` gives the memory (:class:`MemoryHandle`): whether it is built,
    its config and whether it serves notes are known before it is, so that a
    session answers `tools/list` and waits for the memory without blocking the loop.
    """

    def __init__(self, memory_for: MemoryHandle, send: Callable[[bytes], None], pool: Executor,
                 first_call_error: Optional[str] = None):
        self.memory_for = memory_for  # the memory is looked up lazily: start fast
        self.send = send
        self.pool = pool
        self.inflight: dict[Any, asyncio.Task] = {}
        self.cancelled: set = set()
        self.tasks: set[asyncio.Task] = set()
        self.first_call_error = first_call_error
        self.calls = 0
        self.version: Optional[str] = None  # negotiated by `initialize`
        self.greeted = False  # the handle was told of the first message
        self._room: Optional[asyncio.Event] = None

    @property
    def memory(self) -> Optional[ServedMemory]:
        return self.memory_for()

    # --- what is known before the memory is built ---------------------------

    def _served(self) -> list[str]:
        notes = self.memory_for.serves_notes
        if notes is not None:
            return tooldefs.served_names(notes)
        return tooldefs.tool_names(self.memory)

    # --- flow control ---------------------------------------------------------

    def busy(self) -> bool:
        return len(self.tasks) >= MAX_INFLIGHT

    async def room(self) -> None:
        """Wait until fewer than MAX_INFLIGHT calls are under way."""
        while self.busy():
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if self._room is not None and not self.busy():
            self._room.set()

    def _start(self, coro: Awaitable) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    # --- entry point -------------------------------------------------------

    def too_long(self) -> None:
        self.send(error_line(None, INVALID_REQUEST, f"message over {MAX_LINE} bytes: skipped"))

    async def handle(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            msg = _decoder.decode(line)
        except Exception:  # msgspec.DecodeError, RecursionError (too deep), ...
            self.send(error_line(None, PARSE_ERROR, "parse error: the line is not JSON"))
            return
        if isinstance(msg, list):
            await self._batch(msg)
            return
        answer = self._message(msg)
        if isinstance(answer, bytes):
            self.send(answer)
        elif answer is not None:
            answer.add_done_callback(self._send_result)
        if not self.greeted:  # the first message answered (or its call begun): the memory may be made
            self.greeted = True
            self.memory_for.greeted()

    def _send_result(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is None and task.result() is not None:
            self.send(task.result())

    async def _batch(self, msgs: list) -> None:
        """A JSON-RPC batch: served in a 2025-03-26 session, answered as one array."""
        if self.version not in BATCH_VERSIONS:
            self.send(error_line(None, INVALID_REQUEST,
                                 "invalid request: batches are served only in 2025-03-26 sessions"
                                 + (f" (this session speaks {self.version})" if self.version else "")))
            return
        if not msgs:
            self.send(error_line(None, INVALID_REQUEST, "invalid request: an empty batch"))
            return
        answers: list = []
        for msg in msgs:
            await self.room()
            a = self._message(msg)
            if a is not None:
                answers.append(a)
        if not answers:
            return  # notifications only: nothing to answer

        async def together() -> None:
            lines = []
            for a in answers:
                if isinstance(a, bytes):
                    lines.append(a)
                else:
                    await asyncio.wait([a])
                    line = None if a.cancelled() or a.exception() is not None else a.result()
                    if line is not None:
                        lines.append(line)
            if lines:
                self.send(b"[" + b",".join(lines) + b"]")

        self._start(together())

    def _message(self, msg) -> "Optional[bytes | asyncio.Task]":
        """One JSON-RPC message: its answer now (bytes), later (a task giving the
        line, or None when it was cancelled), or none."""
        if not isinstance(msg, dict):
            return error_line(None, INVALID_REQUEST, "invalid request: a message must be a JSON object")
        has_id = "id" in msg
        id_ = msg.get("id")
        if has_id and not _valid_id(id_):
            return error_line(None, INVALID_REQUEST, "invalid request: `id` must be a string or an integer")
        if msg.get("jsonrpc") != "2.0":
            if has_id or "method" in msg:
                return error_line(id_ if has_id else None, INVALID_REQUEST, 'invalid request: `jsonrpc` must be "2.0"')
            return None
        method = msg.get("method")
        if not isinstance(method, str):
            if has_id and ("result" in msg or "error" in msg):
                return None  # a response to nothing we asked: ignore
            return error_line(id_ if has_id else None, INVALID_REQUEST, "invalid request: `method` must be a string")
        params = msg.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            if has_id:
                return error_line(id_, INVALID_PARAMS, "invalid params: `params` must be an object")
            return None
        if not has_id:
            self._notification(method, params)
            return None
        try:
            answer = self._request(id_, method, params)
        except RpcError as e:
            return error_line(id_, e.code, e.message, e.data)
        except Exception as e:  # never die of a request
            log.exception("request %s failed", method)
            return error_line(id_, INTERNAL, f"internal error: {type(e).__name__}")
        if isinstance(answer, bytes):
            return answer
        task = self._start(answer)  # a tool call: answered when done
        self.inflight[id_] = task
        task.add_done_callback(lambda t, i=id_: self._call_done(i, t))
        return task

    def _call_done(self, id_, task: asyncio.Task) -> None:
        if self.inflight.get(id_) is task:
            del self.inflight[id_]
            self.cancelled.discard(id_)

    # --- notifications -----------------------------------------------------

    def _notification(self, method: str, params: dict) -> None:
        if method == "notifications/cancelled":
            rid = params.get("requestId")
            if _valid_id(rid) and rid in self.inflight:
                self.cancelled.add(rid)
                self.inflight[rid].cancel()
        # notifications/initialized and anything else: nothing to answer

    # --- requests ----------------------------------------------------------

    def _era(self, method: str, params: dict) -> Optional[str]:
        """The 2026-07-28 version when this request is of that era, else None
        (classic rules); RpcError when its `_meta` is malformed or names a
        version not served."""
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, dict):
            raise RpcError(INVALID_PARAMS, "invalid params: `_meta` must be an object")
        meta = meta or {}
        modern_keys = META_VERSION in meta or META_CAPS in meta
        if not modern_keys and method != "server/discover":
            return None  # a classic request (after `initialize`, or without one)
        if META_VERSION not in meta:
            raise RpcError(INVALID_PARAMS, f"invalid params: `_meta` must hold {META_VERSION!r}")
        v = meta[META_VERSION]
        if not isinstance(v, str):
            raise RpcError(INVALID_PARAMS, f"invalid params: `_meta[{META_VERSION!r}]` must be a string")
        if v not in MODERN_VERSIONS + LEGACY_VERSIONS:
            raise RpcError(UNSUPPORTED_VERSION, "Unsupported protocol version",
                           {"supported": list(MODERN_VERSIONS + LEGACY_VERSIONS), "requested": v})
        if v in LEGACY_VERSIONS:
            return None  # listed in supportedVersions: served, by that version's (classic) rules
        caps = meta.get(META_CAPS)
        if caps is None:
            raise RpcError(INVALID_PARAMS, f"invalid params: `_meta` must hold {META_CAPS!r}")
        if not isinstance(caps, dict):
            raise RpcError(INVALID_PARAMS, f"invalid params: `_meta[{META_CAPS!r}]` must be an object")
        return v

    def _finish(self, result: dict, modern: Optional[str], cacheable: bool = False) -> dict:
        if modern:
            result["resultType"] = "complete"
            result.setdefault("_meta", {})[META_SERVER] = SERVER_INFO
            if cacheable:
                result["ttlMs"] = 0
                result["cacheScope"] = "private"
        return result

    def _request(self, id_, method: str, params: dict):
        if method == "initialize":
            wanted = params.get("protocolVersion")
            version = wanted if wanted in LEGACY_VERSIONS else LEGACY_VERSIONS[0]
            self.version = version
            return result_line(id_, {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": SERVER_INFO,
                "instructions": INSTRUCTIONS,
            })
        modern = self._era(method, params)
        if method == "server/discover":
            return result_line(id_, self._finish({
                "supportedVersions": list(MODERN_VERSIONS + LEGACY_VERSIONS),
                "capabilities": {"tools": {}},
                "instructions": INSTRUCTIONS,
            }, modern, cacheable=True))
        if method == "ping":
            return result_line(id_, self._finish({}, modern))
        if method == "tools/list":
            cursor = params.get("cursor")
            if cursor is not None:  # every tool fits one page: no cursor was ever given out
                raise RpcError(INVALID_PARAMS, "invalid params: `cursor` names no page of tools/list")
            names = self._served()
            return result_line(id_, self._finish({"tools": [tooldefs.TOOLS[n] for n in names]}, modern, True))
        if method == "tools/call":
            return self._call(id_, params, modern)
        raise RpcError(METHOD_NOT_FOUND, f"method not found: {method}")

    def _call(self, id_, params: dict, modern: Optional[str]):
        name = params.get("name")
        served = self._served()
        if not isinstance(name, str) or name not in served:
            raise RpcError(INVALID_PARAMS, f"unknown tool: {name!r} (this memory serves {', '.join(served)})")
        args = params.get("arguments", {})
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise RpcError(INVALID_PARAMS, "invalid params: `arguments` must be an object")
        meta = params.get("_meta")
        thread = meta.get(THREAD_KEY) if isinstance(meta, dict) else None
        cfg = self.memory_for.config()
        if cfg is not None and cfg.from_required and not (isinstance(thread, str) and thread):
            raise RpcError(INVALID_PARAMS, f"the thread is missing: params._meta[{THREAD_KEY!r}] must name the conversation")
        if not isinstance(thread, str):
            thread = None
        self.calls += 1
        room = cfg.budget if cfg is not None else None
        if self.first_call_error:  # e.g. a team member not granted the whole folder
            return result_line(id_, self._finish(_tool_error(self.first_call_error, room), modern))
        try:
            checked = tooldefs.validate_arguments(name, args)
            typed = convert(checked, tooldefs.ARGS[name])
        except ValueError as e:
            return result_line(id_, self._finish(_tool_error(f"bad arguments: {e}", room), modern))
        return self._answer(id_, name, typed, thread, modern)

    async def _answer(self, id_, name: str, typed, thread: Optional[str], modern: Optional[str]) -> Optional[bytes]:
        try:
            result = await self._run(name, typed, thread)
        except asyncio.CancelledError:
            result = None
        except Exception as e:
            log.exception("tool failed")
            result = _tool_error(f"internal error: {type(e).__name__}")
        if id_ in self.cancelled:
            self.cancelled.discard(id_)
            return None
        if result is None:
            return None
        return result_line(id_, self._finish(result, modern))

    async def _run(self, name: str, typed, thread: Optional[str]) -> dict:
        """The call: every wait on the loop, only the work itself on a pool thread. A
        search is counted among its memory's ``searches`` from its arrival to its answer:
        a memory that was just started looks at its sources once none waits."""
        searches = self.memory_for.searches if name == "search" else None
        if searches is None:
            return await self._tool(name, typed, thread)
        with searches:
            result = await self._tool(name, typed, thread)
            log.debug("a search answered")
            return result

    async def _tool(self, name: str, typed, thread: Optional[str]) -> dict:
        if not await until(self.memory_for.is_built, OPEN_WAIT_S, START_POLL_S):
            return _tool_error("the memory is still starting; try again in a moment")
        memory = self.memory
        room = memory.cfg.budget if memory is not None else None
        if name == "search" and memory is not None:  # the one tool that reads the index
            await until(memory.opened.is_set, OPEN_WAIT_S, START_POLL_S)  # the tool says plainly if it is not
            if memory.fresh:
                await until(memory.ready.is_set, FIRST_PASS_WAIT_S)
            # a store driver's listing under way (§3.5): never more than 2 s
            await until(memory.conversations_idle, knobs().driver_wait_s)
        share = _share(memory)
        loop = asyncio.get_running_loop()
        if name == "remember":
            async with share.notes_lock, share.threads:  # one thread of this memory waits on its notes, not many
                result = await self._work(_run_tool, memory, name, typed, thread, room)
            if not result.get("isError"):
                done = LoopSignal(loop)
                memory.changed("notes", wait=False, done=done)  # searchable right after
                try:
                    await asyncio.wait_for(asyncio.shield(done.future), INDEXED_WAIT_S)
                except asyncio.TimeoutError:
                    pass
            return result
        if name != "search":
            async with share.threads:
                return await self._work(_run_tool, memory, name, typed, thread, room)
        costs = share.search_costs
        if inline.runs_inline(costs, memory, typed):  # cheap: on the loop, no thread handed over
            t0 = time.thread_time()  # (the loop's CPU: a wait for the GIL is not the search's cost)
            try:
                return _run_tool(memory, name, typed, thread, room)
            finally:
                costs.record(time.thread_time() - t0)
        async with share.threads:
            result, cost = await self._work(_measured, memory, name, typed, thread, room)
        costs.record(cost)
        return result

    async def _work(self, fn, *args):
        """``fn`` on a pool thread. Cancelled before it starts, it never runs; once
        running, its slot stays taken until the thread is really free."""
        cf = self.pool.submit(fn, *args)
        fut = asyncio.wrap_future(cf)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if not cf.cancel():
                await asyncio.wait([fut])
                if not fut.cancelled():
                    fut.exception()  # retrieved: the answer is dropped, as cancelled
            raise

    async def drain(self) -> None:
        """Wait for the answers of calls under way."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


def _tool_error(message: str, room: Optional[int] = None) -> dict:
    if room is not None:
        message = fit(message, room)
    return {"content": [{"type": "text", "text": message}], "isError": True}


def fit(text: str, room: int) -> str:
    """``text`` within ``room`` bytes: whole lines while they fit, then how many more."""
    if budget.nbytes(text) <= room:
        return text
    lines = text.split("\n")
    kept: list[str] = []
    used = 0
    for i, line in enumerate(lines):
        more = f"… and {len(lines) - i} more lines"
        n = budget.nbytes(line) + 1
        if used + n + budget.nbytes(more) > room:
            if kept:
                return "\n".join(kept + [more])
            break
        kept.append(line)
        used += n
    return budget.cut(text, room)[0]


def _run_tool(memory, name: str, args, thread: Optional[str], room: Optional[int] = None) -> dict:
    from lnkmem.protocol import tools  # the index and its numpy: imported on the first call, not at start
    try:
        text, structured = tools.call(memory, name, args, thread, wait=False)
    except ToolError as e:
        return _tool_error(str(e), room)
    except Exception as e:  # a place failing under the call: say so plainly
        from lnkmem.bridges.place import BridgeDown, Forbidden, NotFound
        if isinstance(e, BridgeDown):
            return _tool_error(f"{name}: Link's bridge is failing ({e}); nothing was changed, try again shortly", room)
        if isinstance(e, Forbidden):
            return _tool_error(f"{name}: not granted: {e}", room)
        if isinstance(e, NotFound):
            return _tool_error(f"{name}: not found: {e}", room)
        raise
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": False}


def _measured(memory, name: str, args, thread: Optional[str], room: Optional[int] = None) -> tuple[dict, float]:
    """:func:`_run_tool` on a pool thread, and the thread's CPU seconds it took (its
    waits for the GIL, shared with other threads, are not its cost)."""
    t0 = time.thread_time()
    result = _run_tool(memory, name, args, thread, room)
    return result, time.thread_time() - t0


async def pump(session: Session, read: Callable[[], Awaitable[bytes]], drain: Callable[[], Awaitable[None]]) -> None:
    """Feed a transport's input to ``session`` line by line, reading no more while
    the session has MAX_INFLIGHT calls under way or its answers wait unread
    (``drain`` returns once few enough do); at end of input, wait for the answers."""
    lines = LineBuffer()
    while True:
        await drain()
        chunk = await read()
        if not chunk:
            for ln in lines.end():
                await session.room()
                await session.handle(ln)
            break
        for ln in lines.feed(chunk):
            await session.room()
            await drain()
            if ln is None:
                session.too_long()
            else:
                await session.handle(ln)
    await session.drain()


class LineBuffer:
    """Splits a byte stream into lines, skipping (and reporting) over-long ones."""

    def __init__(self, limit: int = MAX_LINE):
        self.limit = limit
        self.buf = bytearray()
        self.skipping = False

    def feed(self, data: bytes):
        """Yields each complete line, or None for a line that was too long."""
        self.buf += data
        while True:
            i = self.buf.find(b"\n")
            if i < 0:
                if len(self.buf) > self.limit:
                    if not self.skipping:
                        self.skipping = True
                        yield None
                    self.buf.clear()
                return
            line = bytes(self.buf[:i])
            del self.buf[: i + 1]
            if self.skipping:
                self.skipping = False
                continue
            if len(line) > self.limit:
                yield None
                continue
            yield line

    def end(self):
        if self.buf and not self.skipping:
            line = bytes(self.buf)
            self.buf.clear()
            yield line
