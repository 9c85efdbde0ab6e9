"""What the commands of `lnk-lnkmem` share: the program's name and path, the checks of
folder arguments, a people command's config, the build lock, and output to a terminal."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from typing import Optional

from lnkmem.core import atomic
from lnkmem.core.errors import UsageError

PROG = "lnk-lnkmem"
LOCK_NAME = "build.lock"


def program_path() -> str:
    """The absolute path of this very program (what Link's sandbox reads)."""
    me = sys.argv[0]
    if os.path.basename(me) == PROG and os.path.exists(me):
        return os.path.abspath(me)
    beside = os.path.join(os.path.dirname(sys.executable), PROG)
    if os.path.exists(beside):
        return os.path.abspath(beside)
    found = shutil.which(PROG)
    if found:
        return os.path.abspath(found)
    raise UsageError(f"cannot find the {PROG} program (is the package installed?)")


# --- paths -------------------------------------------------------------------------

def check_utf8(label: str, path: str) -> None:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # argv's undecodable bytes: refs, JSON and the index name paths in UTF-8
        raise UsageError(f"{label}: the path is not valid UTF-8: {ascii(path)}") from None


def check_folder(label: str, path: str) -> str:
    """An existing folder we can read, as an absolute path; UsageError otherwise."""
    if not path:
        raise UsageError(f"{label}: an empty path")
    check_utf8(label, path)
    full = os.path.abspath(path)
    try:
        if not os.path.exists(full):
            raise UsageError(f"{label} does not exist: {path}")
        if not os.path.isdir(full):
            raise UsageError(f"{label} is not a folder: {path}")
        os.listdir(full)
    except PermissionError:
        raise UsageError(f"{label} cannot be read: {path} (permission denied)") from None
    except OSError as e:
        raise UsageError(f"{label} cannot be read: {path} ({e.strerror})") from None
    return full


def check_state(path: str, create: bool) -> str:
    """The state folder, made (and proved writable) when ``create``."""
    if not path:
        raise UsageError("state: an empty path")
    check_utf8("state", path)
    full = os.path.abspath(path)
    if os.path.exists(full) and not os.path.isdir(full):
        raise UsageError(f"state is not a folder: {path}")
    if not create:
        up = full
        while not os.path.exists(up):
            up = os.path.dirname(up)
        if not os.path.isdir(up):
            raise UsageError(f"state cannot be made: {path} ({up} is not a folder)")
        return full
    try:
        os.makedirs(full, mode=0o700, exist_ok=True)
        probe = os.path.join(full, f".write-check-{os.getpid()}-{os.urandom(6).hex()}")
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"state cannot be written: {path} ({e.strerror or e})") from None
    return full


def open_config(folder: str, state: str, agent: Optional[str], create_state: bool, tokens: Optional[int] = None):
    import dataclasses
    from lnkmem.memory.config import from_args
    folder = check_folder("folder", folder)
    agent = check_folder("agent folder", agent) if agent is not None else None
    env = dict(os.environ)
    if agent and not env.get("LNK_MEMORY_NOTES"):  # a person searching an agent means its notes too
        notes = os.path.join(agent, "memory", "notes.md")
        if os.path.isfile(notes):
            env["LNK_MEMORY_NOTES"] = notes
    cfg = from_args(folder, state, agent, env)  # the spec and the environment
    check_apart(cfg.folder, cfg.state, cfg.agent)
    check_state(state, create_state)
    if tokens is not None:
        import msgspec
        cfg = dataclasses.replace(cfg, spec=msgspec.structs.replace(cfg.spec, tokens=tokens))
    return cfg


def within(inner: str, outer: str) -> bool:
    inner, outer = os.path.realpath(inner), os.path.realpath(outer)
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def check_apart(folder: str, state: str, agent: Optional[str]) -> None:
    """Home, the state and the agent folder may nest (the state inside the agent folder,
    both inside Home) but Home may not be, or lie inside, the other two: it would be
    skipped whole."""
    if within(folder, state):
        raise UsageError(f"state: {state} is Home or holds it; give the index a folder of its own")
    if agent is not None and within(folder, agent):
        raise UsageError(f"agent folder: {agent} is Home or holds it; give the agent's own folder")


def agent_of(args) -> Optional[str]:
    old = getattr(args, "old_agent", None)
    if old is not None and args.agent is not None:
        raise UsageError("the agent folder is given twice: once after the state, once with --agent")
    return args.agent if args.agent is not None else old


# --- the lock: who is building this index --------------------------------------------

class BuildLock:
    """``<state>/build.lock``, held (flock) while a people command writes the index."""

    def __init__(self, state: str):
        self.path = os.path.join(state, LOCK_NAME)
        self.fd: Optional[int] = None

    def acquire(self) -> Optional[int]:
        """Take the lock; the pid of whoever holds it when it cannot be taken now."""
        import fcntl
        fd = atomic.open_lock(self.path)  # (a link there unlinked, never followed; a FIFO, a folder: removed)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_pid(fd)
            os.close(fd)
            return holder or -1
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the lock goes with the descriptor; the file stays (status reads it)
            self.fd = None


def read_pid(fd: int) -> int:
    try:
        return int(os.pread(fd, 32, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def building_pid(state: str) -> Optional[int]:
    """The pid of a process building the index at ``state`` now, or None."""
    import fcntl
    try:  # (never through a link, never waiting on a FIFO: none of those is a builder's lock)
        fd = os.open(os.path.join(state, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return read_pid(fd) or -1
    finally:
        os.close(fd)


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def emit(text: str) -> None:
    """Write the answer to stdout; a reader that stopped reading (`| head`) ends us quietly,
    and a character the output's encoding lacks is replaced, never a traceback."""
    try:
        try:
            sys.stdout.reconfigure(errors="replace")
        except (AttributeError, ValueError):
            pass
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's last flush must not fail either
        os.close(devnull)


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def use_colour(stream) -> bool:
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return is_terminal(stream)



# On a terminal, a file's control characters are shown, never obeyed: an indexed file
# holding escape sequences must not retitle, recolour or rewrite a person's terminal.
_VISIBLE = {c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}
_VISIBLE.update({0x7F: 0x2421, **{c: 0xFFFD for c in range(0x80, 0xA0)}})


def visible(text: str) -> str:
    return text.translate(_VISIBLE)


