"""A stand-in for ``lnk agent memory connect``: one session on stdio (PROTOCOL.md §5.3).

    python -m fakes.connect SOCKET (--hello AGENT | --line TEXT) [--timeout S]

Connects to the engine's Unix socket and writes the first line: ``{"agent":
AGENT}`` for ``--hello``, or TEXT exactly as given for ``--line`` (which need
not even be JSON, to test refusals). Reads the one-line answer:

- ``{"ok": true}``: copies standard input to the socket and the socket to
  standard output. At the end of standard input it half-closes the socket
  and keeps copying until the engine closes it; exits 0 when it does.
- ``{"error": ...}`` (or anything else, or no answer within the timeout):
  prints it on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading

MAX_ANSWER = 1024 * 1024 + 2


def _read_line(sock: socket.socket) -> tuple[bytes, bytes]:
    """(the first line, whatever came after it)."""
    buf = b""
    while b"\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the engine closed the connection without answering")
        buf += chunk
        if len(buf) > MAX_ANSWER:
            raise ConnectionError("the answer is over 1 MiB")
    line, _, rest = buf.partition(b"\n")
    return line, rest


def _pump_stdin(sock: socket.socket) -> None:
    fd = sys.stdin.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.connect", description=__doc__.split("\n\n")[0])
    parser.add_argument("socket")
    first = parser.add_mutually_exclusive_group(required=True)
    first.add_argument("--hello", metavar="AGENT", help='send {"agent": AGENT}')
    first.add_argument("--line", metavar="TEXT", help="send this first line as it is")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    line = json.dumps({"agent": args.hello}) if args.hello is not None else args.line

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(args.timeout)
        sock.connect(args.socket)
        sock.sendall(line.encode() + b"\n")
        answer, rest = _read_line(sock)
        sock.settimeout(None)
    except (OSError, ConnectionError) as e:
        print(f"connect: {e}", file=sys.stderr)
        return 1
    try:
        reply = json.loads(answer)
    except ValueError:
        reply = None
    if not (isinstance(reply, dict) and reply.get("ok") is True):
        why = reply.get("error") if isinstance(reply, dict) and "error" in reply else answer.decode(errors="replace")
        print(f"connect: refused: {why}", file=sys.stderr)
        return 1

    threading.Thread(target=_pump_stdin, args=(sock,), daemon=True).start()
    out = sys.stdout.buffer
    try:
        if rest:
            out.write(rest)
            out.flush()
        while True:
            data = sock.recv(65536)
            if not data:
                break
            out.write(data)
            out.flush()
    except (OSError, BrokenPipeError):
        pass
    finally:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
