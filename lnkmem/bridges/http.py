"""HTTP/1.1 over a Unix socket to one of Link's bridges (§8.1).

One small client (after httpx's transports): every request carries the
binding's proof and maps the bridge's answers onto the place exceptions. The
key is held here and nowhere else; it never reaches a log or a message.

At any size (§7.3 rev. 3):

- a request body is sent in pieces of at most ``CHUNK`` bytes (``Body``): slices
  of the caller's buffer or its own chunks, never one copy of the whole (httpcore's
  sync stream slices what is left of a buffer after every ``send``, so one large
  buffer costs the square of its size);
- the deadline follows progress: a request may take ``timeout`` seconds plus one
  second for every ``MIN_RATE`` bytes moved either way, and no single wait on the
  socket may exceed ``timeout`` (a stall), so a large body moving slowly finishes
  and a stalled or dripping one does not hang the caller;
- only idempotent requests are retried whatever happened (GET, HEAD, bind, and a
  create-only ``PUT`` with ``If-None-Match: *``, whose retry at worst answers 412);
  a request that changes something (``If-Match`` PUT, DELETE) is retried only when
  it surely was not done (connection refused, 429, 503); when its answer is lost
  after it was sent, ``Unanswered`` says so and the place checks what is there.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from typing import Iterable, Iterator, Mapping, Optional, Union
from urllib.parse import quote as percent_encode
from urllib.parse import urlencode

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from lnkmem.bridges.place import BridgeDown, Conflict, Forbidden, NotFound, TooLarge  # (BridgeDown, TooLarge: here too)
from lnkmem.core.knobs import knobs

log = logging.getLogger("lnkmem")

MAX_BODY = 256 * 1024 * 1024
PATIENCE_S = 30.0  # one request retried this long at most (LNKMEM_BRIDGE_PATIENCE_S)


def max_body() -> int:
    return knobs().max_body or MAX_BODY


def patience_s() -> float:
    """How long one request is retried (5xx, 429, no connection) before it fails:
    ``LNKMEM_BRIDGE_PATIENCE_S``, :data:`PATIENCE_S`."""
    return knobs().bridge_patience_s or PATIENCE_S


class Refused(Exception):
    """The bridge refused the binding's proof (401/403 on bind)."""


class Unanswered(BridgeDown):
    """A request that changes something was sent and no answer came back (the
    connection broke or stalled, or a 5xx other than 503): it may have been done.
    It is not sent again blindly; the caller looks at what is there."""


CHUNK = 256 * 1024  # a request body goes to the socket in pieces of at most this
MIN_RATE = 256 * 1024  # bytes a second: the slowest transfer the deadline waits for

Chunks = Union[bytes, bytearray, memoryview, Iterable]


class Body:
    """A request body sent in pieces: a bytes-like object (sliced, never copied whole)
    or an iterable of bytes-like chunks whose total ``length`` is known (a list or any
    iterable that gives its chunks afresh each time it is iterated can be sent again;
    a one-shot iterator cannot, and a failure after its first piece is final)."""

    def __init__(self, data: Chunks, length: Optional[int] = None):
        if isinstance(data, (bytes, bytearray, memoryview)):
            self._view: Optional[memoryview] = memoryview(data).cast("B")
            self._parts = None
            self.length = self._view.nbytes
            self.replayable = True
        else:
            self._view = None
            self._parts = data
            if length is None and isinstance(data, (list, tuple)):
                length = sum(memoryview(p).nbytes for p in data)
            if length is None:
                raise ValueError("a body given in chunks needs its length")
            self.length = length
            self.replayable = iter(data) is not data
        self.started = False  # a piece was handed to the transport

    def release(self) -> None:
        """Let go of the data (it cannot be sent after this). A request's body is reached
        from objects that live on in reference cycles until a collection (the retry's
        predicate and its call state, httpx's request): without this, a write-back's parts
        piled up between collections (at 10x, tens of them: docs/BENCHMARKS.md)."""
        self._view = None
        self._parts = None

    def pieces(self) -> Iterator[memoryview]:
        """The body in pieces of at most CHUNK bytes (ValueError when it is not ``length`` long)."""
        if self._parts is not None and not self.replayable and self.started:
            raise ValueError("a one-shot body cannot be sent twice")
        self.started = True
        if self._view is not None:
            for i in range(0, self.length, CHUNK):
                yield self._view[i:i + CHUNK]
            return
        sent = 0
        for part in self._parts:
            v = memoryview(part).cast("B")
            sent += v.nbytes
            if sent > self.length:
                raise ValueError(f"the body is longer than its stated length ({self.length} bytes)")
            for i in range(0, v.nbytes, CHUNK):
                yield v[i:i + CHUNK]
        if sent != self.length:
            raise ValueError(f"the body is {sent} bytes, not its stated {self.length}")

    def digest(self) -> bytes:
        """SHA-256 of the body (sent again piece by piece; only for a replayable body)."""
        h = hashlib.sha256()
        for piece in self.pieces():
            h.update(piece)
        return h.digest()


class _Retry(Exception):
    """One attempt failed. ``sent``: the request may have reached the bridge (and been done);
    ``after``: the bridge's Retry-After."""

    def __init__(self, why: str, after: float = 0.0, sent: bool = True):
        super().__init__(why)
        self.after = after
        self.sent = sent


def bridge_url(*segments: str, name: str = "", query: Optional[Mapping[str, Optional[str]]] = None) -> str:
    """The request target of a bridge route (§8): every URL sent to a bridge is built here.

    ``segments``: the route's fixed words and the names in it (``"v1", "c", collection``;
    a team id), each one whole segment; ``name``: a relative path after them (a file's name
    in a collection: its ``/`` are kept, the rest of each part is itself); ``query``:
    parameters (None: left out). Everything is percent-encoded (UTF-8), so a name holding
    ``#``, ``?``, ``%``, ``&``, ``+``, a space or any letter reaches the bridge as itself,
    decoded there exactly once: ``#`` never cuts it short, ``%25`` is never read as ``%``,
    ``+`` in a query is never a space, and no segment can add another."""
    parts = [percent_encode(s, safe="") for s in segments]
    if name:
        parts += [percent_encode(p, safe="") for p in name.split("/")]
    target = "/" + "/".join(parts)
    pairs = [(k, v) for k, v in (query or {}).items() if v is not None]
    if pairs:
        target += "?" + urlencode(pairs, quote_via=percent_encode, safe="")
    return target


BIND = bridge_url("v1", "bind")


def idempotent(method: str, url: str, headers: Optional[dict]) -> bool:
    """Whether sending ``method`` again is harmless whatever the first attempt did."""
    if method in ("GET", "HEAD") or url == BIND:
        return True
    create_only = any(k.lower() == "if-none-match" and v == "*" for k, v in (headers or {}).items())
    return method == "PUT" and create_only


def proof(key_hex: str, purpose: str, owner: str, agent: str) -> str:
    """hex(HMAC-SHA256(key, "memory <purpose> binding\\n<owner>\\n<agent>"))."""
    msg = f"memory {purpose} binding\n{owner}\n{agent}".encode()
    return hmac.new(bytes.fromhex(key_hex), msg, hashlib.sha256).hexdigest()


def auth_header(key_hex: str, purpose: str, owner: str, agent: str) -> str:
    return f"Link-Binding {agent}:{proof(key_hex, purpose, owner, agent)}"


class BindingAuth(httpx.Auth):
    """The binding's proof on every request (``Authorization: Link-Binding <agent>:<proof>``,
    §8.1). Held here only: its repr names no proof."""

    def __init__(self, header: str):
        self._header = header

    def auth_flow(self, request: httpx.Request):
        request.headers["Authorization"] = self._header
        yield request

    def __repr__(self) -> str:
        return "BindingAuth(...)"


class _Exchange:
    """One request and its answer: when it began and the bytes it moved, either way; it is
    late past ``timeout`` seconds plus one for every MIN_RATE bytes moved."""

    def __init__(self, timeout: float):
        self.started = time.monotonic()
        self.moved = 0
        self.timeout = timeout

    def late(self) -> bool:
        return time.monotonic() > self.started + self.timeout + self.moved / MIN_RATE


class _Sent(httpx.SyncByteStream):
    """A request's body as the socket takes it: counted, and given up once late."""

    def __init__(self, inner, exchange: _Exchange, transport: "BoundedTransport"):
        self.inner, self.exchange, self.transport = inner, exchange, transport

    def __iter__(self):
        x = self.exchange
        for piece in self.inner:
            yield piece  # (the code below runs once the socket has taken it)
            n = memoryview(piece).nbytes
            x.moved += n
            self.transport.count(n)
            if x.late():
                raise _Retry(f"{self.transport.purpose} bridge took the body too slowly "
                             f"({x.moved} bytes in {time.monotonic() - x.started:.0f}s)")

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class _Received(httpx.SyncByteStream):
    """An answer's body as it comes: counted, refused past the limit, given up once late."""

    def __init__(self, inner, exchange: _Exchange, transport: "BoundedTransport", too_large: "TooLarge"):
        self.inner, self.exchange, self.transport, self.too_large = inner, exchange, transport, too_large

    def __iter__(self):
        x, got = self.exchange, 0
        for chunk in self.inner:
            got += len(chunk)
            x.moved += len(chunk)
            self.transport.count(len(chunk))
            if got > self.transport.limit:
                raise self.too_large
            if x.late():  # a slow drip must not hang us
                raise _Retry(f"{self.transport.purpose} bridge answered too slowly "
                             f"({x.moved} bytes in {time.monotonic() - x.started:.0f}s)")
            yield chunk

    def close(self) -> None:
        self.inner.close()


class BoundedTransport(httpx.BaseTransport):
    """Plain HTTP over one bridge's Unix socket (no certificate bundle to load), each
    exchange bounded as the module says: its deadline follows the bytes it moves either
    way (``_Exchange``), and its answer is refused past ``limit`` bytes (``TooLarge``,
    by its Content-Length before a byte of it is read, else as it comes)."""

    def __init__(self, socket_path: str, purpose: str, timeout: float, limit: int):
        self.inner = httpx.HTTPTransport(uds=socket_path, verify=False)
        self.purpose, self.timeout, self.limit = purpose, timeout, limit
        self.moved = 0  # bytes sent and received, every exchange together: progress, for waiters

    def count(self, n: int) -> None:
        self.moved += n

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        exchange = _Exchange(self.timeout)
        request.stream = _Sent(request.stream, exchange, self)
        response = self.inner.handle_request(request)
        too_large = TooLarge(f"{self.purpose} bridge answered over {self.limit} bytes for {request.url.raw_path.decode()}",
                             unquote(response.headers.get("ETag", "")))
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > self.limit:
            response.close()
            raise too_large
        # the body as sent, never decoded here: its bound is on the bytes that came (a
        # compressed answer would be a bomb past it), and no bridge compresses
        headers = [(k, v) for k, v in response.headers.raw if k.lower() != b"content-encoding"]
        return httpx.Response(response.status_code, headers=headers,
                              stream=_Received(response.stream, exchange, self, too_large),
                              extensions=response.extensions)

    def close(self) -> None:
        self.inner.close()


class BridgeClient:
    """One bridge socket, one binding, one purpose ("files" or "storage"): httpx's client
    with the binding's proof as its auth (``BindingAuth``) and a bounded transport
    (``BoundedTransport``); here, what is retried and how (``request``)."""

    def __init__(self, socket_path: str, purpose: str, owner: str, agent: str, key_hex: str,
                 timeout: float = 30.0, patience: Optional[float] = None):
        self.socket_path = socket_path
        self.purpose = purpose
        self.agent = agent
        self.patience = patience_s() if patience is None else patience
        self.timeout = timeout
        self.max_body = max_body()
        self.transport = BoundedTransport(socket_path, purpose, timeout, self.max_body)
        self.client = httpx.Client(transport=self.transport, auth=BindingAuth(auth_header(key_hex, purpose, owner, agent)),
                                   timeout=timeout, base_url="http://bridge")

    @property
    def moved(self) -> int:
        """Bytes sent and received, all requests together: progress, for waiters."""
        return self.transport.moved

    def __repr__(self) -> str:
        return f"BridgeClient({self.purpose} at {self.socket_path})"

    def close(self) -> None:
        self.client.close()

    def _once(self, method: str, url: str, body: Optional[Body] = None,
              headers: Optional[dict] = None) -> httpx.Response:
        h = dict(headers or {})
        content = None
        if body is not None:
            h["Content-Length"] = str(body.length)  # (httpx then sends no chunked framing)
            content = body.pieces() if body.length else b""
        try:
            r = self.client.request(method, url, content=content, headers=h)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
            raise _Retry(f"{self.purpose} bridge unreachable ({type(e).__name__})", sent=False) from None
        except (httpx.TransportError, httpx.DecodingError) as e:
            raise _Retry(f"{self.purpose} bridge unreachable ({type(e).__name__})") from None
        finally:
            if hasattr(content, "close"):  # (a send given up midway leaves it at a piece: a slice of the body)
                content.close()
        if r.status_code == 429 or r.status_code >= 500:
            after = r.headers.get("Retry-After", "")
            # 429 and 503 say the request was turned away; another 5xx may come after it was done
            raise _Retry(f"{self.purpose} bridge answered {r.status_code}",
                         float(after) if after.replace(".", "", 1).isdigit() else 0.0,
                         sent=r.status_code not in (429, 503))
        return r

    def request(self, method: str, url: str, content: Optional[Chunks] = None,
                headers: Optional[dict] = None, patience: Optional[float] = None,
                length: Optional[int] = None) -> httpx.Response:
        """Send, retrying what may be retried (module doc); 4xx come back as they are.
        ``url``: a target built by ``bridge_url`` (names in it percent-encoded).
        ``content``: bytes, or chunks of ``length`` bytes in all (``Body``). Persistent
        failure raises BridgeDown; a change whose answer was lost, Unanswered."""
        budget = self.patience if patience is None else patience
        body = None if content is None else content if isinstance(content, Body) else Body(content, length)
        safe = idempotent(method, url, headers)

        def again(e: BaseException) -> bool:
            if not isinstance(e, _Retry):
                return False
            if body is not None and not body.replayable and body.started:
                return False
            return safe or not e.sent

        def wait(state) -> float:
            base = wait_random_exponential(multiplier=0.05, max=2.0)(state)
            exc = state.outcome.exception() if state.outcome else None
            return max(base, min(getattr(exc, "after", 0.0), 5.0))

        retry = Retrying(retry=retry_if_exception(again), wait=wait, stop=stop_after_delay(budget), reraise=True)
        try:
            return retry(self._once, method, url, body, headers)
        except _Retry as e:
            if e.sent and not safe:
                raise Unanswered(f"{e}; the request may have been done") from None
            raise BridgeDown(str(e)) from None
        finally:
            if body is not None and body is not content:  # (a caller's own Body is the caller's to release)
                body.release()

    def bind(self, patience: float = 5.0) -> None:
        """POST /v1/bind: the bridge takes the key (§8.1); Refused or BridgeDown otherwise."""
        r = self.request("POST", BIND, content=b"", patience=patience)
        if r.status_code in (401, 403):
            raise Refused(f"the {self.purpose} bridge refused the binding ({r.status_code})")
        if r.status_code != 200:
            raise BridgeDown(f"the {self.purpose} bridge answered {r.status_code} to bind")


def check(r: httpx.Response, what: str) -> httpx.Response:
    """Map an answer's status onto the place exceptions."""
    if r.status_code in (200, 201, 204, 304):
        return r
    if r.status_code == 404:
        raise NotFound(what)
    if r.status_code in (401, 403):
        raise Forbidden(f"{what}: not granted ({r.status_code})")
    if r.status_code == 412:
        raise Conflict(what)
    raise BridgeDown(f"{what}: the bridge answered {r.status_code}")


def etag(r: httpx.Response) -> str:
    return r.headers.get("ETag", "")


def unquote(tag: str) -> str:
    return tag[1:-1] if len(tag) >= 2 and tag[0] == tag[-1] == '"' else tag


def quote(version: str) -> str:
    return version if version.startswith('"') else f'"{version}"'

