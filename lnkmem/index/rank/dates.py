"""The dates of a search's filters (`after`, `before`) and of what they judge (a file's
time, a message's): RFC 3339 dates and date-times as seconds since the epoch."""

from __future__ import annotations

import re
from datetime import date, datetime, timezone
from typing import Optional


_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_when(value: str, name: str) -> float:
    """Seconds since the epoch of an RFC 3339 date (midnight UTC) or date-time
    (an offset or Z; none means UTC). ValueError naming ``name`` otherwise."""
    v = value.strip()
    try:
        if _DATE.match(v):
            d = date.fromisoformat(v)
            return datetime(d.year, d.month, d.day, tzinfo=timezone.utc).timestamp()
        if len(v) < 11 or v[10] not in "Tt ":
            raise ValueError(v)
        t = datetime.fromisoformat(v[:-1] + "+00:00" if v[-1] in "Zz" else v)
        if t.tzinfo is None:
            t = t.replace(tzinfo=timezone.utc)
        return t.timestamp()
    except (ValueError, OverflowError):
        raise ValueError(f"{name}: {value!r} is not an RFC 3339 date (2024-03-01) or date-time "
                         f"(2024-03-01T09:30:00Z)") from None


def seconds(when: Optional[str]) -> Optional[float]:
    if not when:
        return None
    try:
        return parse_when(when, "at")
    except ValueError:
        return None
