"""The HTTP/1.1 server core every fake server shares.

One asyncio server on a Unix socket or a TCP port: keep-alive, bodies framed by
Content-Length (or chunked, on requests), a JSONL request log and fault
injection. A fake supplies only a handler, ``handler(Request) -> Response``
(a plain function or a coroutine function); it may raise ``HttpError``.
A request's path and query reach it percent-decoded exactly once, as a real
server decodes them (``decode_target``); a target no client may send is 400.

Control endpoints (never logged, never faulted, never authenticated):

- ``GET /_fault``: the fault now in force;
- ``POST /_fault`` with ``{"mode", "count"?, "delay"?, "retry_after"?, "path"?}``:
  set it (see ``Fault``);
- ``GET /_log``: ``{"entries": [...]}``, every request logged so far;
  ``DELETE /_log`` forgets them (the ``--log`` file is kept as it is).

Signals: SIGTERM/SIGINT stop the server (exit 0, the socket file removed);
SIGUSR1 listens again after a ``refuse`` fault.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import signal
import stat
import sys
import time
import traceback
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Awaitable, Callable
import re
from urllib.parse import parse_qs, unquote

MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024 * 1024

FAULT_MODES = ("ok", "503", "429", "500", "403", "slow", "drop", "lost", "trickle", "412", "down", "die", "refuse")
TRICKLE_PIECE = 64 * 1024
STATUS_MODES = ("503", "429", "500", "403")  # answer that status instead
WRITE_METHODS = ("PUT", "DELETE", "POST", "PATCH")


class HttpError(Exception):
    """Answer the request with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


@dataclass
class Request:
    method: str
    target: str  # the path and query exactly as sent
    path: str  # the path, percent-decoded
    query: dict[str, str]  # the first value of each parameter, decoded
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    agent: str | None = None  # set by a handler that knows who asked; logged

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name.lower(), default)

    def json(self) -> Any:
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise HttpError(400, "the body is not JSON") from None


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], "Response | Awaitable[Response]"]


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return Response(status, (json.dumps(obj) + "\n").encode(), h)


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return json_response({"error": message}, status, headers)


# ---------------------------------------------------------------- faults


@dataclass
class Fault:
    """What the next requests suffer.

    ``mode``:
      ok      answer normally;
      503/429 answer that status with ``Retry-After: <retry_after>``;
      500/403 answer that status;
      slow    wait ``delay`` seconds (default 1), then answer normally;
      drop    do the request, send the headers and half the body, close;
      lost    do the request, then close without answering (the answer lost
              after the change was made);
      trickle read the request's body and send the answer in pieces of 64 KiB,
              waiting ``delay`` seconds (default 0.05) before each: slow, but
              moving;
      412     conditional writes (PUT/DELETE/POST with If-Match or
              If-None-Match) fail 412 without being done; others pass;
      down    close each connection without answering (and, when set,
              every open connection at once); the server still listens;
      die     the process exits (status 3) right after answering /_fault;
      refuse  stop listening and close every connection, so connections are
              refused; SIGUSR1 (or ``delay`` seconds, when given) listens again.
    ``count``: how many affected requests it lasts, then back to ``ok``
    (None: until changed). ``path``: only requests whose path starts with it.
    """

    mode: str = "ok"
    count: int | None = None
    delay: float | None = None
    retry_after: int = 1
    path: str = ""

    @classmethod
    def parse(cls, obj: Any) -> "Fault":
        if not isinstance(obj, dict):
            raise HttpError(400, "a fault is a JSON object")
        unknown = set(obj) - {"mode", "count", "delay", "retry_after", "path"}
        if unknown:
            raise HttpError(400, f"unknown fault keys: {sorted(unknown)}")
        mode = str(obj.get("mode", "ok"))
        if mode not in FAULT_MODES:
            raise HttpError(400, f"mode must be one of {list(FAULT_MODES)}")
        count = obj.get("count")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise HttpError(400, "count must be a non-negative integer or null")
        delay = obj.get("delay")
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0):
            raise HttpError(400, "delay must be a non-negative number")
        retry_after = obj.get("retry_after", 1)
        if isinstance(retry_after, bool) or not isinstance(retry_after, int) or retry_after < 0:
            raise HttpError(400, "retry_after must be a non-negative integer")
        path = obj.get("path", "")
        if not isinstance(path, str):
            raise HttpError(400, "path must be a string")
        return cls(mode, count, None if delay is None else float(delay), retry_after, path)

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "count": self.count, "delay": self.delay,
                "retry_after": self.retry_after, "path": self.path}

    def affects(self, req: Request) -> bool:
        if self.mode in ("ok", "die", "refuse") or not req.path.startswith(self.path):
            return False
        if self.mode == "412":
            conditional = "if-match" in req.headers or "if-none-match" in req.headers
            return req.method in WRITE_METHODS and conditional
        return True

    def take(self, req: Request) -> str | None:
        """The mode this request suffers (None: none), counting it down."""
        if not self.affects(req):
            return None
        return count_down(self)


def count_down(fault) -> str | None:
    """One more request suffers ``fault.mode``: count it down, back to "ok" when spent."""
    mode = fault.mode
    if fault.count is not None:
        if fault.count <= 0:
            fault.mode, fault.count = "ok", None
            return None
        fault.count -= 1
        if fault.count == 0:
            fault.mode, fault.count = "ok", None
    return mode


# ---------------------------------------------------------------- request log


class RequestLog:
    """Every request, in memory and (with a path) as JSONL. Never credentials."""

    def __init__(self, path: str | None):
        self.entries: list[dict[str, Any]] = []
        self._file = open(path, "a", encoding="utf-8") if path else None

    def add(self, req: Request, status: int | None, resp: Response | None, fault: str | None) -> None:
        entry: dict[str, Any] = {
            "time": round(time.time(), 6),
            "method": req.method,
            "path": req.target,
            "status": status,
            "if_match": req.headers.get("if-match"),
            "if_none_match": req.headers.get("if-none-match"),
            "etag": resp.headers.get("ETag") if resp else None,
            "size": len(req.body),
            "sent": len(resp.body) if resp is not None and isinstance(resp.body, (bytes, bytearray)) else None,
        }
        if req.headers.get("authorization") is not None:  # that one was sent, never what it holds
            entry["auth"] = True
        if req.agent is not None:
            entry["agent"] = req.agent
        if fault is not None:
            entry["fault"] = fault
        self.entries.append(entry)
        if self._file:
            self._file.write(json.dumps(entry) + "\n")
            self._file.flush()


# ---------------------------------------------------------------- wire format


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       pace: Callable[[str, str], float] | None = None) -> Request | None:
    """The next request on the connection; None at a clean end of input. ``pace(method,
    path)``: seconds to wait before each 64 KiB of its body (0: read it at once)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if not e.partial.strip():
            return None
        raise HttpError(400, "incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "request head too large") from None
    lines = head.decode("latin-1").lstrip("\r\n").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, "bad request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "bad header line")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if version == "HTTP/1.0" and "connection" not in headers:
        headers["connection"] = "close"
    if headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    path, query = decode_target(target)
    body = await _read_body(reader, headers, pace(method.upper(), path) if pace else 0.0)
    return Request(method.upper(), target, path, query, headers, body)


# what a request target may hold (RFC 3986 origin-form: unreserved, sub-delims, ":", "@",
# "/", "?" and %XX escapes); anything else (a raw space, "#", non-ASCII byte, a "%" not
# followed by two hex digits) is a client that did not encode a name
_TARGET = re.compile(r"/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*")


def decode_target(target: str) -> tuple[str, dict[str, str]]:
    """The path and the query of a request target, each percent-decoded exactly once, as
    an HTTP server does (the path's ``+`` is itself; the query is form-encoded, so its
    ``+`` is a space): the first value of each parameter. HttpError(400) for a target no
    client may send, or whose escapes are not UTF-8."""
    if not _TARGET.fullmatch(target):
        raise HttpError(400, "bad request target (a name not percent-encoded?)")
    raw_path, _, raw_query = target.partition("?")
    try:
        path = unquote(raw_path, errors="strict")
        query = parse_qs(raw_query, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError:
        raise HttpError(400, "bad request target (an escape that is not UTF-8)") from None
    return path, {k: v[0] for k, v in query.items()}


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], pace: float = 0.0) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        total = 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise HttpError(400, "bad chunk size") from None
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_BODY:
                raise HttpError(413, "body too large")
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = headers.get("content-length")
    if length is None:
        return b""
    if not length.isdigit():
        raise HttpError(400, "bad Content-Length")
    if int(length) > MAX_BODY:
        raise HttpError(413, "body too large")
    if not pace:
        return await reader.readexactly(int(length))
    body, left = bytearray(), int(length)
    while left:
        await asyncio.sleep(pace)
        piece = await reader.readexactly(min(left, TRICKLE_PIECE))
        body += piece
        left -= len(piece)
    return bytes(body)


def encode_response(resp: Response, method: str, keep_alive: bool) -> tuple[bytes, bytes]:
    try:
        reason = HTTPStatus(resp.status).phrase
    except ValueError:
        reason = "Status"
    headers = {"Server": "lnkmem-fake"}
    headers.update(resp.headers)
    body = resp.body
    if resp.status in (204, 304):
        body = b""
        headers.pop("Content-Length", None)
    else:
        headers["Content-Length"] = str(len(body))
    if method == "HEAD":
        body = b""
    headers["Connection"] = "keep-alive" if keep_alive else "close"
    head = f"HTTP/1.1 {resp.status} {reason}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode("latin-1"), body


# ---------------------------------------------------------------- the server


class Server:
    def __init__(self, handler: Handler, *, unix: str | None = None, host: str = "127.0.0.1",
                 port: int | None = None, log: str | None = None, fault: Fault | None = None):
        if (unix is None) == (port is None):
            raise ValueError("give exactly one of unix and port")
        self.handler = handler
        self.unix = os.path.abspath(unix) if unix else None
        self.host = host
        self.port = port
        self.fault = fault or Fault()
        self.log = RequestLog(log)
        self._server: asyncio.AbstractServer | None = None
        self._conns: set[asyncio.StreamWriter] = set()
        self._relisten: asyncio.TimerHandle | None = None

    # ---- listening

    @property
    def listen_address(self) -> str:
        return f"unix:{self.unix}" if self.unix else f"http://{self.host}:{self.port}"

    @property
    def listening(self) -> bool:
        return self._server is not None

    async def start(self) -> None:
        if self._server is not None:
            return
        if self.unix:
            _clear_socket_path(self.unix)
            self._server = await asyncio.start_unix_server(self._connection, path=self.unix, limit=MAX_HEAD)
        else:
            self._server = await asyncio.start_server(self._connection, self.host, self.port, limit=MAX_HEAD)
            self.port = self._server.sockets[0].getsockname()[1]

    def stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self.close_connections()

    def close_connections(self, keep: asyncio.StreamWriter | None = None) -> None:
        for w in list(self._conns):
            if w is not keep:
                w.close()

    async def close(self) -> None:
        self.stop_listening()
        if self.unix:
            try:
                if stat.S_ISSOCK(os.lstat(self.unix).st_mode):
                    os.unlink(self.unix)
            except FileNotFoundError:
                pass

    # ---- connections

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        try:
            while True:
                try:
                    req = await read_request(reader, writer, self._pace)
                except HttpError as e:
                    head, body = encode_response(error_response(e.status, e.message), "GET", False)
                    writer.write(head + body)
                    await writer.drain()
                    break
                if req is None:
                    break
                if not await self._exchange(req, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._conns.discard(writer)
            writer.close()

    async def _exchange(self, req: Request, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must close."""
        keep_alive = req.headers.get("connection", "").lower() != "close"
        if req.path.startswith("/_"):
            resp, after = self._control(req, writer)
            head, body = encode_response(resp, req.method, keep_alive)
            writer.write(head + body)
            await writer.drain()
            if after:
                after()
            return keep_alive and self.listening

        mode = self.fault.take(req)
        if mode == "down":
            self.log.add(req, None, None, mode)
            return False
        if mode in STATUS_MODES:
            retry = {"Retry-After": str(self.fault.retry_after)} if mode in ("503", "429") else {}
            resp = error_response(int(mode), f"injected {mode}", retry)
        elif mode == "412":
            resp = error_response(412, "the version did not match (injected race)")
        else:
            if mode == "slow":
                await asyncio.sleep(1.0 if self.fault.delay is None else self.fault.delay)
            resp = await self._handle(req)
        if mode == "lost":
            self.log.add(req, None, resp, mode)
            return False
        self.log.add(req, resp.status, resp, mode)
        head, body = encode_response(resp, req.method, keep_alive)
        if mode == "trickle":
            writer.write(head)
            for i in range(0, len(body), TRICKLE_PIECE):
                await asyncio.sleep(self._trickle_delay())
                writer.write(body[i:i + TRICKLE_PIECE])
                await writer.drain()
            return keep_alive
        if mode == "drop":
            writer.write(head + body[: len(body) // 2] if body else head[: len(head) // 2])
            await writer.drain()
            return False
        writer.write(head + body)
        await writer.drain()
        return keep_alive

    async def _handle(self, req: Request) -> Response:
        try:
            result = self.handler(req)
            if inspect.isawaitable(result):
                result = await result
            return result
        except HttpError as e:
            return error_response(e.status, e.message, e.headers)
        except Exception as e:  # a bug in a fake: say so, keep serving
            traceback.print_exc(file=sys.stderr)
            return error_response(500, f"fake server error: {type(e).__name__}")

    def _trickle_delay(self) -> float:
        return 0.05 if self.fault.delay is None else self.fault.delay

    def _pace(self, method: str, path: str) -> float:
        """How slowly a request's body is read: a trickle fault in force for its path."""
        f = self.fault
        if f.mode == "trickle" and path.startswith(f.path) and not path.startswith("/_"):
            return self._trickle_delay()
        return 0.0

    # ---- control endpoints

    def _control(self, req: Request, writer: asyncio.StreamWriter) -> tuple[Response, Callable[[], None] | None]:
        try:
            if req.path == "/_fault":
                if req.method == "GET":
                    return json_response(self.fault.as_dict()), None
                if req.method == "POST":
                    self.fault = Fault.parse(req.json())
                    return json_response(self.fault.as_dict()), self._fault_set_action(writer)
                raise HttpError(405, "use GET or POST")
            if req.path == "/_log":
                if req.method == "GET":
                    return json_response({"entries": self.log.entries}), None
                if req.method == "DELETE":
                    self.log.entries.clear()
                    return Response(204), None
                raise HttpError(405, "use GET or DELETE")
            raise HttpError(404, "no such control endpoint")
        except HttpError as e:
            return error_response(e.status, e.message), None

    def _fault_set_action(self, writer: asyncio.StreamWriter) -> Callable[[], None] | None:
        mode = self.fault.mode
        if mode == "down":
            return lambda: self.close_connections(keep=writer)
        if mode == "die":
            return lambda: os._exit(3)
        if mode == "refuse":
            delay = self.fault.delay

            def refuse() -> None:
                self.stop_listening()
                self.fault = Fault()
                if delay:
                    loop = asyncio.get_running_loop()
                    self._relisten = loop.call_later(delay, lambda: loop.create_task(self.start()))
            return refuse
        return None


def _clear_socket_path(path: str) -> None:
    """Make room for a socket: remove a stale socket file, never anything else."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SystemExit(f"{path} exists and is not a socket")
    os.unlink(path)


# ---------------------------------------------------------------- command line


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """--unix/--port/--host, --log and the start-time fault flags."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--unix", metavar="PATH", help="listen on this Unix socket")
    where.add_argument("--port", type=int, metavar="N", help="listen on this TCP port (0: any free)")
    parser.add_argument("--host", default="127.0.0.1", help="TCP address (default 127.0.0.1)")
    parser.add_argument("--log", metavar="FILE", help="append one JSON line a request here")
    parser.add_argument("--fault", choices=[m for m in FAULT_MODES if m not in ("die", "refuse")],
                        default="ok", help="fault in force from the start")
    parser.add_argument("--fault-count", type=int, metavar="N", help="affected requests (default: all)")
    parser.add_argument("--fault-delay", type=float, metavar="S", help="seconds, for slow")
    parser.add_argument("--retry-after", type=int, default=1, metavar="S", help="Retry-After for 503/429")
    parser.add_argument("--fault-path", default="", metavar="PREFIX", help="fault only these paths")


def serve(handler: Handler, args: argparse.Namespace, extra_ready: dict[str, Any] | None = None) -> int:
    """Run ``handler`` as parsed by ``add_server_args`` until SIGTERM/SIGINT."""
    fault = Fault(args.fault, args.fault_count, args.fault_delay, args.retry_after, args.fault_path)
    server = Server(handler, unix=args.unix, host=args.host, port=args.port, log=args.log, fault=fault)
    try:
        asyncio.run(_serve(server, extra_ready or {}))
    except KeyboardInterrupt:
        pass
    return 0


async def _serve(server: Server, extra_ready: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    await server.start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: loop.create_task(server.start()))
    ready = {"ready": True, "listen": server.listen_address, "pid": os.getpid()}
    ready.update(extra_ready)
    print(json.dumps(ready), flush=True)
    await stop.wait()
    await server.close()
