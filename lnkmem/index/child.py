"""What the index's helper processes share: the environment a Python child is started
with, and a child's messages written to its parent on a thread of its own.

(The rest of the plumbing, fork, framing, ties to the parent, is :mod:`lnkmem.core.procs`.)
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from typing import Optional

import msgspec

from lnkmem.core import ownenv, procs


def child_env() -> dict:
    """The environment of a Python child of the index's (the deep check, a merge's
    helper): few variables, and lmdb and lnkmem where this process found them."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL")}
    env.update({k: os.environ.get(k, v) for k, v in ownenv.OWN.items()})  # ours: one BLAS thread
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class Sender:
    """The child's messages written on a thread of their own, so that it counts the
    next batch while the parent, busy with a commit of its own, has not read the
    last one yet (a pipe holds 64 KiB; a batch is megabytes): at most one message
    waits behind the one being written. A progress message that would wait is
    dropped."""

    _enc = msgspec.msgpack.Encoder()

    def __init__(self, w: int):
        self.w = w
        self.q: queue.Queue = queue.Queue(maxsize=1)
        self.failed: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            body = self.q.get()
            if body is None:
                return
            try:
                procs.write_framed(self.w, body)
            except BaseException as e:  # the parent gone or done with it: the child stops
                self.failed = e
                return

    def send(self, msg: msgspec.Struct, wait: bool = True) -> None:
        self._put(self._enc.encode(msg), wait)

    def _put(self, body: Optional[bytes], wait: bool = True) -> None:
        while True:
            if self.failed is not None:
                raise BrokenPipeError(str(self.failed))
            try:
                self.q.put(body, timeout=0.2 if wait else 0)
                return
            except queue.Full:
                if not wait:
                    return

    def close(self) -> None:
        """Wait until every message is written."""
        self._put(None)
        self.thread.join()
        if self.failed is not None:
            raise BrokenPipeError(str(self.failed))
