"""Files below one directory, as a bucket would keep them (PROTOCOL.md §8.1).

Each file has a version: the first 32 hex digits of the sha256 of its content,
so it changes whenever the content does. The ETag is the version in double
quotes. Writes go to a temp file outside every tree and are renamed in place,
so a reader never sees half a file; one lock per process makes each
conditional check and the write it guards one step.

There are no folders in a bucket: a listing of a prefix that holds nothing is
empty, not an error. Symbolic links are neither listed nor read.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from datetime import datetime, timezone
from pathlib import Path

from fakes.http import HttpError

LOCK = threading.RLock()


def clean_path(path: str, *, allow_empty: bool = False) -> str:
    """A relative ``a/b/c`` path, or HttpError(400) when it would escape its root."""
    if "\x00" in path or "\\" in path:
        raise HttpError(400, "bad character in path")
    if path.startswith("/"):
        raise HttpError(400, "absolute path")
    parts = path.split("/")
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()  # one trailing slash: a folder
    if parts == [""]:
        if allow_empty:
            return ""
        raise HttpError(400, "empty path")
    for part in parts:
        if part in ("", ".", ".."):
            raise HttpError(400, "path escapes its root or has an empty segment")
    return "/".join(parts)


def etag(version: str) -> str:
    return f'"{version}"'


def _tags(value: str) -> list[str]:
    return [t.strip() for t in value.split(",") if t.strip()]


def check_write(current: str | None, if_match: str | None, if_none_match: str | None) -> None:
    """412 unless the preconditions hold for a file whose version is ``current``."""
    if if_match is not None:
        tags = _tags(if_match)
        if current is None or ("*" not in tags and etag(current) not in tags):
            raise HttpError(412, "the version did not match (If-Match takes the quoted ETag)")
    if if_none_match is not None and current is not None:
        tags = [t.removeprefix("W/") for t in _tags(if_none_match)]
        if "*" in tags or etag(current) in tags:
            raise HttpError(412, "the file exists" if "*" in tags else "the version matched If-None-Match")


def not_modified(current: str, if_none_match: str | None) -> bool:
    if if_none_match is None:
        return False
    tags = [t.removeprefix("W/") for t in _tags(if_none_match)]
    return "*" in tags or etag(current) in tags


class Tree:
    """The files below ``root``; temp files go to ``tmp`` (same file system)."""

    _versions: dict[str, tuple[int, int, int, str]] = {}  # path -> (ino, size, mtime_ns, version)

    def __init__(self, root: Path, tmp: Path):
        self.root = Path(os.path.realpath(root))
        self.tmp = tmp

    def _full(self, rel: str) -> Path:
        full = self.root / rel if rel else self.root
        real = os.path.realpath(full)
        if real != str(full):  # a symbolic link somewhere on the way
            raise HttpError(404, "not found")
        return full

    def version(self, full: Path, st: os.stat_result | None = None) -> str:
        st = st or full.stat()
        key = str(full)
        cached = self._versions.get(key)
        if cached and cached[:3] == (st.st_ino, st.st_size, st.st_mtime_ns):
            return cached[3]
        version = hashlib.sha256(full.read_bytes()).hexdigest()[:32]
        self._versions[key] = (st.st_ino, st.st_size, st.st_mtime_ns, version)
        return version

    def current(self, rel: str) -> str | None:
        full = self._full(rel)
        try:
            if full.is_symlink() or not full.is_file():
                return None
            return self.version(full)
        except FileNotFoundError:
            return None

    def files(self, under: str = "") -> list[tuple[str, Path, os.stat_result]]:
        """(relative path, full path, stat) of every regular file below ``under``, sorted."""
        base = self._full(under) if under else self.root
        out = []
        if not base.is_dir() or base.is_symlink():
            return out
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            for name in filenames:
                full = Path(dirpath, name)
                try:
                    st = os.lstat(full)
                except FileNotFoundError:
                    continue
                if full.is_symlink() or not full.is_file():
                    continue
                out.append((full.relative_to(self.root).as_posix(), full, st))
        return sorted(out, key=lambda t: t[0])

    def entries(self, under: str = "", *, name_key: str = "path", modified: bool = True) -> list[dict]:
        with LOCK:
            out = []
            for rel, full, st in self.files(under):
                try:
                    entry = {name_key: rel, "size": st.st_size, "version": self.version(full, st)}
                except FileNotFoundError:
                    continue
                if modified:
                    entry["modified"] = _rfc3339(st.st_mtime)
                out.append(entry)
            return out

    def read(self, rel: str) -> tuple[bytes, str]:
        with LOCK:
            full = self._full(rel)
            if full.is_symlink() or not full.is_file():
                raise HttpError(404, "not found")
            data = full.read_bytes()
            return data, self.version(full)

    def write(self, rel: str, data: bytes, if_match: str | None, if_none_match: str | None) -> tuple[str, bool]:
        """(new version, created) after a conditional, atomic replace."""
        with LOCK:
            full = self._full(rel)
            if full.exists() and not full.is_file():
                raise HttpError(400, "a folder is there")
            current = self.current(rel)
            check_write(current, if_match, if_none_match)
            full.parent.mkdir(parents=True, exist_ok=True)
            self.tmp.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.tmp, prefix="write-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, full)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            return self.version(full), current is None

    def delete(self, rel: str, if_match: str | None, if_none_match: str | None) -> None:
        with LOCK:
            full = self._full(rel)
            current = self.current(rel)
            if current is None:
                raise HttpError(404, "not found")
            check_write(current, if_match, if_none_match)
            full.unlink()
            self._versions.pop(str(full), None)


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
