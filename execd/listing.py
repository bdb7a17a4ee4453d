"""Paged tree listing: a deterministic pre-order walk (names sorted) that resumes after the last entry returned.

The cursor is the path (as components) of the last entry of a page, so resuming costs one sorted directory
listing per level of that path, and every entry of an unchanged tree is returned exactly once. Entries added or
removed between pages before the cursor position are not revisited (documented on the endpoint).

The walk holds a directory fd per level and opens each child relative to it without following links (paths.py),
so swapping a directory for a symlink while a listing runs cannot make it list anything outside the roots.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import json
import os
import stat
from collections import OrderedDict
from collections.abc import Generator

from .errors import ExecdError
from .fsops import Pacer, stat_at
from .paths import DIR_FLAGS

_CACHE_DIRS = 64
_sorted_cache: OrderedDict[str, tuple[tuple[int, int], list[str]]] = OrderedDict()


def sorted_names(fd: int, path: str) -> list[str]:
    """Sorted entry names of a directory, cached by (inode, mtime) so consecutive pages don't re-sort big ones."""
    st = os.fstat(fd)
    key = (st.st_ino, st.st_mtime_ns)
    hit = _sorted_cache.get(path)
    if hit is not None and hit[0] == key:
        _sorted_cache.move_to_end(path)
        return hit[1]
    names = sorted(os.listdir(fd))
    _sorted_cache[path] = (key, names)
    if len(_sorted_cache) > _CACHE_DIRS:
        _sorted_cache.popitem(last=False)
    return names


Row = tuple[str, os.stat_result, str | None]  # absolute path, lstat, link target


def walk(dir_fd: int, root: str, depth: int,
         after: list[str] | None) -> Generator[tuple[list[str], Row], None, None]:
    """(components, row) of every entry up to `depth` levels below the directory `dir_fd` (shown as `root`), in
    pre-order with sorted names, starting strictly after the entry `after` (components). Symlinks are listed, never
    followed."""

    def level(fd: int, dir_abs: str, rel: list[str], lvl: int, resume: list[str] | None):
        try:
            names = sorted_names(fd, dir_abs)
        except OSError:
            return
        start = bisect.bisect_left(names, resume[0]) if resume else 0
        for name in names[start:]:
            path = os.path.join(dir_abs, name)
            comps = [*rel, name]
            try:
                st, link = stat_at(fd, name)
            except OSError:
                continue
            inside: list[str] | None = None
            if resume and name == resume[0]:
                inside = resume[1:] or None  # this entry was returned on an earlier page
            else:
                yield comps, (path, st, link)
            resume = None
            if lvl < depth and stat.S_ISDIR(st.st_mode):
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                try:
                    yield from level(child, path, comps, lvl + 1, inside)
                finally:
                    os.close(child)

    yield from level(dir_fd, root, [], 1, after)


def encode_cursor(root: str, depth: int, after: list[str]) -> str:
    raw = json.dumps({"r": root, "d": depth, "a": after}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, root: str, depth: int) -> list[str]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        after, c_root, c_depth = raw["a"], raw["r"], raw["d"]
        ok = isinstance(after, list) and after and all(isinstance(x, str) and x and "/" not in x for x in after)
    except (ValueError, KeyError, TypeError, binascii.Error):
        ok = False
    if not ok:
        raise ExecdError(400, "cursor is not one this endpoint returned", "invalid_cursor")
    if c_root != root or c_depth != depth:
        raise ExecdError(400, "cursor belongs to another listing (path or depth changed)", "invalid_cursor")
    return after


def page(dir_fd: int, root: str, depth: int, limit: int, cursor: str | None) -> tuple[list[Row], str | None]:
    after = decode_cursor(cursor, root, depth) if cursor else None
    out: list[Row] = []
    last: list[str] = []
    pacer = Pacer()  # a page of 10,000 entries must not starve the event loop of the GIL either
    with contextlib.closing(walk(dir_fd, root, depth, after)) as rows:
        for comps, row in rows:
            pacer.tick()
            if len(out) == limit:
                return out, encode_cursor(root, depth, last)
            out.append(row)
            last = comps
    return out, None
