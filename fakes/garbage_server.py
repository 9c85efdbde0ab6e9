"""A misbehaving Link: the embedding endpoint and both bridges, answering garbage on demand.

    python -m fakes.garbage_server (--unix PATH | --port N) [--dim 8] [--mode MODE]
        [--log FILE] [fault flags]

It speaks just enough of PROTOCOL.md §6 and §8 for an engine to work against
it while the mode is ``ok`` (no authentication: every proof is taken):

- ``POST /v1/bind`` -> ``{"owner": "o1", "agent": <the header's agent>}``;
- ``POST /v1/embeddings`` -> deterministic unit vectors of ``--dim`` numbers;
- ``GET /v1/list`` and ``GET /v1/read`` (files bridge), ``GET|PUT|DELETE
  /v1/c/<collection>[/<name>]`` (storage bridge), over one in-memory bucket
  (``PUT /v1/write`` too); it starts with ``docs/garbage.md`` and, in the
  ``conversations`` collection, ``t1.jsonl``.

``POST /_garbage`` ``{"mode", "count"?, "path"?, "size"?, "delay"?, "status"?}``
(``GET`` shows it) makes the next ``count`` requests (all, when absent) whose
path starts with ``path`` answer as ``mode`` says:

=============  ==============================================================
``ok``         answer properly
``notjson``    200, ``text/html``, an HTML error page
``wrongshape`` 200, JSON of the wrong shape for the endpoint (strings for
               numbers, missing keys); reads: the bytes but no ``ETag``
``wrongcount`` embeddings: one vector too few; lists: an entry too many,
               with a negative size
``wrongdims``  embeddings: vectors of different lengths, NaN, indexes out of
               range or repeated
``evilpaths``  lists: entries named ``../x``, ``/etc/passwd``, ``a/../../b``,
               ``.hidden``, with NUL and backslashes
``deep``       200, ``[`` nested ``size`` deep (default 200000)
``binary``     200, ``application/json``, ``size`` random bytes (default 4096)
``empty``      200 with an empty body
``wrongtype``  the proper answer, labelled ``application/x-garbage``
``truncated``  ``Content-Length`` twice the body, then the connection closes
``badlength``  ``Content-Length: -5``
``headers``    the status line and headers, then the connection closes
``hang``       nothing at all for ``delay`` seconds (default 3600), then close
``drip``       ``size`` bytes (default 1 MiB) sent one a ``delay`` seconds
               (default 0.2); ``GET /_garbage`` says how many bytes were
               dripped since the last ``POST`` (``dripped``): a client that
               gives up on a slow answer stops them
``huge``       200, ``size`` bytes of JSON-ish filler (default 70 MiB)
``status``     ``status`` (default 418) with a body that is not JSON
``badchunked`` ``Transfer-Encoding: chunked`` with a chunk size that is not hex
``badgzip``    200, ``Content-Encoding: gzip`` over bytes that are not gzip
=============  ==============================================================

The standard faults of ``fakes.http`` (``POST /_fault``) work too. Standard
library only.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import random
import sys
from typing import Any

from fakes.http import (Fault, HttpError, count_down, Request, Response, Server, _serve, add_server_args, encode_response,
                        error_response, json_response)

GARBAGE_MODES = ("ok", "notjson", "wrongshape", "wrongcount", "wrongdims", "evilpaths", "deep", "binary", "empty",
                 "wrongtype", "truncated", "badlength", "headers", "hang", "drip", "huge", "status", "badchunked",
                 "badgzip")
EVIL_NAMES = ("../escape.md", "/etc/passwd", "a/../../b.md", ".hidden/x.md", "nul\x00name.md", "back\\slash.md",
              "docs/./dot.md", "", "docs//double.md")
DOC = b"The garbage server keeps one document about quokkas on Rottnest Island.\n"
CHAT = b'{"role": "user", "text": "where do quokkas live"}\n'


class Garbage:
    def __init__(self, mode: str = "ok", count: int | None = None, path: str = "", size: int | None = None,
                 delay: float | None = None, status: int = 418):
        self.mode, self.count, self.path, self.size, self.delay, self.status = mode, count, path, size, delay, status

    @classmethod
    def parse(cls, obj: Any) -> "Garbage":
        if not isinstance(obj, dict):
            raise HttpError(400, "garbage is a JSON object")
        unknown = set(obj) - {"mode", "count", "path", "size", "delay", "status"}
        if unknown:
            raise HttpError(400, f"unknown garbage keys: {sorted(unknown)}")
        mode = obj.get("mode", "ok")
        if mode not in GARBAGE_MODES:
            raise HttpError(400, f"mode must be one of {list(GARBAGE_MODES)}")
        for k in ("count", "size", "status"):
            v = obj.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise HttpError(400, f"{k} must be a non-negative integer")
        delay = obj.get("delay")
        if delay is not None and (isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0):
            raise HttpError(400, "delay must be a non-negative number")
        path = obj.get("path", "")
        if not isinstance(path, str):
            raise HttpError(400, "path must be a string")
        return cls(mode, obj.get("count"), path, obj.get("size"), delay, obj.get("status") or 418)

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "count": self.count, "path": self.path, "size": self.size,
                "delay": self.delay, "status": self.status}

    def take(self, req: Request) -> str | None:
        if self.mode == "ok" or not req.path.startswith(self.path):
            return None
        return count_down(self)


def _vector(text: str, dim: int) -> list[float]:
    h = hashlib.sha256(text.encode("utf-8", "replace")).digest()
    raw = [((h[i % len(h)] ^ (i * 37)) % 255) / 127.0 - 1.0 for i in range(dim)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


class Bucket:
    """One in-memory bucket: name -> (bytes, version)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}
        self.n = 0

    def put(self, name: str, data: bytes) -> str:
        self.n += 1
        version = f"v{self.n}-{hashlib.sha256(data).hexdigest()[:12]}"
        self.files[name] = (data, version)
        return version


class GarbageLink:
    """The proper answers: the handler the ``ok`` mode uses."""

    def __init__(self, dim: int):
        self.dim = dim
        self.home = Bucket()
        self.colls: dict[str, Bucket] = {"conversations": Bucket(), "memory": Bucket()}
        self.home.put("docs/garbage.md", DOC)
        self.colls["conversations"].put("t1.jsonl", CHAT)

    def __call__(self, req: Request) -> Response:
        auth = req.header("authorization") or ""
        agent = auth.partition(" ")[2].partition(":")[0] or "a1"
        req.agent = agent
        p = req.path
        if p == "/v1/bind":
            return json_response({"owner": "o1", "agent": agent})
        if p == "/v1/embeddings":
            body = req.json()
            inputs = body.get("input") if isinstance(body, dict) else None
            if not isinstance(inputs, list):
                raise HttpError(400, "input must be a list")
            return json_response({"data": [{"index": i, "embedding": _vector(str(t), self.dim)}
                                           for i, t in enumerate(inputs)], "model": body.get("model")})
        if p == "/v1/list":
            pre = req.query.get("path", "").strip("/")
            return json_response({"entries": [
                {"path": n, "size": len(d), "version": v, "modified": "2026-01-01T00:00:00Z"}
                for n, (d, v) in sorted(self.home.files.items())
                if not pre or n == pre or n.startswith(pre + "/")]})
        if p in ("/v1/read", "/v1/write"):
            return self._object(req, self.home, req.query.get("path", ""))
        parts = p.split("/")
        if parts[:3] == ["", "v1", "c"] and len(parts) >= 4 and parts[3] in self.colls:
            coll = self.colls[parts[3]]
            name = "/".join(parts[4:])
            if not name:
                pre = req.query.get("prefix", "")
                return json_response({"entries": [{"name": n, "size": len(d), "version": v}
                                                  for n, (d, v) in sorted(coll.files.items()) if n.startswith(pre)]})
            return self._object(req, coll, name)
        raise HttpError(404, "not found")

    @staticmethod
    def _object(req: Request, bucket: Bucket, name: str) -> Response:
        have = bucket.files.get(name)
        tag = f'"{have[1]}"' if have else None
        if req.method in ("GET", "HEAD"):
            if have is None:
                raise HttpError(404, "no such file")
            if req.header("if-none-match") == tag:
                return Response(304, b"", {"ETag": tag})
            return Response(200, have[0], {"ETag": tag, "Content-Type": "application/octet-stream"})
        im, inm = req.header("if-match"), req.header("if-none-match")
        if (im is not None and im != tag) or (inm == "*" and have is not None):
            raise HttpError(412, "the version did not match")
        if req.method == "DELETE":
            bucket.files.pop(name, None)
            return Response(204)
        if req.method == "PUT":
            version = bucket.put(name, req.body)
            return json_response({"version": version, "size": len(req.body)}, 200, {"ETag": f'"{version}"'})
        raise HttpError(405, "method not allowed")


class GarbageServer(Server):
    def __init__(self, handler: GarbageLink, garbage: Garbage, **kw: Any):
        super().__init__(handler, **kw)
        self.garbage = garbage
        self.link = handler
        self.dripped = 0  # bytes a drip has sent since the garbage was last set

    def _control(self, req: Request, writer: asyncio.StreamWriter):
        if req.path == "/_garbage":
            try:
                if req.method == "GET":
                    return json_response({**self.garbage.as_dict(), "dripped": self.dripped}), None
                if req.method == "POST":
                    self.garbage = Garbage.parse(req.json())
                    self.dripped = 0
                    return json_response(self.garbage.as_dict()), None
                raise HttpError(405, "use GET or POST")
            except HttpError as e:
                return error_response(e.status, e.message), None
        return super()._control(req, writer)

    async def _exchange(self, req: Request, writer: asyncio.StreamWriter) -> bool:
        mode = None if req.path.startswith("/_") else self.garbage.take(req)
        if mode is None:
            return await super()._exchange(req, writer)
        g = self.garbage if self.garbage.mode == mode else Garbage(mode)  # count may have run out
        self.log.add(req, None, None, f"garbage:{mode}")
        try:
            return await self._garbage(mode, g, req, writer)
        except (ConnectionError, OSError):
            return False

    async def _proper(self, req: Request) -> Response:
        return await self._handle(req)

    async def _garbage(self, mode: str, g: Garbage, req: Request, w: asyncio.StreamWriter) -> bool:
        def head(status: int, headers: dict[str, str]) -> bytes:
            h = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            return f"HTTP/1.1 {status} Garbage\r\n{h}\r\n".encode("latin-1")

        def send(status: int, body: bytes, ctype: str = "application/json", extra: dict | None = None) -> None:
            hs = {"Content-Type": ctype, "Content-Length": str(len(body)), "Connection": "keep-alive"}
            hs.update(extra or {})
            w.write(head(status, hs) + body)

        endpoint = req.path
        if mode == "notjson":
            send(200, b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")
        elif mode == "wrongshape":
            if endpoint == "/v1/embeddings":
                send(200, b'{"data": [{"index": "0", "embedding": "0.1,0.2"}], "model": 5}')
            elif endpoint == "/v1/list" or (endpoint.startswith("/v1/c/") and endpoint.count("/") == 3):
                send(200, b'{"entries": [{"path": 7, "name": null, "size": "big", "version": []}]}')
            elif endpoint == "/v1/bind":
                send(200, b'["ok"]')
            else:
                resp = await self._proper(req)
                resp.headers.pop("ETag", None)
                h, b = encode_response(resp, req.method, True)
                w.write(h + b)
        elif mode == "wrongcount":
            if endpoint == "/v1/embeddings":
                n = len((json.loads(req.body or b"{}") or {}).get("input") or [])
                data = [{"index": i, "embedding": _vector(str(i), self.link.dim)} for i in range(max(n - 1, 0))]
                send(200, json.dumps({"data": data}).encode())
            else:
                resp = await self._proper(req)
                try:
                    obj = json.loads(resp.body)
                    obj["entries"].append({"path": "docs/ghost.md", "name": "ghost", "size": -1, "version": "x"})
                    send(resp.status, json.dumps(obj).encode())
                except (ValueError, KeyError, TypeError, AttributeError):
                    send(resp.status, resp.body)
        elif mode == "wrongdims":
            n = len((json.loads(req.body or b"{}") or {}).get("input") or []) if endpoint == "/v1/embeddings" else 1
            rnd = random.Random(n)
            data = []
            for i in range(n):
                kind = rnd.choice(("short", "nan", "index", "dup", "empty"))
                vec: list = _vector(str(i), self.link.dim)
                idx = i
                if kind == "short":
                    vec = vec[: max(1, i % self.link.dim)]
                elif kind == "nan":
                    vec[0] = "__INF__"  # 1e999: a JSON number that is not finite
                elif kind == "index":
                    idx = n + 5
                elif kind == "dup":
                    idx = 0
                else:
                    vec = []
                data.append({"index": idx, "embedding": vec})
            send(200, json.dumps({"data": data}).replace('"__INF__"', "1e999").encode())
        elif mode == "evilpaths":
            if endpoint == "/v1/list":
                entries = [{"path": n, "size": 10, "version": f"e{i}"} for i, n in enumerate(EVIL_NAMES)]
            else:
                entries = [{"name": n, "size": 10, "version": f"e{i}"} for i, n in enumerate(EVIL_NAMES)]
            send(200, json.dumps({"entries": entries}).encode())
        elif mode == "deep":
            send(200, b"[" * (g.size or 200000))
        elif mode == "binary":
            send(200, os.urandom(g.size or 4096))
        elif mode == "empty":
            send(200, b"")
        elif mode == "wrongtype":
            resp = await self._proper(req)
            resp.headers["Content-Type"] = "application/x-garbage"
            h, b = encode_response(resp, req.method, True)
            w.write(h + b)
        elif mode == "truncated":
            resp = await self._proper(req)
            body = resp.body or b"{}"
            w.write(head(resp.status, {**resp.headers, "Content-Length": str(2 * len(body))}) + body)
            await w.drain()
            return False
        elif mode == "badlength":
            w.write(head(200, {"Content-Type": "application/json", "Content-Length": "-5"}) + b"{}")
            await w.drain()
            return False
        elif mode == "headers":
            w.write(head(200, {"Content-Type": "application/json", "Content-Length": "100"}))
            await w.drain()
            return False
        elif mode == "hang":
            await asyncio.sleep(3600 if g.delay is None else g.delay)
            return False
        elif mode == "drip":
            size = g.size or (1 << 20)
            delay = 0.2 if g.delay is None else g.delay
            w.write(head(200, {"Content-Type": "application/json", "Content-Length": str(size)}))
            await w.drain()
            for i in range(size):
                w.write(b"[" if i == 0 else b" ")
                await w.drain()
                self.dripped += 1
                await asyncio.sleep(delay)
            return False
        elif mode == "huge":
            size = g.size or (70 << 20)
            w.write(head(200, {"Content-Type": "application/json", "Content-Length": str(size)}))
            chunk = b"0," * (1 << 19)
            left = size
            while left > 0:
                part = chunk[:left]
                w.write(part)
                left -= len(part)
                await w.drain()
        elif mode == "status":
            send(g.status, b"teapot says no", "text/plain")
        elif mode == "badchunked":
            w.write(head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}) + b"zz\r\n{}\r\n")
            await w.drain()
            return False
        elif mode == "badgzip":
            send(200, b"this is not gzip at all", extra={"Content-Encoding": "gzip"})
        else:  # ok, never here
            return await super()._exchange(req, w)
        await w.drain()
        return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.garbage_server", description=__doc__.split("\n\n")[0])
    add_server_args(parser)
    parser.add_argument("--dim", type=int, default=8, help="the length of the vectors (default 8)")
    parser.add_argument("--mode", choices=GARBAGE_MODES, default="ok", help="garbage from the start")
    args = parser.parse_args(argv)
    link = GarbageLink(args.dim)
    fault = Fault(args.fault, args.fault_count, args.fault_delay, args.retry_after, args.fault_path)
    server = GarbageServer(link, Garbage(args.mode), unix=args.unix, host=args.host, port=args.port, log=args.log,
                           fault=fault)
    try:
        asyncio.run(_serve(server, {"dim": args.dim}))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
