"""The embedding endpoint's client (§6).

OpenAI-style ``POST <base>/v1/embeddings``; ``<base>`` is ``http://host:port``
or ``unix:/abs/path.sock``. Batches of at most 64 inputs; retries with
exponential backoff and jitter on 429, 5xx and connection errors (tenacity);
and circuits: after a failure the endpoint is left alone for a while (which
doubles while it keeps failing), so that a dead model never slows searches,
which then rank by words. Background embedding and query embeddings each have
their own circuit, and a query its own short timeout (§4.1 rev. 2). A header hook lets bound sessions prove themselves
(``Authorization: Link-Binding``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import httpx
import msgspec
import numpy as np
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

log = logging.getLogger("lnkmem")

MAX_BATCH = 64
MAX_RESPONSE = 64 * 1024 * 1024
QUERY_TIMEOUT = 2.0  # a query's embedding, on the request path: one short try


class EmbeddingUnavailable(Exception):
    """The endpoint is absent, failing, or its circuit is open."""


class _Retryable(Exception):
    pass


class _Item(msgspec.Struct):
    index: int
    embedding: list[float]


class _Answer(msgspec.Struct):
    data: list[_Item]
    model: Optional[str] = None


_answer = msgspec.json.Decoder(_Answer)


class Circuit:
    """Closed -> open (for ``cooldown`` s, doubling up to ``max_cooldown``) -> half-open."""

    def __init__(self, cooldown: float = 5.0, max_cooldown: float = 300.0):
        self.base, self.max = cooldown, max_cooldown
        self.cooldown = cooldown
        self.open_until = 0.0
        self.lock = threading.Lock()

    def allow(self) -> bool:
        with self.lock:
            return time.monotonic() >= self.open_until

    def success(self) -> None:
        with self.lock:
            self.cooldown = self.base
            self.open_until = 0.0

    def failure(self) -> None:
        with self.lock:
            self.open_until = time.monotonic() + self.cooldown
            self.cooldown = min(self.cooldown * 2, self.max)

    @property
    def state(self) -> str:
        return "closed" if self.open_until == 0.0 else ("open" if not self.allow() else "half-open")


def _client_for(base: str, timeout: float) -> tuple[httpx.Client, str]:
    if base.startswith("unix:"):
        path = base[len("unix:"):]
        # no TLS over a Unix socket: skip loading the certificate bundle (tens of ms)
        transport = httpx.HTTPTransport(uds=path, verify=False)
        return httpx.Client(transport=transport, timeout=timeout, verify=False), "http://localhost"
    if base.startswith(("http://", "https://")):
        return httpx.Client(timeout=timeout), base.rstrip("/")
    raise ValueError(f"not an embedding endpoint base: {base!r} (expected http://host:port or unix:/path)")


def binding_headers(base: str, header: Callable[[], dict], who: str) -> Callable[[], dict]:
    """The header hook of a bound session's embedding calls (§6 rev. 3): the
    binding's credential goes only to a ``unix:`` endpoint, never over TCP, where
    it would leave the machine's own sockets; without it the log says why."""
    if base.startswith("unix:"):
        return header
    log.warning("%s: the embedding endpoint %s is not a Unix socket, so the binding's credential is not "
                "sent to it (a bound engine proves itself only at a Unix endpoint)", who, base)
    return dict


class Embedder:
    """Embeds texts with one model at one endpoint; thread-safe."""

    def __init__(self, base: str, model: str, headers: Callable[[], dict] = dict,
                 timeout: float = 30.0, attempts: int = 4, circuit: Optional[Circuit] = None,
                 query_timeout: float = QUERY_TIMEOUT, query_circuit: Optional[Circuit] = None):
        self.base = base
        self.model = model
        self.headers = headers
        self.timeout = timeout
        self.attempts = attempts
        # two circuits (§4.1 rev. 2): a slow or failing background pass must never
        # turn meaning off for queries, and a query's failure never pauses the pass
        self.circuit = circuit or Circuit()
        self.query_timeout = query_timeout
        self.query_circuit = query_circuit or Circuit(cooldown=1.0, max_cooldown=30.0)
        self.client, self.url = _client_for(base, timeout)
        self.url += "/v1/embeddings"
        self.dim: Optional[int] = None

    def close(self) -> None:
        self.client.close()

    def _post(self, texts: list[str], timeout: float) -> np.ndarray:
        deadline = time.monotonic() + timeout  # for the whole answer: a slow drip must not hold a search
        body = bytearray()
        try:
            with self.client.stream("POST", self.url, json={"model": self.model, "input": texts},
                                    headers=self.headers(), timeout=timeout) as r:
                if r.status_code == 429 or r.status_code >= 500:
                    raise _Retryable(f"the model answered {r.status_code}")
                if r.status_code != 200:
                    raise EmbeddingUnavailable(f"the model refused: {r.status_code}")
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > MAX_RESPONSE:
                        raise EmbeddingUnavailable("the model's answer is too large")
                    if time.monotonic() > deadline:
                        raise _Retryable(f"the model's answer took over {timeout:g}s")
        except (httpx.TransportError, httpx.DecodingError) as e:
            raise _Retryable(f"cannot reach the model: {type(e).__name__}") from None
        try:
            ans = _answer.decode(body)
        except msgspec.DecodeError as e:
            raise EmbeddingUnavailable(f"the model's answer is not understood: {e}") from None
        if len(ans.data) != len(texts):
            raise EmbeddingUnavailable(f"the model answered {len(ans.data)} vectors for {len(texts)} texts")
        dims = {len(d.embedding) for d in ans.data}
        if len(dims) != 1 or 0 in dims or any(not 0 <= d.index < len(texts) for d in ans.data):
            raise EmbeddingUnavailable("the model's vectors are malformed")
        out = np.zeros((len(texts), dims.pop()), np.float32)
        for d in ans.data:
            out[d.index] = d.embedding
        if not np.isfinite(out).all():
            raise EmbeddingUnavailable("the model's vectors are not finite")
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        return out / norms

    def embed(self, texts: list[str], patient: bool = True) -> np.ndarray:
        """Unit vectors for ``texts`` (rows in order). ``patient=False`` is for a
        query on the request path: one short try, no waiting, its own circuit."""
        circuit = self.circuit if patient else self.query_circuit
        if not circuit.allow():
            raise EmbeddingUnavailable("the model is failing; trying again later")
        chunks = []
        try:
            for i in range(0, len(texts), MAX_BATCH):
                batch = texts[i:i + MAX_BATCH]
                if patient:
                    retry = Retrying(
                        retry=retry_if_exception(lambda e: isinstance(e, _Retryable)),
                        wait=wait_random_exponential(multiplier=0.2, max=5),
                        stop=stop_after_attempt(self.attempts) | stop_after_delay(30),
                        reraise=True,
                    )
                    chunks.append(retry(self._post, batch, self.timeout))
                else:
                    chunks.append(self._post(batch, min(self.timeout, self.query_timeout)))
                if chunks[-1].shape[1] != chunks[0].shape[1]:  # one call's texts, one model: one width
                    raise EmbeddingUnavailable(f"the model's vectors are {chunks[-1].shape[1]} wide for some "
                                               f"texts and {chunks[0].shape[1]} for others")
        except (_Retryable, EmbeddingUnavailable) as e:
            circuit.failure()
            raise EmbeddingUnavailable(str(e)) from None
        circuit.success()
        vecs = np.concatenate(chunks) if chunks else np.zeros((0, self.dim or 0), np.float32)
        if self.dim is None and len(vecs):
            self.dim = vecs.shape[1]
        return vecs
