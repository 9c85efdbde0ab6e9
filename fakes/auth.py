"""Link-Binding proofs (PROTOCOL.md §6, §8.1).

``Authorization: Link-Binding <agent>:<proof>``, with
``proof = hex(HMAC-SHA256(bytes.fromhex(key), "memory <purpose> binding\\n<owner>\\n<agent>"))``
and purpose ``embedding``, ``files`` or ``storage``.

``bindings`` everywhere is ``{"<agent>": {"owner": "<owner>", "key": "<64 hex>"}}``:
the live binding of each agent. Messages never carry a key or a proof.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Any

ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
PROOF_RE = re.compile(r"[0-9a-f]{64}")
KEY_RE = re.compile(r"[0-9a-fA-F]{64}")
SCHEME = "Link-Binding"


class Refused(Exception):
    """The request is not proved; ``str(e)`` says why, without secrets."""


def is_id(value: Any) -> bool:
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None


def proof(key: str, purpose: str, owner: str, agent: str) -> str:
    message = f"memory {purpose} binding\n{owner}\n{agent}".encode()
    return hmac.new(bytes.fromhex(key), message, hashlib.sha256).hexdigest()


def header(key: str, purpose: str, owner: str, agent: str) -> str:
    """The Authorization header value an engine sends."""
    return f"{SCHEME} {agent}:{proof(key, purpose, owner, agent)}"


def parse(value: str | None) -> tuple[str, str]:
    """(agent, proof) of a header, checking only their shapes."""
    if not value:
        raise Refused("missing Authorization: Link-Binding <agent>:<proof>")
    scheme, _, credentials = value.strip().partition(" ")
    if scheme.lower() != SCHEME.lower() or ":" not in credentials:
        raise Refused("Authorization must be Link-Binding <agent>:<proof>")
    agent, _, given = credentials.strip().partition(":")
    if not is_id(agent):
        raise Refused("the agent in Link-Binding is not an ID")
    if PROOF_RE.fullmatch(given) is None:
        raise Refused("the proof in Link-Binding is not 64 lowercase hex characters")
    return agent, given


def verify(value: str | None, bindings: Any, purpose: str) -> tuple[str, str]:
    """(owner, agent) when the header proves the agent's live binding."""
    agent, given = parse(value)  # shapes first, before anything is looked up
    binding = bindings.get(agent) if isinstance(bindings, dict) else None
    if not isinstance(binding, dict):
        raise Refused("no live binding for this agent")
    owner, key = binding.get("owner"), binding.get("key")
    if not is_id(owner) or not isinstance(key, str) or KEY_RE.fullmatch(key) is None:
        raise Refused("the binding of this agent is not valid")
    if not hmac.compare_digest(proof(key, purpose, owner, agent), given):
        raise Refused("the proof does not match the binding")
    return owner, agent
