"""Filesystem helpers behind /files and /directories, all relative to directory fds (see paths.py for why).

Entry info, atomic writes (temp file + rename in the same directory fd), a cross-filesystem move that never
follows a link, and the glob search walk (linear-time matcher, time budget, never following a symlink).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

from pydantic import BaseModel, Field

from .errors import ExecdError, os_error
from .globmatch import Glob, GlobError
from .paths import DIR_FLAGS, Target

FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO must not hang us
COPY_CHUNK = 1 << 20
# A walk in a worker thread calls into the kernel for every entry, releasing and retaking the GIL each time: the
# event loop's thread, waiting for the GIL, sees it taken back before it wakes and can starve for hundreds of ms (the
# "convoy effect"). Sleeping briefly every few ms of walking hands the GIL over for certain.
YIELD_EVERY = 0.004
YIELD_FOR = 0.0005
MAX_WALK_DEPTH = 128  # search descends at most this deep (one open fd per level); deeper is reported as truncated


class Pacer:
    """Call `tick()` once per entry of a long walk in a worker thread: it sleeps YIELD_FOR every YIELD_EVERY."""

    def __init__(self) -> None:
        self.next = time.monotonic() + YIELD_EVERY

    def tick(self) -> None:
        if time.monotonic() > self.next:
            time.sleep(YIELD_FOR)
            self.next = time.monotonic() + YIELD_EVERY


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


def info_from_stat(path: str, st: os.stat_result, target: str | None = None) -> FileInfo:
    return FileInfo(
        path=path, name=os.path.basename(path) or path, type=kind(st), size=st.st_size,
        mode=f"{stat.S_IMODE(st.st_mode):04o}", mtime=st.st_mtime, uid=st.st_uid, gid=st.st_gid, target=target,
    )


def stat_at(dir_fd: int, name: str) -> tuple[os.stat_result, str | None]:
    """lstat of `name` in `dir_fd`, and its link target when it is a symlink (read through the same fd)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    target = None
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError):
            target = os.readlink(name, dir_fd=dir_fd)
    return st, target


def file_info(target: Target) -> FileInfo:
    """Info of the entry itself (a symlink is reported as one: `target` was resolved by `locate` when wanted)."""
    try:
        with target.parent() as fd:
            st, link = stat_at(fd, target.name)
    except OSError as exc:
        raise os_error(exc, target.raw) from None
    return info_from_stat(target.path, st, link)


def open_file(target: Target) -> tuple[int, os.stat_result]:
    """Open a regular file for reading, never through a symlink; the caller closes the fd."""
    try:
        with target.parent() as dir_fd:
            fd = os.open(target.name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise os_error(exc, target.raw) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ExecdError(400, f"{target.raw} is not a regular file", "not_a_file")
    os.set_blocking(fd, True)
    return fd, st


def read_all(fd: int, size_hint: int) -> bytes:
    chunks = []
    while data := os.read(fd, max(size_hint, COPY_CHUNK)):
        chunks.append(data)
    return b"".join(chunks)


def parse_mode(mode: str | int | None) -> int | None:
    if mode is None:
        return None
    text = str(mode)
    if not (isinstance(mode, int) or (text.isascii() and text.isdigit())):
        raise ExecdError(400, f"mode {mode!r} is not octal", "invalid_mode")
    try:
        value = mode if isinstance(mode, int) else int(text, 8)
    except ValueError:
        raise ExecdError(400, f"mode {mode!r} is not octal", "invalid_mode") from None
    if not 0 <= value <= 0o7777:
        raise ExecdError(400, f"mode {mode!r} is out of range", "invalid_mode")
    return value


def temp_name(name: str) -> str:
    return f".{name[:200]}.{os.urandom(6).hex()}.execd-tmp"


class AtomicWriter:
    """Write into a temp file next to the target (same directory fd) and rename it over the target at the end:
    readers and concurrent writers see either the old or a complete new file, never a torn one. The writer holds
    its own fd of the directory, so the directory it commits into is the one that was confined."""

    def __init__(self, dir_fd: int, name: str, mode: int | None, display: str) -> None:
        self.name, self.display = name, display
        self.dir_fd = os.dup(dir_fd)
        self.fd = -1
        try:
            try:
                existing = os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)
                if stat.S_ISDIR(existing.st_mode):
                    raise ExecdError(400, f"{display} is a directory", "is_a_directory")
                keep = stat.S_IMODE(existing.st_mode) if stat.S_ISREG(existing.st_mode) else 0o644
            except FileNotFoundError:
                keep = 0o644
            self.mode = keep if mode is None else mode
            self.tmp = temp_name(name)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self.fd = os.open(self.tmp, flags, 0o600, dir_fd=self.dir_fd)
        except OSError as exc:
            os.close(self.dir_fd)
            raise os_error(exc, display) from None
        except BaseException:
            os.close(self.dir_fd)
            raise
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
            os.rename(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError as exc:
            self.abort()
            raise os_error(exc, self.display) from None
        os.close(self.dir_fd)
        self.dir_fd = -1

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.dir_fd >= 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp, dir_fd=self.dir_fd)
            os.close(self.dir_fd)
            self.dir_fd = -1


# -- move across filesystems ---------------------------------------------------------------------------------------
def _copy_entry(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """Copy one entry (recursively for a directory) between directory fds; links are copied as links."""
    st = os.stat(src, dir_fd=src_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src, dir_fd=src_fd), dst, dir_fd=dst_fd)
    elif stat.S_ISDIR(st.st_mode):
        os.mkdir(dst, 0o700, dir_fd=dst_fd)
        s = os.open(src, DIR_FLAGS, dir_fd=src_fd)
        try:
            d = os.open(dst, DIR_FLAGS, dir_fd=dst_fd)
            try:
                for name in os.listdir(s):
                    _copy_entry(s, name, d, name)
                os.fchmod(d, stat.S_IMODE(st.st_mode))
            finally:
                os.close(d)
        finally:
            os.close(s)
    elif stat.S_ISREG(st.st_mode):
        s = os.open(src, FILE_FLAGS, dir_fd=src_fd)
        try:
            d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dst_fd)
            try:
                os.set_blocking(s, True)
                while os.sendfile(d, s, None, COPY_CHUNK):
                    pass
                os.fchmod(d, stat.S_IMODE(st.st_mode))
            finally:
                os.close(d)
        finally:
            os.close(s)
    else:
        raise ExecdError(400, "special files cannot be moved to another filesystem", "cross_device")


def move_across(src_fd: int, src: str, dst_fd: int, dst: str) -> None:
    """`rename` for two filesystems (EXDEV): copy into a temp name beside the destination, rename it into place,
    then remove the source. Nothing is followed; a failure leaves the source intact and no temp behind."""
    tmp = temp_name(dst)
    try:
        _copy_entry(src_fd, src, dst_fd, tmp)
        os.rename(tmp, dst, src_dir_fd=dst_fd, dst_dir_fd=dst_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(os.stat(tmp, dir_fd=dst_fd, follow_symlinks=False).st_mode):
                shutil.rmtree(tmp, dir_fd=dst_fd)
            else:
                os.unlink(tmp, dir_fd=dst_fd)
        raise
    if stat.S_ISDIR(os.stat(src, dir_fd=src_fd, follow_symlinks=False).st_mode):
        shutil.rmtree(src, dir_fd=src_fd)
    else:
        os.unlink(src, dir_fd=src_fd)


# -- search ----------------------------------------------------------------------------------------------------------
@dataclass
class SearchOutcome:
    matches: list[FileInfo]
    truncated: bool  # not every match: more than `limit`, the time budget ran out, or the tree was too deep
    timed_out: bool  # the time budget ran out before the walk did


def compile_pattern(pattern: str) -> Glob:
    try:
        return Glob(pattern)
    except GlobError as exc:
        raise ExecdError(400, f"bad glob pattern: {exc}", "invalid_pattern") from None


def search(dir_fd: int, root: str, pattern: str, limit: int, budget: float,
           clock: Callable[[], float] = time.monotonic) -> SearchOutcome:
    """Entries under the directory `dir_fd` (shown as `root`) whose relative path (or, for a pattern without `/`,
    whose name) matches `pattern`. Symlinks are matched but never followed. At most `limit` matches; the walk
    stops when `budget` seconds have passed and says so."""
    glob = compile_pattern(pattern)
    by_name = "/" not in pattern
    deadline = clock() + budget
    found: list[FileInfo] = []
    too_deep: list[str] = []
    pacer = Pacer()
    with contextlib.closing(walk(dir_fd, MAX_WALK_DEPTH, too_deep.append)) as entries:
        for rel, st, link in entries:
            pacer.tick()
            if clock() > deadline:
                return SearchOutcome(found, True, True)
            if glob.match(rel.rpartition("/")[2] if by_name else rel):
                if len(found) == limit:
                    return SearchOutcome(found, True, False)
                found.append(info_from_stat(f"{root}/{rel}", st, link))
    return SearchOutcome(found, bool(too_deep), False)


def walk(dir_fd: int, max_depth: int,
         too_deep: Callable[[str], None]) -> Generator[tuple[str, os.stat_result, str | None], None, None]:
    """(relative path, lstat, link target) of every entry below `dir_fd`, pre-order with sorted names, down to
    `max_depth` levels (`too_deep(rel)` names each directory not entered). Each directory is opened relative to its
    parent's fd without following links; unreadable ones are skipped."""

    def level(fd: int, rel_dir: str, depth: int) -> Iterator[tuple[str, os.stat_result, str | None]]:
        try:
            names = sorted(os.listdir(fd))
        except OSError:
            return
        for name in names:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            try:
                st, link = stat_at(fd, name)
            except OSError:
                continue
            yield rel, st, link
            if stat.S_ISDIR(st.st_mode):
                if depth >= max_depth:
                    too_deep(rel)
                    continue
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    yield from level(child, rel, depth + 1)
                finally:
                    os.close(child)

    yield from level(dir_fd, "", 1)
