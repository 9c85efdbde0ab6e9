"""`lnk-lnkmem serve`: one agent's memory as MCP over stdio (§1.3, §4)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from lnkmem.config import AgentConfig
from lnkmem.mcp import LineBuffer, Session

READ_CHUNK = 1 << 16
START_DELAY_S = 0.05  # let `initialize` be answered before indexing starts


class _Later:
    """The memory, built on a thread after start so that `initialize` is
    answered before the index (numpy, LMDB) is even imported."""

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.memory = None
        self.built = threading.Event()

    def build(self) -> None:
        time.sleep(START_DELAY_S)  # let `initialize` be answered first
        try:
            from lnkmem.engine import Memory
            self.memory = Memory(self.cfg)
        finally:
            self.built.set()
        self.memory.start()

    def __call__(self):
        self.built.wait()
        return self.memory

    def stop(self) -> None:
        if self.memory is not None:
            self.memory.stop()


def serve_stdio(cfg: AgentConfig) -> int:
    memory = _Later(cfg)
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lnkmem-tool")
    out = sys.stdout.buffer
    out_lock = threading.Lock()

    def send(line: bytes) -> None:
        with out_lock:
            try:
                out.write(line + b"\n")
                out.flush()
            except (BrokenPipeError, ValueError):
                pass

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = asyncio.Event()
        session = Session(memory, send, pool)
        lines = LineBuffer()
        threading.Thread(target=memory.build, name="lnkmem-start", daemon=True).start()

        def feed(chunk: bytes) -> None:
            if not chunk:
                for line in lines.end():
                    session.handle(line)
                done.set()
                return
            for line in lines.feed(chunk):
                if line is None:
                    session.too_long()
                else:
                    session.handle(line)

        def reader() -> None:
            fd = sys.stdin.fileno()
            while True:
                try:
                    chunk = os.read(fd, READ_CHUNK)
                except OSError:
                    chunk = b""
                loop.call_soon_threadsafe(feed, chunk)
                if not chunk:
                    return

        threading.Thread(target=reader, name="lnkmem-stdin", daemon=True).start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        await session.drain()

    try:
        asyncio.run(main())
    finally:
        memory.stop()
        pool.shutdown(wait=False, cancel_futures=True)
    return 0
