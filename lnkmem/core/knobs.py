"""The environment's knobs (``LNKMEM_*``): read and checked in one place, with one policy.

A bad value is an error naming the variable and what it expects (:class:`KnobError`, a
``UsageError``): ``lnk-lnkmem`` checks every knob at its start (:func:`check`), so a
bad one is one line on stderr and exit 2 before anything runs, never a silent default
or a failure deep inside a call. A module reads its knob through :func:`knobs`, one
frozen :class:`Knobs`; it is read again only when the environment's values changed
(tests set a variable in-process). An unset (or empty) variable is ``None`` where the
default lives beside the code it tunes (the module says why that default), else the
default here.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Callable, Mapping, Optional

from lnkmem.core.errors import UsageError


class KnobError(UsageError):
    """A knob's value is not what it expects: the message names the variable."""


def _seconds(above_zero: bool) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            v = float(raw)
        except ValueError:
            v = math.nan
        if not (0 < v < 1e6 if above_zero else 0 <= v < 1e6):
            raise ValueError("a number of seconds above 0" if above_zero else "a number of seconds, 0 or more")
        return v
    return parse


def _whole(least: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        if not (raw.isascii() and raw.isdigit()) or int(raw) < least:
            raise ValueError(f"a whole number above {least - 1}" if least > 0 else "a whole number, 0 or more")
        return int(raw)
    return parse


def _choice(allowed: Mapping[str, str], what: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        key = raw.lower()
        if key not in allowed:
            raise ValueError(what)
        return allowed[key]
    return parse


_LEVELS = {k: k.upper() for k in ("debug", "info", "warning", "error")}
_SWITCH = {"0": "0", "1": "1"}


@dataclass(frozen=True)
class Knobs:
    """Every knob, checked. Names as the variables' without ``LNKMEM_``, lower case."""

    # the program (lnk-lnkmem's start)
    log: str = "WARNING"  # LNKMEM_LOG: debug, info, warning or error
    bar_delay_s: float = 1.0  # LNKMEM_BAR_DELAY_S: `index` shows a bar only for a refresh this slow
    # a build
    batch_files: int = 4000  # LNKMEM_BATCH_FILES: a batch is committed every so many files
    worker: str = ""  # LNKMEM_WORKER: "0" never a second process, "1" always, "" when it pays
    readahead: str = ""  # LNKMEM_READAHEAD: "0" off, "1" or "" on
    ann_threshold: Optional[int] = None  # LNKMEM_ANN_THRESHOLD: vectors past which a graph is kept (index/ann.py)
    # the bridges
    max_body: Optional[int] = None  # LNKMEM_MAX_BODY: the largest answer read from a bridge (bridges/http.py)
    bridge_patience_s: Optional[float] = None  # LNKMEM_BRIDGE_PATIENCE_S: one request retried this long (bridges/http.py)
    # the copy (replica/sync.py)
    writeback_s: float = 60.0  # LNKMEM_WRITEBACK_S: §2.6 the write-back interval
    quiet_s: float = 5.0  # LNKMEM_QUIET_S: §7.3 the index quiet this long before a write-back
    recheck_s: float = 30.0  # LNKMEM_RECHECK_S: §7.2 the copy's version asked for again
    copy_part: Optional[int] = None  # LNKMEM_COPY_PART: a write-back's bytes in one file of the copy (replica/manifest.py)
    # notes
    notes_wait_s: float = 15.0  # LNKMEM_NOTES_WAIT_S: `remember` waits for a notes file held open for writing
    notes_keep: int = 50  # LNKMEM_NOTES_KEEP: the notes' kept versions, at most
    notes_keep_bytes: int = 16 << 20  # LNKMEM_NOTES_KEEP_BYTES: ... and their bytes together
    # a store driver (bridges/store_driver.py)
    driver_s: Optional[float] = None  # LNKMEM_DRIVER_S: its conversations listed every so often
    driver_timeout_s: Optional[float] = None  # LNKMEM_DRIVER_TIMEOUT_S: one call's limit
    driver_wait_s: float = 2.0  # LNKMEM_DRIVER_WAIT_S: a search waits this long at most for a listing under way
    # serve-many
    linger_s: float = 2.0  # LNKMEM_LINGER_S: an agent's memory kept open after its last session
    first_line_s: float = 10.0  # LNKMEM_FIRST_LINE_S: a connection's first line awaited this long
    close_s: float = 60.0  # LNKMEM_CLOSE_S: a binding's end waits this long for its write-backs (serve/bound.py)
    stop_s: float = 15.0  # LNKMEM_STOP_S: ... then this long for its memories to stop


_PARSE: dict[str, Callable[[str], object]] = {
    "log": _choice(_LEVELS, "expected debug, info, warning or error"),
    "bar_delay_s": _seconds(above_zero=False),
    "batch_files": _whole(1),
    "worker": _choice(_SWITCH, "expected 0 (never) or 1 (always)"),
    "readahead": _choice(_SWITCH, "expected 0 (off) or 1 (on)"),
    "ann_threshold": _whole(0),
    "max_body": _whole(1),
    "bridge_patience_s": _seconds(above_zero=True),
    "writeback_s": _seconds(above_zero=False),
    "quiet_s": _seconds(above_zero=False),
    "recheck_s": _seconds(above_zero=False),
    "copy_part": _whole(1),
    "notes_wait_s": _seconds(above_zero=False),
    "notes_keep": _whole(1),
    "notes_keep_bytes": _whole(1),
    "driver_s": _seconds(above_zero=True),
    "driver_timeout_s": _seconds(above_zero=True),
    "driver_wait_s": _seconds(above_zero=False),
    "linger_s": _seconds(above_zero=False),
    "first_line_s": _seconds(above_zero=False),
    "close_s": _seconds(above_zero=False),
    "stop_s": _seconds(above_zero=False),
}
NAMES = {f.name: "LNKMEM_" + f.name.upper() for f in fields(Knobs)}
assert set(_PARSE) == set(NAMES)


def read(environ: Mapping[str, str]) -> Knobs:
    """The knobs of ``environ``; KnobError naming the first bad variable."""
    got: dict[str, object] = {}
    for field, name in NAMES.items():
        raw = environ.get(name, "")
        if raw == "":
            continue
        try:
            got[field] = _PARSE[field](raw.strip())
        except ValueError as e:
            what = str(e) if str(e).startswith("expected") else f"expected {e}"
            raise KnobError(f"{name}: {what} (got {raw[:40]!r})") from None
    return Knobs(**got)  # type: ignore[arg-type]


_current: tuple[tuple, Knobs] = ((), Knobs())


def knobs() -> Knobs:
    """The knobs of this process's environment, read and checked again only when it changed."""
    global _current
    key = tuple(os.environ.get(name) for name in NAMES.values())
    seen, k = _current
    if key != seen:
        k = read(os.environ)
        _current = (key, k)
    return k


def check() -> Knobs:
    """Every knob checked at a program's start: KnobError for the first bad one."""
    return knobs()
