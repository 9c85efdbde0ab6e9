"""The `changed` control's wait (§5.6): a memory told of a changed path, awaited on the loop until it is indexed."""

from __future__ import annotations

import asyncio

from lnkmem.core.aio import LoopSignal


async def tell_changed(memory, path: str, timeout: float = 30.0) -> bool:
    """Tell ``memory`` of a changed path; True once it is in the index, False
    after ``timeout`` (it is still indexed, later). Every control waiting at
    once is in the index thread's queue at once, so a burst is one pass."""
    done = LoopSignal(asyncio.get_running_loop())
    memory.changed_path(path, done)
    try:
        await asyncio.wait_for(asyncio.shield(done.future), timeout)
        return True
    except asyncio.TimeoutError:
        return False
