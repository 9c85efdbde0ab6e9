"""asyncio helpers shared by the layers: a signal set from any thread that a coroutine awaits, and a poll on the loop."""

from __future__ import annotations

import asyncio
import time
from typing import Callable


class LoopSignal:
    """A ``set()`` callable from any thread (the index thread, say) that resolves
    a future on the loop: a coroutine waits on it, and no thread is held."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.future = loop.create_future()

    def _resolve(self) -> None:
        if not self.future.done():
            self.future.set_result(None)

    def set(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._resolve)
        except RuntimeError:  # the loop has ended: no one waits any more
            pass


async def until(pred: Callable[[], bool], timeout: float, most: float = 0.05) -> bool:
    """Poll ``pred`` on the loop (no thread held) until true or ``timeout``: every 2 ms at
    first, the step doubling up to ``most`` (how late a change may be seen)."""
    if pred():
        return True
    deadline = time.monotonic() + timeout
    step = 0.002
    while time.monotonic() < deadline:
        await asyncio.sleep(min(step, max(0.0, deadline - time.monotonic())))
        if pred():
            return True
        step = min(step * 2, most)
    return pred()
