"""Ignore files in Home (§3.2 rev. 2): ``.gitignore`` and ``.lnkmemignore``.

Both use git's syntax (gitignore(5)): ``#`` comments, ``!`` negation (the
last matching rule wins; a file below an ignored folder stays ignored), a
trailing ``/`` for folders only, a ``/`` at the start or in the middle
anchors the pattern to the ignore file's folder (otherwise it matches a name
at any depth), ``*``, ``?``, ``[a-z]``/``[!a-z]``/``[[:digit:]]`` classes, and ``**`` (``**/x``,
``x/**``, ``a/**/b``). Rules of a deeper folder override shallower ones; in
one folder ``.lnkmemignore`` overrides ``.gitignore``.

Skipped by default, as though a root ``.gitignore`` began with them (so a
``!node_modules/`` can take one back): ``node_modules/``, ``__pycache__/``,
``.git/``; and any virtual environment (a folder holding ``pyvenv.cfg``).

What they hide: an ignored file is never indexed, listed (`list`) or shown by a
search (one ignored since it was indexed is passed over until the next pass
takes it out); `read` of its exact ref still answers, as the contract asks
only that searches never show one. A Home behind the files bridge reads its
ignore files through the bridge (:class:`Listed`).

Written here rather than taken from ``pathspec`` (issue 48, ``bench/bench_ignore.py``):
a walk that does not enter an ignored folder asks about folders, and asked about a
folder (``name/``) ``GitIgnoreSpec`` 1.1.1 differs from git where a negated folder rule
follows a matching file rule (``*`` then ``!*/``; ``x/**`` then ``!x/*/``) and where
``x/**`` meets the folder ``x`` itself: against ``git ls-files -o -i`` on github/gitignore's
312 templates (17,576 files named after their patterns) it got 12 files wrong, these
rules 0 (and 0 of git's own tree, 37 nested ignore files, 5,760 files); asked about
files only it cannot prune and got 36 wrong. One bad line (a trailing backslash) makes
it refuse the whole file. It is slower too: walking the 10,870 entries of the bench
corpus (scale 1.0) with a 39-rule root file and three nested ones, 61 ms here and
136 ms with pathspec; with 246 rules (the Python, Node, macOS, JetBrains and VS Code
templates), 431 ms and 612 ms.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import NamedTuple, Optional

from lnkmem.core.atomic import identity

NAMES = (".gitignore", ".lnkmemignore")
DEFAULTS = ("node_modules/", "__pycache__/", ".git/")
MAX_BYTES = 256 * 1024  # of one ignore file; rules past it are not read
MAX_RULES = 2000


class Rule(NamedTuple):
    regex: re.Pattern
    negate: bool
    dir_only: bool


class Level(NamedTuple):
    base: str  # the folder the rules are relative to ("" for the root)
    rules: tuple[Rule, ...]


# git's POSIX classes inside a bracket (wildmatch.c), as regex class members
_POSIX = {
    "alnum": "a-zA-Z0-9", "alpha": "a-zA-Z", "blank": r" \t", "cntrl": r"\x00-\x1f\x7f",
    "digit": "0-9", "graph": r"!-~", "lower": "a-z", "print": r" -~",
    "punct": r"!-/:-@\[-`{-~", "space": r" \t\n\r\f\v", "upper": "A-Z", "xdigit": "0-9a-fA-F",
}


def _class(pat: str, i: int) -> tuple[Optional[str], int]:
    """A ``[...]`` class at ``pat[i]``: (regex, index after), or (None, i) if unclosed
    or naming an unknown ``[:name:]`` (git's wildmatch then matches nothing)."""
    j = i + 1
    out = "(?!/)["  # a class never matches a '/' (git matches paths with WM_PATHNAME)
    if j < len(pat) and pat[j] in "!^":
        out = "[^/"
        j += 1
    if j < len(pat) and pat[j] == "]":
        out += r"\]"
        j += 1
    while j < len(pat) and pat[j] != "]":
        c = pat[j]
        if c == "\\" and j + 1 < len(pat):
            out += re.escape(pat[j + 1])
            j += 2
            continue
        if c == "[" and pat.startswith("[:", j):
            end = pat.find(":]", j + 2)
            if end < 0:
                return None, i
            members = _POSIX.get(pat[j + 2:end])
            if members is None:
                return None, i
            out += members
            j = end + 2
            continue
        out += c if c == "-" else re.escape(c)
        j += 1
    if j >= len(pat):
        return None, i
    return out + "]", j + 1


def _trim_spaces(line: str) -> str:
    """Trailing spaces taken off unless the last is escaped by a backslash (git's
    trim_trailing_spaces: a backslash escapes the character after it, itself included)."""
    last_space = None
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == " ":
            if last_space is None:
                last_space = i
        elif c == "\\":
            i += 1
            if i >= n:
                return line
            last_space = None
        else:
            last_space = None
        i += 1
    return line if last_space is None else line[:last_space]


def translate(pattern: str) -> Optional[Rule]:
    """One line of an ignore file as a rule, or None (blank, comment, or a pattern that
    matches nothing in git: an unclosed ``[``, a trailing lone backslash)."""
    line = pattern[:-1] if pattern.endswith("\n") else pattern
    if line.endswith("\r"):  # a CRLF file: git takes off one CR, no more
        line = line[:-1]
    line = _trim_spaces(line)
    if not line or line.startswith("#"):
        return None
    negate = line.startswith("!")
    if negate:
        line = line[1:]
    elif line.startswith("\\!") or line.startswith("\\#"):
        line = line[1:]
    dir_only = line.endswith("/")  # one slash taken off, as git does
    if dir_only:
        line = line[:-1]
    if not line:
        return None
    anchored = "/" in line
    if line.startswith("/"):  # one, as git does ("//x" matches nothing)
        line = line[1:]
    out = [] if anchored else ["(?:.*/)?"]
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "*":
            if line.startswith("**", i) and (i == 0 or line[i - 1] == "/") and (i + 2 == n or line[i + 2] == "/"):
                if i + 2 == n:  # "x/**": everything inside
                    out.append(".*")
                    i += 2
                else:  # "**/": zero or more folders
                    out.append("(?:.*/)?")
                    i += 3
                continue
            while i < n and line[i] == "*":
                i += 1
            out.append("[^/]*")
            continue
        if c == "?":
            out.append("[^/]")
        elif c == "[":
            cls, j = _class(line, i)
            if cls is None:  # git's wildmatch gives up on the whole pattern
                return None
            out.append(cls)
            i = j
            continue
        elif c == "\\":
            if i + 1 == n:  # nothing left to escape: git matches nothing
                return None
            out.append(re.escape(line[i + 1]))
            i += 2
            continue
        else:
            out.append(re.escape(c))
        i += 1
    try:
        return Rule(re.compile("".join(out) + r"\Z", re.S), negate, dir_only)
    except re.error:
        return None


def parse(text: str) -> tuple[Rule, ...]:
    rules = []
    for line in text.split("\n"):  # lines end at LF only (a CR may be part of a name)
        r = translate(line)
        if r is not None:
            rules.append(r)
            if len(rules) >= MAX_RULES:
                break
    return tuple(rules)


_DEFAULT = Level("", parse("\n".join(DEFAULTS)))


def decide(stack: list[Level], rel: str, is_dir: bool) -> bool:
    """Whether ``rel`` (relative to the root; its folder's levels in ``stack``) is
    ignored by the rules themselves; the last matching rule wins."""
    ignored = False
    for base, rules in stack:
        if base:
            if not rel.startswith(base + "/"):
                continue
            sub = rel[len(base) + 1:]
        else:
            sub = rel
        for r in rules:
            if r.dir_only and not is_dir:
                continue
            if r.regex.match(sub):
                ignored = not r.negate
    return ignored


class Ignorer:
    """The ignore rules of one folder tree, read folder by folder and kept while
    the files are unchanged."""

    def __init__(self, root: str):
        self.root = root
        self._cache: dict[str, tuple[tuple, tuple[Rule, ...]]] = {}
        self._folders: dict[str, tuple] = {}  # rel_dir -> (its stamp, venv, levels, (ignore file, stamp)s)
        self._lock = threading.Lock()

    def _rules(self, path: str) -> tuple[Rule, ...]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            with self._lock:
                self._cache.pop(path, None)
            return ()
        try:
            s = os.fstat(fd)
            key = (s.st_mtime_ns, s.st_size, s.st_ino)
            with self._lock:
                got = self._cache.get(path)
            if got is not None and got[0] == key:
                return got[1]
            import stat as st
            if not st.S_ISREG(s.st_mode):
                return ()
            data = os.read(fd, MAX_BYTES)
        except OSError:
            return ()
        finally:
            os.close(fd)
        rules = parse(data.decode("utf-8", "replace"))
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[path] = (key, rules)
        return rules

    def level(self, rel_dir: str, full_dir: str) -> list[Level]:
        """The levels a folder adds: the defaults at the root, then its ignore files."""
        out = [_DEFAULT] if not rel_dir else []
        for name in NAMES:
            rules = self._rules(os.path.join(full_dir, name))
            if rules:
                out.append(Level(rel_dir, rules))
        return out

    def skip(self, stack: list[Level], rel: str, is_dir: bool, full: str) -> bool:
        """Whether the walk skips ``rel`` (its parent folder's levels in ``stack``)."""
        if is_dir and os.path.isfile(os.path.join(full, "pyvenv.cfg")):
            return True
        return decide(stack, rel, is_dir)

    def stack_to(self, rel_dir: str, memo: Optional[dict] = None) -> Optional[list[Level]]:
        """The levels in force inside ``rel_dir`` (a folder below the root, "" for
        it), or None when the folder or one above it is ignored. ``memo`` keeps
        folders already looked at (several paths checked at once)."""
        if memo is not None and rel_dir in memo:
            return memo[rel_dir]
        parts = [p for p in rel_dir.split("/") if p]
        # from the root down, a loop (no recursion: a tree may be ~2,048 folders deep),
        # starting below the deepest folder of the way already in ``memo``
        ways = [""]
        for p in parts:
            ways.append(f"{ways[-1]}/{p}" if ways[-1] else p)
        at = -1
        if memo is not None:
            at = next((i for i in range(len(parts), -1, -1) if ways[i] in memo), -1)
        if at < 0:
            stack = self._folder("", self.root)[1]
            at = 0
            if memo is not None:
                memo[""] = stack
        else:
            stack = memo[ways[at]]
        full = os.path.join(self.root, *parts[:at])
        for i in range(at + 1, len(parts) + 1):
            full = os.path.join(full, parts[i - 1])
            if stack is not None:
                venv, levels = self._folder(ways[i], full)
                stack = None if venv or decide(stack, ways[i], True) else stack + levels
            if memo is not None:
                memo[ways[i]] = stack
        if memo is not None:
            memo[rel_dir] = stack
        return stack

    # a folder or ignore file changed this recently is read again: timestamps are coarse
    # (a tick of the kernel's clock), so two changes within one would look like none
    RECENT_NS = 2_000_000_000

    def _folder(self, rel_dir: str, full: str) -> tuple[bool, list[Level]]:
        """(whether the folder is a virtual environment, the levels its ignore files
        add), kept from one search to the next while the folder's stat (an entry
        made, removed or renamed in it changes it) and those of the ignore files it
        held are as they were: one stat a folder, not an open a name and a stat
        (a search looks at its hits' folders every time)."""
        key = _stamp(full, True, self.RECENT_NS)
        if key is not None:
            got = self._folders.get(rel_dir)
            if got is not None and got[0] == key and all(_stamp(f, False, self.RECENT_NS) == k for f, k in got[3]):
                return got[1], got[2]
        venv = bool(rel_dir) and os.path.isfile(os.path.join(full, "pyvenv.cfg"))
        levels = [] if venv else self.level(rel_dir, full)
        if key is not None:
            files = tuple((f, _stamp(f, False, self.RECENT_NS)) for f in (os.path.join(full, n) for n in NAMES)
                          if os.path.lexists(f))
            if all(k is not None for _, k in files):
                with self._lock:
                    if len(self._folders) > 10_000:
                        self._folders.clear()
                    self._folders[rel_dir] = (key, venv, levels, files)
        return venv, levels

    def ignored(self, rel: str, is_dir: bool, memo: Optional[dict] = None) -> bool:
        """Whether ``rel`` (relative to the root) is ignored, by a rule or by lying
        in an ignored folder."""
        rel = rel.strip("/")
        if not rel:
            return False
        parent, _, _ = rel.rpartition("/")
        stack = self.stack_to(parent, memo)
        if stack is None:
            return True
        return self.skip(stack, rel, is_dir, os.path.join(self.root, *rel.split("/")))


def _stamp(path: str, follow: bool, recent_ns: int) -> Optional[tuple]:
    """What tells a change of ``path`` (device, inode, times, size); None when it cannot
    be read or changed too recently to be told from a change to come."""
    try:
        st = os.stat(path, follow_symlinks=follow)
    except OSError:
        return None
    if time.time_ns() - st.st_mtime_ns < recent_ns:  # (a change moves the ctime too, to the same coarse tick)
        return None
    return identity(st)


class Listed(Ignorer):
    """The ignore rules of a folder tree known from its listing (a Home behind
    the files bridge, §8.2): the rules of each ignore file, by its path, and
    the folders holding ``pyvenv.cfg``. Decides as :class:`Ignorer` does."""

    def __init__(self, rules: dict[str, tuple[Rule, ...]], venvs: frozenset[str] = frozenset()):
        super().__init__("")
        self.rules = rules
        self.venvs = venvs

    def level(self, rel_dir: str, full_dir: str) -> list[Level]:
        out = [_DEFAULT] if not rel_dir else []
        for name in NAMES:
            rules = self.rules.get(f"{rel_dir}/{name}" if rel_dir else name)
            if rules:
                out.append(Level(rel_dir, rules))
        return out

    def skip(self, stack: list[Level], rel: str, is_dir: bool, full: str) -> bool:
        if is_dir and rel in self.venvs:
            return True
        return decide(stack, rel, is_dir)

    def _folder(self, rel_dir: str, full: str) -> tuple[bool, list[Level]]:
        """From the listing: nothing on disk to stat."""
        venv = bool(rel_dir) and rel_dir in self.venvs
        return venv, ([] if venv else self.level(rel_dir, full))
