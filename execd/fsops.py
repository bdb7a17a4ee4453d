"""Filesystem helpers behind /files and /directories: entry info, atomic writes, glob search."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterator

from pydantic import BaseModel, Field

from .errors import ExecdError, os_error


class FileInfo(BaseModel):
    path: str
    name: str
    type: str = Field(description="file | directory | symlink | other")
    size: int
    mode: str = Field(description="Permission bits in octal, e.g. 0644.")
    mtime: float = Field(description="Unix time of the last modification.")
    uid: int
    gid: int
    target: str | None = Field(None, description="Where a symlink points (never followed).")


def kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "directory"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"


def info_from_stat(path: str, st: os.stat_result) -> FileInfo:
    target = None
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = None
    return FileInfo(
        path=path, name=os.path.basename(path) or path, type=kind(st), size=st.st_size,
        mode=f"{stat.S_IMODE(st.st_mode):04o}", mtime=st.st_mtime, uid=st.st_uid, gid=st.st_gid, target=target,
    )


def file_info(path: str, *, follow: bool = True) -> FileInfo:
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError as exc:
        raise os_error(exc, path) from None
    return info_from_stat(path, st)


def parse_mode(mode: str | int | None) -> int | None:
    if mode is None:
        return None
    try:
        value = mode if isinstance(mode, int) else int(str(mode), 8)
    except ValueError:
        raise ExecdError(400, f"mode {mode!r} is not octal", "invalid_mode") from None
    if not 0 <= value <= 0o7777:
        raise ExecdError(400, f"mode {mode!r} is out of range", "invalid_mode")
    return value


class AtomicWriter:
    """Write into a temp file next to the target and rename it over the target at the end: readers and concurrent
    writers see either the old or a complete new file, never a torn one."""

    def __init__(self, path: str, mode: int | None) -> None:
        self.path = path
        parent = os.path.dirname(path)
        try:
            existing = os.stat(path)
            if stat.S_ISDIR(existing.st_mode):
                raise ExecdError(400, f"{path} is a directory", "is_a_directory")
            self.mode = stat.S_IMODE(existing.st_mode) if mode is None else mode
        except FileNotFoundError:
            self.mode = 0o644 if mode is None else mode
        try:
            self.fd, self.tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".execd-tmp", dir=parent)
        except OSError as exc:
            raise os_error(exc, parent) from None
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]
            self.size += n

    def write_all(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.write(chunk)

    def commit(self) -> None:
        try:
            os.fchmod(self.fd, self.mode)
            os.close(self.fd)
            self.fd = -1
            os.replace(self.tmp, self.path)
        except OSError as exc:
            self.abort()
            raise os_error(exc, self.path) from None

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def glob_regex(pattern: str) -> re.Pattern[str]:
    """`**` spans directories, `*` and `?` stay within one, `[...]` is a class (`[!...]` negated)."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end + 1
            continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def search(root: str, pattern: str, limit: int) -> tuple[list[FileInfo], bool]:
    """Entries under `root` whose relative path (or, for a pattern without `/`, whose name) matches `pattern`.
    Symlinks are matched but never followed. Returns at most `limit` matches and whether more exist."""
    regex = glob_regex(pattern)
    by_name = "/" not in pattern
    found: list[FileInfo] = []
    for rel, path, st in walk(root):
        if regex.match(os.path.basename(rel) if by_name else rel):
            if len(found) == limit:
                return found, True
            found.append(info_from_stat(path, st))
    return found, False


def walk(root: str) -> Iterator[tuple[str, str, os.stat_result]]:
    stack = [("", root)]
    while stack:
        rel_dir, abs_dir = stack.pop()
        try:
            with os.scandir(abs_dir) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            yield rel, entry.path, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append((rel, entry.path))
        stack.extend(reversed(subdirs))
