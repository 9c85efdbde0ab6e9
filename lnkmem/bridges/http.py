"""HTTP/1.1 over a Unix socket to one of Link's bridges (§8.1).

One small client (after httpx's transports): every request carries the
binding's proof, is retried with backoff and jitter on 429/5xx and connection
errors (tenacity), and maps the bridge's answers onto the place exceptions.
The key is held here and nowhere else; it never reaches a log or a message.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from typing import Optional

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random_exponential

from lnkmem.bridges.place import Conflict, Forbidden, NotFound

log = logging.getLogger("lnkmem")

MAX_BODY = 256 * 1024 * 1024


class BridgeDown(Exception):
    """The bridge cannot be reached or keeps failing."""


class TooLarge(BridgeDown):
    """An answer over the client's limit (``LNKMEM_MAX_BODY``, 256 MiB): what was asked for is
    no file this engine will hold -- for the copy, a damaged copy, not a bridge that is down.
    ``version``: the file's version from the answer's ETag, when it named one."""

    def __init__(self, why: str, version: str = ""):
        super().__init__(why)
        self.version = version


def max_body() -> int:
    raw = os.environ.get("LNKMEM_MAX_BODY", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else MAX_BODY


class Refused(Exception):
    """The bridge refused the binding's proof (401/403 on bind)."""


class _Retry(Exception):
    def __init__(self, why: str, after: float = 0.0):
        super().__init__(why)
        self.after = after


def proof(key_hex: str, purpose: str, owner: str, agent: str) -> str:
    """hex(HMAC-SHA256(key, "memory <purpose> binding\\n<owner>\\n<agent>"))."""
    msg = f"memory {purpose} binding\n{owner}\n{agent}".encode()
    return hmac.new(bytes.fromhex(key_hex), msg, hashlib.sha256).hexdigest()


def auth_header(key_hex: str, purpose: str, owner: str, agent: str) -> str:
    return f"Link-Binding {agent}:{proof(key_hex, purpose, owner, agent)}"


class BridgeClient:
    """One bridge socket, one binding, one purpose ("files" or "storage")."""

    def __init__(self, socket_path: str, purpose: str, owner: str, agent: str, key_hex: str,
                 timeout: float = 30.0, patience: float = 30.0):
        self.socket_path = socket_path
        self.purpose = purpose
        self.agent = agent
        self.patience = patience
        self.timeout = timeout
        self.max_body = max_body()
        self._auth = auth_header(key_hex, purpose, owner, agent)
        # plain HTTP over a Unix socket: no certificate bundle to load (tens of ms a client)
        self.client = httpx.Client(transport=httpx.HTTPTransport(uds=socket_path, verify=False), verify=False,
                                   timeout=timeout,
                                   base_url="http://bridge")

    def __repr__(self) -> str:
        return f"BridgeClient({self.purpose} at {self.socket_path})"

    def close(self) -> None:
        self.client.close()

    def _once(self, method: str, url: str, params=None, content: Optional[bytes] = None,
              headers: Optional[dict] = None) -> httpx.Response:
        h = {"Authorization": self._auth}
        h.update(headers or {})
        deadline = time.monotonic() + self.timeout  # for the whole answer: a slow drip must not hang us
        try:
            with self.client.stream(method, url, params=params, content=content, headers=h) as s:
                limit = self.max_body
                big = TooLarge(f"{self.purpose} bridge answered over {limit} bytes for {url}",
                               unquote(s.headers.get("ETag", "")))
                length = s.headers.get("Content-Length", "")
                if length.isdigit() and int(length) > limit:
                    raise big
                raw = bytearray()
                for chunk in s.iter_raw():
                    raw += chunk
                    if len(raw) > limit:
                        raise big
                    if time.monotonic() > deadline:
                        raise _Retry(f"{self.purpose} bridge answered too slowly (over {self.timeout:g}s)")
            r = httpx.Response(s.status_code, headers=s.headers, content=bytes(raw), request=s.request)
        except (httpx.TransportError, httpx.DecodingError) as e:
            raise _Retry(f"{self.purpose} bridge unreachable ({type(e).__name__})") from None
        if r.status_code == 429 or r.status_code >= 500:
            after = r.headers.get("Retry-After", "")
            raise _Retry(f"{self.purpose} bridge answered {r.status_code}",
                         float(after) if after.replace(".", "", 1).isdigit() else 0.0)
        return r

    def request(self, method: str, url: str, params=None, content: Optional[bytes] = None,
                headers: Optional[dict] = None, patience: Optional[float] = None) -> httpx.Response:
        """Send with retries; 4xx come back as they are, persistent failure raises BridgeDown."""
        budget = self.patience if patience is None else patience

        def wait(state) -> float:
            base = wait_random_exponential(multiplier=0.05, max=2.0)(state)
            exc = state.outcome.exception() if state.outcome else None
            return max(base, min(getattr(exc, "after", 0.0), 5.0))

        retry = Retrying(retry=retry_if_exception(lambda e: isinstance(e, _Retry)), wait=wait,
                         stop=stop_after_delay(budget), reraise=True)
        try:
            return retry(self._once, method, url, params, content, headers)
        except _Retry as e:
            raise BridgeDown(str(e)) from None

    def bind(self, patience: float = 5.0) -> None:
        """POST /v1/bind: the bridge takes the key (§8.1); Refused or BridgeDown otherwise."""
        r = self.request("POST", "/v1/bind", content=b"", patience=patience)
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

