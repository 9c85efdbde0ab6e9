"""`$LNK_MEMORY_SPEC` (§2.1): the agent's `[tool.memory]`, validated."""

from __future__ import annotations

import re

from lnkmem.core.errors import UsageError
from lnkmem.core.wire import Spec, decode

_UNITS = {"": 1, "b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)\s*$")


def parse_size(text: str) -> int:
    """'4 KB' -> 4000; '2KiB' -> 2048. ValueError for anything else."""
    m = _SIZE.match(text.lower())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"not a size: {text!r} (expected a number and B, KB, KiB, MB or MiB)")
    return int(min(float(m.group(1)) * _UNITS[m.group(2)], 2.0**62))  # "9" * 400 KB: no limit, not inf


def parse_spec(text: str | None) -> Spec:
    """The spec from its JSON text; absent or empty means ``{}``.

    Raises UsageError naming the key and what was expected.
    """
    if text is None or not text.strip():
        return Spec()
    try:
        spec = decode(text, Spec)
    except ValueError as e:
        raise UsageError(f"LNK_MEMORY_SPEC: {e}") from None
    return spec


def notes_limit(spec: Spec) -> int:
    return parse_size(spec.notes)
