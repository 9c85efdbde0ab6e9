"""JSON-RPC 2.0 / MCP over lines, for one session (§4).

Transport-agnostic: a transport feeds each received line to
:meth:`Session.handle` and gives a ``send`` callable for answers. Tool calls
run on a thread pool so that a slow call neither blocks other requests nor
its own cancellation. Dual-era: a request whose ``_meta`` names a protocol
version is served by the 2026-07-28 rules (``server/discover``, results with
``resultType``); ``initialize`` selects the classic rules.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Any, Callable, Optional

import msgspec

from lnkmem import __version__, tooldefs
from lnkmem.errors import ToolError
from lnkmem.wire import convert

log = logging.getLogger("lnkmem")

LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
MODERN_VERSIONS = ("2026-07-28",)
META_VERSION = "io.modelcontextprotocol/protocolVersion"
META_CAPS = "io.modelcontextprotocol/clientCapabilities"
META_SERVER = "io.modelcontextprotocol/serverInfo"
THREAD_KEY = "link.local/thread"
MAX_LINE = 8 * 1024 * 1024

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


class Session:
    """One MCP conversation with one client, over one memory."""

    def __init__(self, memory_for: Callable[[], Any], send: Callable[[bytes], None], pool: Executor,
                 first_call_error: Optional[str] = None):
        self._memory_for = memory_for  # the memory is looked up lazily: start fast
        self.send = send
        self.pool = pool
        self.inflight: dict[Any, asyncio.Future] = {}
        self.cancelled: set = set()
        self.tasks: set[asyncio.Task] = set()
        self.first_call_error = first_call_error
        self.calls = 0

    @property
    def memory(self):
        return self._memory_for()

    # --- entry point -------------------------------------------------------

    def too_long(self) -> None:
        self.send(error_line(None, INVALID_REQUEST, f"message over {MAX_LINE} bytes: skipped"))

    def handle(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            msg = _decoder.decode(line)
        except Exception:  # msgspec.DecodeError, RecursionError (too deep), ...
            self.send(error_line(None, PARSE_ERROR, "parse error: the line is not JSON"))
            return
        if not isinstance(msg, dict):
            self.send(error_line(None, INVALID_REQUEST, "invalid request: a message must be a JSON object"))
            return
        has_id = "id" in msg
        id_ = msg.get("id")
        if has_id and not _valid_id(id_):
            self.send(error_line(None, INVALID_REQUEST, "invalid request: `id` must be a string or an integer"))
            return
        if msg.get("jsonrpc") != "2.0":
            if has_id or "method" in msg:
                self.send(error_line(id_ if has_id else None, INVALID_REQUEST, 'invalid request: `jsonrpc` must be "2.0"'))
            return
        method = msg.get("method")
        if not isinstance(method, str):
            if has_id and ("result" in msg or "error" in msg):
                return  # a response to nothing we asked: ignore
            self.send(error_line(id_ if has_id else None, INVALID_REQUEST, "invalid request: `method` must be a string"))
            return
        params = msg.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            if has_id:
                self.send(error_line(id_, INVALID_PARAMS, "invalid params: `params` must be an object"))
            return
        if not has_id:
            self._notification(method, params)
            return
        try:
            self._request(id_, method, params)
        except RpcError as e:
            self.send(error_line(id_, e.code, e.message, e.data))
        except Exception as e:  # never die of a request
            log.exception("request %s failed", method)
            self.send(error_line(id_, INTERNAL, f"internal error: {type(e).__name__}"))

    # --- notifications -----------------------------------------------------

    def _notification(self, method: str, params: dict) -> None:
        if method == "notifications/cancelled":
            rid = params.get("requestId")
            if _valid_id(rid) and rid in self.inflight:
                self.cancelled.add(rid)
                self.inflight[rid].cancel()
        # notifications/initialized and anything else: nothing to answer

    # --- requests ----------------------------------------------------------

    def _modern(self, params: dict) -> Optional[str]:
        meta = params.get("_meta")
        if isinstance(meta, dict) and META_VERSION in meta:
            v = meta[META_VERSION]
            if v not in MODERN_VERSIONS:
                raise RpcError(UNSUPPORTED_VERSION, "Unsupported protocol version",
                               {"supported": list(MODERN_VERSIONS + LEGACY_VERSIONS), "requested": v})
            return v
        return None

    def _finish(self, result: dict, modern: Optional[str], cacheable: bool = False) -> dict:
        if modern:
            result["resultType"] = "complete"
            result.setdefault("_meta", {})[META_SERVER] = SERVER_INFO
            if cacheable:
                result["ttlMs"] = 0
                result["cacheScope"] = "private"
        return result

    def _request(self, id_, method: str, params: dict) -> None:
        if method == "initialize":
            wanted = params.get("protocolVersion")
            version = wanted if wanted in LEGACY_VERSIONS else LEGACY_VERSIONS[0]
            self.send(result_line(id_, {
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": SERVER_INFO,
                "instructions": INSTRUCTIONS,
            }))
            return
        if method == "server/discover":
            try:
                self._modern(params)
            except RpcError as e:
                self.send(error_line(id_, e.code, e.message, e.data))
                return
            self.send(result_line(id_, self._finish({
                "supportedVersions": list(MODERN_VERSIONS + LEGACY_VERSIONS),
                "capabilities": {"tools": {}},
                "instructions": INSTRUCTIONS,
            }, MODERN_VERSIONS[0], cacheable=True)))
            return
        modern = self._modern(params)
        if method == "ping":
            self.send(result_line(id_, self._finish({}, modern)))
        elif method == "tools/list":
            names = tooldefs.tool_names(self.memory)
            self.send(result_line(id_, self._finish({"tools": [tooldefs.TOOLS[n] for n in names]}, modern, True)))
        elif method == "tools/call":
            self._call(id_, params, modern)
        else:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {method}")

    def _call(self, id_, params: dict, modern: Optional[str]) -> None:
        name = params.get("name")
        memory = self.memory
        if not isinstance(name, str) or name not in tooldefs.tool_names(memory):
            served = ", ".join(tooldefs.tool_names(memory))
            raise RpcError(INVALID_PARAMS, f"unknown tool: {name!r} (this memory serves {served})")
        meta = params.get("_meta")
        thread = meta.get(THREAD_KEY) if isinstance(meta, dict) else None
        if memory is not None and memory.cfg.from_required and not (isinstance(thread, str) and thread):
            raise RpcError(INVALID_PARAMS, f"the thread is missing: params._meta[{THREAD_KEY!r}] must name the conversation")
        if not isinstance(thread, str):
            thread = None
        args = params.get("arguments", {})
        if args is None:
            args = {}
        self.calls += 1
        if self.first_call_error:  # e.g. a team member not granted the whole folder
            self.send(result_line(id_, self._finish(_tool_error(self.first_call_error), modern)))
            return
        if not isinstance(args, dict):
            self.send(result_line(id_, self._finish(_tool_error("arguments: must be an object"), modern)))
            return
        try:
            typed = convert(args, tooldefs.ARGS[name])
        except ValueError as e:
            self.send(result_line(id_, self._finish(_tool_error(f"bad arguments: {e}"), modern)))
            return
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self.pool, _run_tool, memory, name, typed, thread)
        self.inflight[id_] = fut
        task = loop.create_task(self._answer(id_, fut, modern))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _answer(self, id_, fut: asyncio.Future, modern: Optional[str]) -> None:
        try:
            result = await fut
        except asyncio.CancelledError:
            result = None
        except Exception as e:
            log.exception("tool failed")
            result = _tool_error(f"internal error: {type(e).__name__}")
        finally:
            self.inflight.pop(id_, None)
        if id_ in self.cancelled:
            self.cancelled.discard(id_)
            return
        if result is not None:
            self.send(result_line(id_, self._finish(result, modern)))

    async def drain(self) -> None:
        """Wait for the answers of calls under way."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)


def _tool_error(message: str) -> dict:
    return {"content": [{"type": "text", "text": message}], "isError": True}


def _run_tool(memory, name: str, args, thread: Optional[str]) -> dict:
    from lnkmem import tools  # the index and its numpy: imported on the first call, not at start
    try:
        text, structured = tools.call(memory, name, args, thread)
    except ToolError as e:
        return _tool_error(str(e))
    except Exception as e:  # a place failing under the call: say so plainly
        from lnkmem.bridges.http import BridgeDown
        from lnkmem.bridges.place import Forbidden, NotFound
        if isinstance(e, BridgeDown):
            return _tool_error(f"{name}: Link's bridge is failing ({e}); nothing was changed, try again shortly")
        if isinstance(e, Forbidden):
            return _tool_error(f"{name}: not granted: {e}")
        if isinstance(e, NotFound):
            return _tool_error(f"{name}: not found: {e}")
        raise
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": False}


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
