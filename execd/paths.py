"""Path policy and confined resolution: which client paths are allowed, and how they are opened without a race.

`confine()` decides (realpath + commonpath against the roots). Deciding on a name and then using the name again
would leave a gap: a directory swapped for a symlink between the check and the use escapes the roots. So every
operation goes through a `Target` instead: the confined real path split into a root and components, opened one
component at a time relative to the previous directory's file descriptor with `O_NOFOLLOW | O_DIRECTORY`. A
component that became a symlink (or stopped being a directory) after the check makes the open fail (ELOOP or
ENOTDIR, a 4xx); the operation itself then acts on `(dir_fd, name)`, never on the path string.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import ExecdError, os_error

MAX_PATH_CHARS = 4096  # PATH_MAX: longer is refused up front (components are still opened one by one)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_path_text(raw: str) -> None:
    """Refuse (400) what cannot be a sane path: empty, too long, control characters, unencodable surrogates."""
    if not raw:
        raise ExecdError(400, "path is required", "invalid_path")
    if "\x00" in raw:
        raise ExecdError(400, "path contains a NUL byte", "invalid_path")
    if _CONTROL.search(raw):
        raise ExecdError(400, "path contains a control character", "invalid_path")
    if len(raw) > MAX_PATH_CHARS:
        raise ExecdError(400, f"path is longer than {MAX_PATH_CHARS} characters", "invalid_path")
    try:
        os.fsencode(raw)
    except UnicodeEncodeError:
        raise ExecdError(400, "path is not valid UTF-8", "invalid_path") from None


def confine(raw: str, roots: list[str], workspace: str, *, follow: bool = True) -> str:
    """Return the real, absolute form of `raw` if it lies inside one of `roots` (real paths), else raise 403.

    A relative `raw` is taken relative to `workspace`. `..` and symlinks are resolved by `os.path.realpath` before
    the `os.path.commonpath` check, so neither can escape. With `follow=False` the last component is not resolved
    (the parent is): the answer names the symlink itself, for operations that act on a link rather than its target
    (lstat, delete, move, listing entries). A path need not exist; missing components resolve lexically.
    This is the decision only: use `locate()` and `Target` to act on the answer without a check-then-use gap.
    """
    check_path_text(raw)
    path = raw if os.path.isabs(raw) else os.path.join(workspace, raw)
    head, name = os.path.split(path) if not follow else ("", "")  # no normpath: `link/..` must mean what it does
    if follow or name in ("", ".", ".."):
        real = os.path.realpath(path)
    else:
        real = os.path.join(os.path.realpath(head), name)
    for root in roots:
        if real == root or os.path.commonpath([real, root]) == root:
            return real
    raise ExecdError(403, f"{raw} is outside the allowed roots", "forbidden")


@dataclass(frozen=True)
class Target:
    """A confined path as (root, components below it). `path` is the real path shown in answers."""

    raw: str
    path: str
    root: str
    parts: tuple[str, ...]

    @property
    def is_root(self) -> bool:
        return not self.parts

    @property
    def name(self) -> str:
        """The entry's name in its parent directory; `.` for a root (which is its own parent here)."""
        return self.parts[-1] if self.parts else "."

    @contextlib.contextmanager
    def parent(self, *, create: bool = False) -> Iterator[int]:
        """The fd of the directory holding this entry (the root's own fd for a root), closed on exit. With
        `create`, missing parent directories are made (0777 & ~umask, like `mkdir -p`)."""
        fd = self.open_parent(create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def open_parent(self, *, create: bool = False) -> int:
        """Like `parent()` but the caller owns (and closes) the fd."""
        return open_dir(self.root, self.parts[:-1], create_mode=0o777 if create else None, raw=self.raw)

    def open_dir(self) -> int:
        """The fd of this entry, which must be a directory (ENOTDIR/ELOOP otherwise); the caller closes it."""
        return open_dir(self.root, self.parts, raw=self.raw)


def locate(raw: str, roots: list[str], workspace: str, *, follow: bool = True) -> Target:
    real = confine(raw, roots, workspace, follow=follow)
    root = max((r for r in roots if real == r or os.path.commonpath([real, r]) == r), key=len)
    rel = os.path.relpath(real, root)
    parts = () if rel == "." else tuple(rel.split("/"))
    return Target(raw=raw, path=real, root=root, parts=parts)


def open_dir(root: str, parts: tuple[str, ...], *, create_mode: int | None = None, raw: str = "") -> int:
    """Open `root` then each of `parts` below it without following a symlink at any step. Missing components
    are created with `create_mode` when it is given. OSErrors become the error shape (ELOOP: a symlink appeared)."""
    try:
        fd = os.open(root, DIR_FLAGS)
    except OSError as exc:
        raise os_error(exc, raw or root) from None
    try:
        for part in parts:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if create_mode is None:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, create_mode, dir_fd=fd)
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError as exc:
        os.close(fd)
        raise os_error(exc, raw or root) from None
    except BaseException:
        os.close(fd)
        raise
    return fd
