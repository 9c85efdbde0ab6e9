"""Start a fake server from a test and talk to it (standard library only).

    with FakeServer.start("fakes.files_bridge", "--unix", sock, "--root", root,
                          "--config", cfg) as bridge:
        bridge.fault("503", count=2)
        status, headers, body = bridge.request("GET", "/v1/list?path=", headers={...})
        bridge.log()          # the request log, a list of dicts

``FakeServer.start`` waits for the ready line (raising, with the server's
stderr, when it never comes) and ``stop`` terminates the process (SIGTERM,
then SIGKILL).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def fake_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for ``python -m fakes.X``: the repository on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


class FakeServer:
    def __init__(self, proc: subprocess.Popen, ready: dict[str, Any], stderr: Any):
        self.proc = proc
        self._stderr = stderr
        self.ready = ready
        self.listen: str = ready["listen"]

    @classmethod
    def start(cls, module: str, *args: str, timeout: float = 10.0, env: dict[str, str] | None = None) -> "FakeServer":
        stderr = tempfile.TemporaryFile()
        proc = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], cwd=REPO,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                env=fake_env(env))
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                break
            chunk = os.read(proc.stdout.fileno(), 1)
            if not chunk:
                break
            line += chunk
        try:
            ready = json.loads(line)
        except ValueError:
            ready = None
        if not (isinstance(ready, dict) and ready.get("ready") is True):
            proc.kill()
            proc.wait()
            proc.stdout.close()
            stderr.seek(0)
            err = stderr.read().decode(errors="replace")
            stderr.close()
            raise RuntimeError(f"{module} did not start: {line!r} {err}")
        return cls(proc, ready, stderr)

    def stderr(self) -> str:
        """What the server wrote on stderr so far."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    @property
    def socket_path(self) -> str | None:
        return self.listen[len("unix:"):] if self.listen.startswith("unix:") else None

    @property
    def base_url(self) -> str:
        """For an HTTP client: the TCP URL, or ``http://localhost`` over the Unix socket."""
        return "http://localhost" if self.socket_path else self.listen

    def connection(self, timeout: float = 10.0) -> http.client.HTTPConnection:
        if self.socket_path:
            return _UnixConnection(self.socket_path, timeout)
        host, port = self.listen.removeprefix("http://").rsplit(":", 1)
        return http.client.HTTPConnection(host, int(port), timeout=timeout)

    def request(self, method: str, path: str, body: bytes | str | dict | None = None,
                headers: dict[str, str] | None = None, timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        if isinstance(body, dict):
            body = json.dumps(body)
        conn = self.connection(timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def fault(self, mode: str = "ok", **kw: Any) -> dict[str, Any]:
        """Set the fault (see fakes.http.Fault); ``die`` and ``refuse`` need no answer."""
        status, _, body = self.request("POST", "/_fault", {"mode": mode, **kw})
        if status != 200:
            raise RuntimeError(f"/_fault answered {status}: {body!r}")
        return json.loads(body)

    def log(self) -> list[dict[str, Any]]:
        return json.loads(self.request("GET", "/_log")[2])["entries"]

    def relisten(self) -> None:
        """Listen again after a ``refuse`` fault."""
        self.proc.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
        self._stderr.close()

    def __enter__(self) -> "FakeServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
