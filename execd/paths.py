"""Path policy: the one function that decides whether a client-supplied path is inside the allowed roots."""

from __future__ import annotations

import os

from .errors import ExecdError


def confine(raw: str, roots: list[str], workspace: str, *, follow: bool = True) -> str:
    """Return the real, absolute form of `raw` if it lies inside one of `roots` (real paths), else raise 403.

    A relative `raw` is taken relative to `workspace`. `..` and symlinks are resolved by `os.path.realpath` before
    the `os.path.commonpath` check, so neither can escape. With `follow=False` the last component is not resolved
    (the parent is): the answer names the symlink itself, for operations that act on a link rather than its target
    (lstat, delete, move, listing entries). A path need not exist; missing components resolve lexically.
    """
    if not raw:
        raise ExecdError(400, "path is required", "invalid_path")
    if "\x00" in raw:
        raise ExecdError(400, "path contains a NUL byte", "invalid_path")
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
