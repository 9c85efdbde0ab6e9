"""`lnk-lnkmem serve`: one agent's memory as MCP over stdio (§1.3, §4, §5.1)."""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from lnkmem.memory.config import AgentConfig
from lnkmem.memory.served import MemoryHandle, Searches
from lnkmem.protocol.mcp import OUT_HIGH, Session, pump

log = logging.getLogger("lnkmem")

READ_CHUNK = 1 << 16
START_DELAY_S = 0.05  # the memory is made once the first message is answered, or after this long
PR_SET_DUMPABLE = 4


def undumpable() -> None:
    """§5.1: no core file, no ptrace by others of our uid: a crash never writes a key to disk."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
            log.warning("could not make the process non-dumpable (errno %d)", ctypes.get_errno())
    except (OSError, AttributeError) as e:  # not Linux
        log.warning("could not make the process non-dumpable: %s", e)


class _Later(MemoryHandle):
    """The memory, built on a thread once the first message is answered, so that
    `initialize` is answered before the index (numpy, LMDB) is even imported and
    `tools/list` never waits for it:
    whether it serves notes, and its config, are the agent's config's. The
    searches that arrive meanwhile are answered before the memory looks at its
    sources (``searches``: a restart's first answer does not wait for the Home's walk)."""

    def __init__(self, cfg: AgentConfig):
        self.cfg = cfg
        self.serves_notes = bool(cfg.notes_path)
        self.memory = None
        self.built = threading.Event()
        self.searches = Searches()
        self.first_answered = threading.Event()

    def greeted(self) -> None:
        self.first_answered.set()

    def build(self) -> None:
        # `initialize` answered first (the index's import shares the GIL with it), and no longer
        # waited for: a fixed wait made every restart's first answer that much later
        self.first_answered.wait(START_DELAY_S)
        try:
            from lnkmem.memory.memory import Memory
            self.memory = Memory(self.cfg)
            self.memory.answers_first = self.searches
        finally:
            self.built.set()
        self.memory.start()

    def __call__(self):
        self.built.wait()
        return self.memory

    def is_built(self) -> bool:
        return self.built.is_set()

    def config(self) -> AgentConfig:
        return self.cfg

    def stop(self) -> None:
        if self.memory is not None:
            self.memory.stop()


class StdoutWriter:
    """Answers written to stdout by a thread of their own, so that a client that
    does not read never blocks the loop; ``waiting`` says how many bytes wait."""

    def __init__(self, fd: int):
        self.fd = fd
        self.queue: "collections.deque[bytes]" = collections.deque()
        self.waiting = 0
        self.lock = threading.Condition()
        self.broken = False
        threading.Thread(target=self._run, name="lnkmem-stdout", daemon=True).start()

    def send(self, line: bytes) -> None:
        if self.broken:
            return
        with self.lock:
            self.queue.append(line + b"\n")
            self.waiting += len(line) + 1
            self.lock.notify()

    def _run(self) -> None:
        while True:
            with self.lock:
                while not self.queue:
                    self.lock.wait()
                data = self.queue.popleft()
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)
                    view = view[n:]
            except OSError:  # the client went away: drop what is left
                self.broken = True
            with self.lock:
                self.waiting -= len(data)
                if self.broken:
                    self.queue.clear()
                    self.waiting = 0
                self.lock.notify_all()

    async def drain(self) -> None:
        """Return once few enough answers wait unread (poll: no thread held)."""
        step = 0.001
        while self.waiting > OUT_HIGH and not self.broken:
            await asyncio.sleep(step)
            step = min(step * 2, 0.05)

    def flush(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.lock:
            while self.queue or self.waiting:
                left = deadline - time.monotonic()
                if left <= 0 or self.broken:
                    return
                self.lock.wait(left)


class StdinReader:
    """Reads stdin on a daemon thread, one chunk each time the session asks
    (its flow control: nothing is read that it did not ask for)."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop):
        self.fd = fd
        self.loop = loop
        self.want = threading.Semaphore(0)
        self.future: "asyncio.Future[bytes] | None" = None
        threading.Thread(target=self._run, name="lnkmem-stdin", daemon=True).start()

    def _run(self) -> None:
        while True:
            self.want.acquire()
            try:
                chunk = os.read(self.fd, READ_CHUNK)
            except OSError:
                chunk = b""
            fut = self.future
            self.loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(chunk))
            if not chunk:
                return

    async def read(self) -> bytes:
        self.future = self.loop.create_future()
        self.want.release()
        return await self.future


def serve_stdio(cfg: AgentConfig) -> int:
    undumpable()
    memory = _Later(cfg)
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lnkmem-tool")
    out = StdoutWriter(sys.stdout.fileno())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        session = Session(memory, out.send, pool)
        threading.Thread(target=memory.build, name="lnkmem-start", daemon=True).start()
        stdin = StdinReader(sys.stdin.fileno(), loop)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        served = loop.create_task(pump(session, stdin.read, out.drain))
        stopped = loop.create_task(stop.wait())
        await asyncio.wait({served, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not served.done():
            served.cancel()
            await session.drain()
        stopped.cancel()

    try:
        asyncio.run(main())
        out.flush(10)
    finally:
        memory.stop()
        pool.shutdown(wait=False, cancel_futures=True)
    return 0
