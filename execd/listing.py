"""Paged tree listing: a deterministic pre-order walk (names sorted) that resumes after the last entry returned.

The cursor is the path (as components) of the last entry of a page, so resuming costs one sorted directory
listing per level of that path, and every entry of an unchanged tree is returned exactly once. Entries added or
removed between pages before the cursor position are not revisited (documented on the endpoint).
"""

from __future__ import annotations

import base64
import bisect
import binascii
import json
import os
import stat
from collections import OrderedDict
from collections.abc import Iterator

from .errors import ExecdError

_CACHE_DIRS = 64
_sorted_cache: OrderedDict[str, tuple[tuple[int, int], list[str]]] = OrderedDict()


def sorted_names(path: str) -> list[str]:
    """Sorted entry names of a directory, cached by (inode, mtime) so consecutive pages don't re-sort big ones."""
    st = os.stat(path)
    key = (st.st_ino, st.st_mtime_ns)
    hit = _sorted_cache.get(path)
    if hit is not None and hit[0] == key:
        _sorted_cache.move_to_end(path)
        return hit[1]
    names = sorted(os.listdir(path))
    _sorted_cache[path] = (key, names)
    if len(_sorted_cache) > _CACHE_DIRS:
        _sorted_cache.popitem(last=False)
    return names


def walk(root: str, depth: int, after: list[str] | None) -> Iterator[tuple[list[str], str, os.stat_result]]:
    """(components, absolute path, lstat) of every entry up to `depth` levels below `root`, in pre-order with sorted
    names, starting strictly after the entry `after` (components). Symlinks are listed, never followed."""

    def level(dir_abs: str, rel: list[str], lvl: int, resume: list[str] | None):
        try:
            names = sorted_names(dir_abs)
        except OSError:
            return
        start = bisect.bisect_left(names, resume[0]) if resume else 0
        for name in names[start:]:
            path = os.path.join(dir_abs, name)
            comps = [*rel, name]
            try:
                st = os.lstat(path)
            except OSError:
                continue
            inside: list[str] | None = None
            if resume and name == resume[0]:
                inside = resume[1:] or None  # this entry was returned on an earlier page
            else:
                yield comps, path, st
            resume = None
            if lvl < depth and stat.S_ISDIR(st.st_mode):
                yield from level(path, comps, lvl + 1, inside)

    yield from level(root, [], 1, after)


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


def page(root: str, depth: int, limit: int, cursor: str | None) -> tuple[list[tuple[str, os.stat_result]], str | None]:
    after = decode_cursor(cursor, root, depth) if cursor else None
    out: list[tuple[str, os.stat_result]] = []
    last: list[str] = []
    for comps, path, st in walk(root, depth, after):
        if len(out) == limit:
            return out, encode_cursor(root, depth, last)
        out.append((path, st))
        last = comps
    return out, None
