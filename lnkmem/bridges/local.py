"""A local folder as a place (§3.2 rules for what is listed and read)."""

from __future__ import annotations

import os
import stat as st
from typing import Iterable, Optional

from lnkmem.bridges.place import MAX_FILE, Entry, Forbidden, NotFound, check_relpath


def version_of(s: os.stat_result) -> str:
    return f"{s.st_mtime_ns:x}-{s.st_size:x}-{s.st_ino:x}"


class LocalPlace:
    """Files below ``root``; hidden names skipped; ``exclude`` folders skipped;
    a link followed only when its target stays inside ``root``."""

    def __init__(self, root: str, exclude: Iterable[str] = ()):
        self.root = os.path.abspath(root)
        self.real = os.path.realpath(self.root)
        self.exclude = {os.path.realpath(e) for e in exclude}
        self.skipped = 0
        self.skipped_by: dict[str, int] = {}  # why, for people (`lnk-lnkmem index`)

    def _skip(self, why: str) -> None:
        self.skipped += 1
        self.skipped_by[why] = self.skipped_by.get(why, 0) + 1

    def _inside(self, real: str) -> bool:
        if real in self.exclude or any(real.startswith(e + os.sep) for e in self.exclude):
            return False
        return real == self.real or real.startswith(self.real + os.sep)

    def resolve(self, path: str) -> str:
        """The absolute path of ``path``; Forbidden if it leaves the root."""
        rel = check_relpath(path)
        if any(p.startswith(".") for p in rel.split("/") if p):
            raise Forbidden(f"hidden paths are not served: {path!r}")
        full = os.path.join(self.root, rel) if rel else self.root
        real = os.path.realpath(full)
        if not self._inside(real):
            raise Forbidden(f"path leaves its root: {path!r}")
        return full

    def list(self, prefix: str = "") -> list[Entry]:
        out: list[Entry] = []
        self.skipped = 0
        self.skipped_by = {}
        try:
            start = self.resolve(prefix)
        except Forbidden:
            return out
        seen: set[tuple[int, int]] = set()
        rel0 = check_relpath(prefix)
        if os.path.isfile(start):
            e = self.stat(rel0)
            return [e] if e else []
        self._walk(start, rel0, out, seen)
        return out

    def _walk(self, folder: str, rel: str, out: list[Entry], seen: set) -> None:
        try:
            s = os.stat(folder)
            if (s.st_dev, s.st_ino) in seen:
                return
            seen.add((s.st_dev, s.st_ino))
            it = os.scandir(folder)
        except OSError:
            self._skip("unreadable")
            return
        with it:
            for d in it:
                if d.name.startswith("."):
                    continue
                path = f"{rel}/{d.name}" if rel else d.name
                try:
                    if d.is_symlink():
                        real = os.path.realpath(d.path)
                        if not self._inside(real):
                            continue
                        s = os.stat(d.path)
                    else:
                        if d.path in self.exclude:
                            continue
                        s = d.stat(follow_symlinks=False)
                    if st.S_ISDIR(s.st_mode):
                        if os.path.realpath(d.path) in self.exclude:
                            continue
                        self._walk(d.path, path, out, seen)
                    elif st.S_ISREG(s.st_mode):
                        if s.st_size > MAX_FILE:
                            self._skip("too big")
                            continue
                        out.append(Entry(path, s.st_size, version_of(s)))
                except OSError:
                    self._skip("unreadable")

    def stat(self, path: str) -> Optional[Entry]:
        try:
            full = self.resolve(path)
            s = os.stat(full)
        except (OSError, Forbidden):
            return None
        if not st.S_ISREG(s.st_mode):
            return None
        return Entry(check_relpath(path), s.st_size, version_of(s))

    def read(self, path: str) -> tuple[bytes, str]:
        full = self.resolve(path)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
        except FileNotFoundError:
            raise NotFound(path) from None
        except OSError as e:
            raise NotFound(f"{path}: {e.strerror}") from None
        try:
            s = os.fstat(fd)
            if not st.S_ISREG(s.st_mode):
                raise NotFound(f"not a file: {path}")
            with os.fdopen(fd, "rb", closefd=False) as f:
                # read(n) allocates n bytes up front: ask for what the file holds
                data = f.read(min(s.st_size, MAX_FILE) + 1)
            return data, version_of(s)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[tuple[str, str, int]]:
        """(name, 'file'|'folder', size) directly under ``path`` (for `list`)."""
        full = self.resolve(path)
        out = []
        try:
            it = os.scandir(full)
        except NotADirectoryError:
            raise NotFound(f"not a folder: {path}") from None
        except OSError:
            raise NotFound(path) from None
        with it:
            for d in sorted(it, key=lambda d: d.name):
                if d.name.startswith("."):
                    continue
                try:
                    real = os.path.realpath(d.path)
                    if not self._inside(real):
                        continue
                    s = os.stat(d.path)
                except OSError:
                    continue
                if st.S_ISDIR(s.st_mode):
                    out.append((d.name, "folder", 0))
                elif st.S_ISREG(s.st_mode):
                    out.append((d.name, "file", s.st_size))
        return out
