"""Uploads through the bridge client: time against body size (issue 33, goal 1).

Usage: ``.venv/bin/python bench/bench_upload.py [--sizes 8,38,75,145] [--record]``

One fake storage bridge on a Unix socket; for each size (MB) one create-only PUT of
that many random bytes below ``lnkmem/`` of the ``memory`` collection:

- before: the body handed to httpx as one ``bytes`` (what ``BridgeClient`` did until
  issue 33: httpcore's sync stream slices what is left of the buffer after every
  ``send``, so the copying grows with the square of the body);
- after: ``Collection.write`` (``BridgeClient`` sends the body in ``http.CHUNK`` pieces);
- raw: the same request written to the socket with ``socket.sendall`` (the floor).

Each figure is the best of ``--repeat`` (2) PUTs; every body is read back and compared.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: E402  (first of ours: it puts the repository's root on the path)
from common import load_note, machine, write_section  # noqa: E402

ROOT = Path(common.ROOT)

from fakes.harness import FakeServer  # noqa: E402
from lnkmem.bridges.http import CHUNK, BridgeClient, auth_header  # noqa: E402
from lnkmem.bridges.remote import Collection  # noqa: E402

KEY = "a1" * 32


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="8,38,75,145", help="body sizes in MB (10^6 bytes)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--skip-before", type=float, default=1e9,
                    help="MB from which the old way is not measured (it takes minutes)")
    ap.add_argument("--record", action="store_true", help="write the table into docs/BENCHMARKS.md")
    args = ap.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="lnkmem-upload-") as tmp:  # the bridge's files: removed after
        rows = measure(Path(tmp), sizes, args)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    mach = machine() + load_note()
    lines = ["## Uploads: time against body size (issue 33)", "",
             f"`.venv/bin/python bench/bench_upload.py` — {when}, on {mach}.", "",
             "| Body | before: one `bytes` body | after: `Collection.write` (pieces of "
             f"{CHUNK // 1024} KiB) | raw `sendall` |", "|---|---|---|---|"]
    for mb, got in rows:
        b = f"{got['before']:.2f} s" if "before" in got else "not measured"
        lines.append(f"| {mb:g} MB | {b} | {got['after']:.2f} s | {got['raw']:.2f} s |")
    lines += ["", "One fake storage bridge on a Unix socket (it reads the whole body, then writes and "
              "renames a file); one create-only PUT per figure, best of "
              f"{args.repeat}; each body read back from the bridge's disk and compared. Before: the "
              "body handed to httpx whole, as `BridgeClient` sent it until issue 33 (httpcore slices "
              "what is left of it after every `send`: quadratic). Raw: the request written with "
              f"`socket.sendall`. Total {time.monotonic() - t0:.0f} s."]
    print("\n".join(lines))
    if args.record:
        write_section("upload", lines)
    return 0


def measure(base: Path, sizes: list[float], args) -> list:
    """(size, {way: best seconds}) of each size, the fake bridge's files in ``base``."""
    config = base / "bridges.json"
    config.write_text('{"bindings": {"a1": {"owner": "o1", "key": "%s"}}}' % KEY)
    sock = base / "storage.sock"
    server = FakeServer.start("fakes.storage_bridge", "--unix", sock, "--root", base / "storage", "--config", config)
    client = BridgeClient(str(sock), "storage", "o1", "a1", KEY)
    coll = Collection(client, "memory")
    auth = auth_header(KEY, "storage", "o1", "a1")
    stored = base / "storage" / "stores" / "a1" / "memory" / "lnkmem"
    rows = []
    try:
        for mb in sizes:
            data = os.urandom(int(mb * 1e6))
            digest = hashlib.sha256(data).digest()
            got = {}
            for way in ("before", "after", "raw"):
                if way == "before" and mb >= args.skip_before:
                    continue
                best = None
                for i in range(args.repeat):
                    name = f"lnkmem/{way}-{mb:g}-{i}.bin"
                    t = time.monotonic()
                    if way == "before":
                        r = client.client.request("PUT", f"/v1/c/memory/{name}", content=data,
                                                  headers={"Authorization": auth, "If-None-Match": "*"})
                        assert r.status_code == 200, r.status_code
                    elif way == "after":
                        coll.write(name, data, None)
                    else:
                        raw_put(str(sock), auth, f"/v1/c/memory/{name}", data)
                    dt = time.monotonic() - t
                    best = dt if best is None else min(best, dt)
                    landed = stored / name.split("/", 1)[1]
                    assert hashlib.sha256(landed.read_bytes()).digest() == digest, f"{name} arrived damaged"
                    landed.unlink()
                got[way] = best
            rows.append((mb, got))
            print(f"{mb:g} MB: " + ", ".join(f"{k} {v:.2f} s" for k, v in got.items()), flush=True)
    finally:
        client.close()
        server.stop()
    return rows


def raw_put(path: str, auth: str, target: str, data: bytes) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        s.sendall((f"PUT {target} HTTP/1.1\r\nHost: bridge\r\nAuthorization: {auth}\r\n"
                   f"If-None-Match: *\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode())
        s.sendall(data)
        answer = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
    finally:
        s.close()


if __name__ == "__main__":
    sys.exit(main())
