"""What one agent is served with: folders, spec and environment (§1-§2).

Everything an agent is served with travels in `serve`'s argv (§1.2 rev. 2):
``--spec`` (the spec as compact JSON), ``--notes <path>``, ``--from`` and
(rev. 3) ``--store-driver <path>``. A
flag wins over the environment; the environment is used where a flag is
absent (a person running `serve` by hand). `command` writes the flags,
`serve` and `serve-many`'s Agents read them, both through this module.
"""

from __future__ import annotations

import argparse
import errno
import os
import stat
from dataclasses import dataclass, field
from typing import Mapping, NoReturn, Optional, Sequence

from lnkmem.core import atomic
from lnkmem.core.errors import UsageError
from lnkmem.memory.spec import notes_limit, parse_spec
from lnkmem.core.wire import ID_RE, Spec, encode

PROG = "lnk-lnkmem"

# §5.2 rev. 2: the only variables an Agents entry's env may give an agent; others are ignored
AGENT_ENV = ("LNK_MEMORY_MODEL", "LNK_AGENT", "LNK_AGENT_ID", "LNK_OWNER")


@dataclass(frozen=True)
class AgentConfig:
    folder: str
    state: str
    agent: Optional[str]
    spec: Spec
    notes_path: Optional[str]
    notes_limit: int
    from_required: bool
    owner: str
    model_url: str
    env: Mapping[str, str] = field(default_factory=dict)
    # §2.3 rev. 2: a bound agent not named in <agents> needs no thread, but a
    # thread it does name is judged by the rules with the Bound line's owner
    judge_threads: bool = False
    # §3.5 rev. 3: the store driver keeping this agent's conversations (--store-driver)
    store_driver: Optional[str] = None

    @property
    def budget(self) -> int:
        """The most bytes of text one result may hold (§2.1)."""
        return 4 * self.spec.tokens

    def serve_flags(self) -> list[str]:
        """The flags that make `serve` serve exactly this (§1.2)."""
        spec = {"model": self.spec.model, "tokens": self.spec.tokens, "notes": self.spec.notes}
        out = ["--spec", encode({k: v for k, v in spec.items() if v is not None}).decode()]
        if self.notes_path:
            out += ["--notes", self.notes_path]
        if self.from_required:
            out.append("--from")
        if self.store_driver:
            out += ["--store-driver", self.store_driver]
        return out


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    """`serve`'s flags (§1.2): a flag wins over the environment."""
    p.add_argument("--spec", metavar="JSON", help="the agent's spec (else $LNK_MEMORY_SPEC)")
    p.add_argument("--notes", metavar="PATH", help="the notes file; serves `remember` (else $LNK_MEMORY_NOTES)")
    p.add_argument("--from", dest="from_", action="store_true",
                   help="every call names its conversation (else $LNK_MEMORY_FROM=1)")
    p.add_argument("--store-driver", metavar="PATH",
                   help="the store driver keeping the agent's conversations (else $LNK_STORE_DRIVER)")


def check_id(what: str, value: str) -> str:
    """An ID matching the whole string (a trailing newline is not an ID)."""
    if not isinstance(value, str) or ID_RE.fullmatch(value) is None:
        raise UsageError(f"{what}: {value!r} is not an ID (a letter or digit, then letters, digits, "
                         f"'.', '_' or '-'; at most 128)")
    return value


def from_args(folder: str, state: str, agent: Optional[str], env: Mapping[str, str],
              need_folder: bool = True, spec: Optional[str] = None, notes: Optional[str] = None,
              from_flag: bool = False, store_driver: Optional[str] = None) -> AgentConfig:
    """Check the command line's folders, flags and the environment; UsageError if bad.

    ``spec``, ``notes`` and ``from_flag`` are `serve`'s flags; where one is
    absent the environment's variable is used.
    """
    if spec is not None:
        try:
            the_spec = parse_spec(spec)
        except UsageError as e:
            raise UsageError("--spec" + str(e)[len("LNK_MEMORY_SPEC"):]) from None
    else:
        the_spec = parse_spec(env.get("LNK_MEMORY_SPEC"))
    if not folder:
        raise UsageError("folder: an empty path")
    folder_abs = os.path.abspath(folder)
    if need_folder and not os.path.isdir(folder_abs):
        raise UsageError(f"folder does not exist: {folder}")
    if not state:
        raise UsageError("state: an empty path")
    agent_abs = os.path.abspath(agent) if agent else None
    if agent_abs is not None and need_folder and not os.path.isdir(agent_abs):
        raise UsageError(f"agent folder does not exist: {agent}")
    if notes is not None:
        if not os.path.isabs(notes):
            raise UsageError(f"--notes: not an absolute path: {notes!r}")
    else:
        notes = env.get("LNK_MEMORY_NOTES") or None
        if notes is not None and not os.path.isabs(notes):
            raise UsageError(f"LNK_MEMORY_NOTES: not an absolute path: {notes}")
    if store_driver is not None:  # §2.5 rev. 3: an absolute path, run directly (no shell, no PATH)
        if not os.path.isabs(store_driver) or "\0" in store_driver:
            raise UsageError(f"--store-driver: not an absolute path: {store_driver!r}")
    else:
        store_driver = env.get("LNK_STORE_DRIVER") or None
        if store_driver is not None and (not os.path.isabs(store_driver) or "\0" in store_driver):
            raise UsageError(f"LNK_STORE_DRIVER: not an absolute path: {store_driver!r}")
    owner = env.get("LNK_OWNER", "")
    if owner:
        check_id("LNK_OWNER", owner)
    return AgentConfig(
        folder=folder_abs,
        state=os.path.abspath(state),
        agent=agent_abs,
        spec=the_spec,
        notes_path=notes,
        notes_limit=notes_limit(the_spec),
        from_required=from_flag or env.get("LNK_MEMORY_FROM") == "1",
        owner=owner,
        model_url=env.get("LNK_MEMORY_MODEL", ""),
        env=dict(env),
        store_driver=store_driver,
    )


class _ArgvParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _serve_parser() -> _ArgvParser:
    p = _ArgvParser(prog=f"{PROG} serve", allow_abbrev=False, add_help=False)
    p.add_argument("folder")
    p.add_argument("state")
    p.add_argument("agent", nargs="?")
    add_serve_flags(p)
    return p


def from_serve_argv(argv: Sequence[str], env: Mapping[str, str]) -> AgentConfig:
    """§5.2-§5.3: what `serve` would serve with ``argv`` (never executed) and the
    few variables of an Agents entry's env; UsageError naming what is wrong."""
    if not isinstance(argv, (list, tuple)) or not all(isinstance(a, str) for a in argv):
        raise UsageError("argv: must be a list of strings")
    if not argv or os.path.basename(argv[0]) != PROG:
        raise UsageError(f"argv[0] is not {PROG}")
    if len(argv) < 4 or argv[1] != "serve":
        raise UsageError(f"argv is not `{PROG} serve <folder> <state> [<agent>] [flags]`")
    args = _serve_parser().parse_args(list(argv[2:]))
    for what, path in (("folder", args.folder), ("state", args.state), ("agent", args.agent)):
        if path is not None and not os.path.isabs(path):
            raise UsageError(f"argv's {what} must be an absolute path: {path!r}")
    if not isinstance(env, Mapping):
        raise UsageError("env: must be an object")
    kept = {}
    for k in AGENT_ENV:
        v = env.get(k)
        if v is None:
            continue
        if not isinstance(v, str):
            raise UsageError(f"env.{k}: must be a string")
        kept[k] = v
    return from_args(args.folder, args.state, args.agent, kept, spec=args.spec, notes=args.notes,
                     from_flag=args.from_, store_driver=args.store_driver)


# --- an agent's folders, opened once, never through a link (§2.2 rev. 3) ---------------

class FolderRefused(UsageError):
    """A notes folder or state reached through a symbolic link below the agent folder."""


FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def below(path: str, agent: Optional[str]) -> bool:
    """Whether ``path`` is the agent folder or inside it (by name: both absolute)."""
    return bool(agent) and (path == agent or path.startswith(agent.rstrip(os.sep) + os.sep))


def open_folder(path: str, agent: Optional[str], create: bool = True, mode: int = 0o700) -> Optional[int]:
    """A descriptor on the folder ``path`` (None when it is missing and ``create`` is
    false); FolderRefused when a link stands in the way.

    Below the agent folder, every component after ``<agent>`` is opened from its
    parent's descriptor with ``O_NOFOLLOW`` (a link is refused, however it got
    there, and a swap after the open changes nothing: the descriptor is held).
    Elsewhere (a person's ``--notes``), the parent is opened as named and the
    folder itself never through a link. Missing folders are made (``mode``)."""
    path = os.path.abspath(path)
    if atomic.is_pinned(path):  # a folder opened once already (atomic.pinned): that folder, again
        return os.open(path, FOLDER_FLAGS)
    if below(path, agent):
        start, rel = agent, os.path.relpath(path, agent)
        parts = [] if rel == "." else rel.split(os.sep)
    else:
        start, name = os.path.split(path)
        parts = [name] if name else []
        if create:
            os.makedirs(start, exist_ok=True)
    try:
        fd = os.open(start, FOLDER_FLAGS)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        for i, part in enumerate(parts):
            try:
                nxt = _open_component(fd, part, create, mode)
            except FileNotFoundError:
                if create:
                    raise
                os.close(fd)
                return None
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    try:
                        link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                    except OSError:
                        link = False
                    where = os.path.join(start, *parts[:i + 1])
                    if link:
                        raise FolderRefused(f"{where} is a symbolic link: an agent's folders are never "
                                            f"reached through a link (make it a plain folder)") from None
                    raise FolderRefused(f"{where} is not a folder") from None
                raise
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_component(fd: int, part: str, create: bool, mode: int) -> int:
    flags = FOLDER_FLAGS | os.O_NOFOLLOW
    try:
        return os.open(part, flags, dir_fd=fd)
    except FileNotFoundError:
        if not create:
            raise
    try:
        os.mkdir(part, mode, dir_fd=fd)
    except FileExistsError:
        pass
    return os.open(part, flags, dir_fd=fd)


def same_folder(fd: int, path: str) -> bool:
    """Whether ``path``, by name now, is the folder the descriptor holds."""
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
