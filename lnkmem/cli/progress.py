"""A progress bar for people, on a terminal only (tqdm, imported when first drawn).

One line on stderr, redrawn in place and cut to the terminal's width (so a
40-column terminal gets one line, not one per update); it names its phase
(listing, reading, merging, embedding), shows the rate and the time left
when the amount of work is known, and the time spent when it is not. A
ticker redraws it twice a second so that a long phase with no count
(listing, merging) never looks stalled. ``delay``: draw nothing until the
work has taken that long (a search's quiet refresh). ``close`` always ends
the line it drew, so whatever is printed next starts on a line of its own.

Never imported by ``serve``: tqdm's imports take time, paid only by the
people commands, and only when a bar is actually drawn.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Optional, TextIO

# what matters first; tqdm cuts a line to the terminal's width, so a narrow one
# gets a shorter format rather than a line cut before the time left
KNOWN = "{desc} {percentage:3.0f}% {n_fmt}/{total_fmt} {unit} · {elapsed} · {remaining} left · {rate_fmt} {bar}"
NARROW = "{desc} {percentage:3.0f}% {n_fmt}/{total_fmt} · {remaining} left"
UNKNOWN = "{desc}… {elapsed}"
NARROW_BELOW = 64
TICK_S = 0.5


class Bar:
    def __init__(self, stream: TextIO, delay: float = 0.0, enabled: Optional[bool] = None):
        self.stream = stream
        if enabled is None:
            try:
                enabled = stream.isatty()
            except (AttributeError, ValueError, OSError):
                enabled = False
        self.on = enabled
        self.delay = delay
        self.t0 = time.monotonic()
        self.name = ""
        self.unit = "files"
        self.total: Optional[int] = None
        self.done = 0
        self.phase_t0 = time.time()  # tqdm's clock
        self.shown = False
        self._tq = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker: Optional[threading.Thread] = None

    # --- what the work reports ---------------------------------------------------

    def phase(self, name: str, total: Optional[int] = None, unit: str = "files") -> None:
        """A new phase: ``total`` is None when the amount of work is not known."""
        if not self.on:
            return
        with self._lock:
            self.name, self.total, self.unit, self.done = name, total, unit, 0
            self.phase_t0 = time.time()
            if self._tq is not None:
                self._tq.total = total  # reset keeps the old total when given None
                self._configure()
                self._tq.reset(total=total)
                self._tq.refresh()
            else:
                self._maybe_show()
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="lnkmem-bar", daemon=True)
            self._ticker.start()

    def update(self, done: int, total: Optional[int] = None) -> None:
        if not self.on:
            return
        with self._lock:
            if total is not None and total != self.total:
                self.total = total
                if self._tq is not None:
                    self._tq.total = total
                    self._configure()
            delta = done - self.done
            self.done = done
            if self._tq is not None:
                if delta >= 0:
                    self._tq.update(delta)
                else:
                    self._tq.n = done
                    self._tq.refresh()
            else:
                self._maybe_show()

    def rename(self, name: str) -> None:
        """Say what the phase is doing now (writing a batch...), its counts kept."""
        if not self.on:
            return
        with self._lock:
            self.name = name
            if self._tq is not None:
                self._tq.set_description_str(name, refresh=True)

    def close(self) -> None:
        """Stop drawing; end the bar's line when one was drawn."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        with self._lock:
            if self._tq is not None:
                self._tq.n = self.done
                self._tq.close()  # leave=True: redrawn a last time, then a newline
                self._tq = None

    # --- drawing -------------------------------------------------------------------

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (AttributeError, ValueError, OSError):
            return 80

    def _configure(self) -> None:
        self._tq.set_description_str(self.name, refresh=False)
        self._tq.unit = " " + self.unit
        self._tq.bar_format = self._format()

    def _format(self) -> str:
        fmt = UNKNOWN if self.total is None else NARROW if self._width() < NARROW_BELOW else KNOWN
        fmt = fmt.replace("{unit}", self.unit)
        if not (getattr(self.stream, "encoding", None) or "").lower().replace("-", "").startswith("utf"):
            fmt = fmt.replace("·", "|").replace("…", "...")  # a terminal that is not UTF-8
        return fmt

    def _maybe_show(self) -> None:
        if self._tq is not None or self._stop.is_set() or time.monotonic() - self.t0 < self.delay:
            return  # (a phase named by a timer after close draws nothing)
        from tqdm import tqdm
        tqdm.monitor_interval = 0  # no monitor thread: the ticker below redraws
        self._tq = tqdm(total=self.total, initial=self.done, file=self.stream, dynamic_ncols=True,
                        leave=True, mininterval=0.1, miniters=1, smoothing=0.1, ascii=None,
                        desc=self.name, unit=" " + self.unit, bar_format=self._format(), delay=3600)
        self._tq.delay = 0  # (a delay only to keep tqdm from drawing before it is set up)
        self._tq.start_t = min(self._tq.start_t, self.phase_t0)  # drawn late: the phase's time, not the bar's
        self._configure()
        self._tq.refresh()
        self.shown = True

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                if self._stop.is_set():
                    return
                if self._tq is None:
                    self._maybe_show()
                else:
                    self._configure()  # the terminal may have been resized
                    self._tq.refresh()
