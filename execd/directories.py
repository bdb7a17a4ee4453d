"""/v1/directories: paged listing (depth, limit, cursor), create, delete."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat

from pydantic import BaseModel, Field
from starlette.requests import Request

from . import fsops, listing
from .endpoints import Router
from .errors import ExecdError, os_error
from .fsops import FileInfo
from .state import State, get_state

router = Router("directories")
MAX_DEPTH = 64
MAX_LIMIT = 10_000


class ListQuery(BaseModel):
    path: str = Field(description="Directory to list; a symlink here is refused (400), links below are listed.")
    depth: int = Field(1, ge=1, le=MAX_DEPTH, description="Levels to descend: 1 = the directory's own entries, "
                       "2 = also their children, ... 0 or less is rejected (400): there is no 'unlimited'.")
    limit: int = Field(1000, ge=1, le=MAX_LIMIT, description="Most entries in one page.")
    cursor: str | None = Field(None, description="Opaque `next_cursor` of the previous page.")


class Listing(BaseModel):
    path: str
    entries: list[FileInfo] = Field(description="Pre-order, names sorted; symlinks are entries, never followed.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class MkdirRequest(BaseModel):
    path: str
    mode: str = Field("0755", description="Octal permission bits of created directories.")
    parents: bool = Field(True, description="Create missing parents (like mkdir -p).")


class RmdirQuery(BaseModel):
    path: str
    recursive: bool = Field(False, description="Delete the contents too (symlinks inside are removed, not followed).")


def _directory(state: State, raw: str) -> str:
    """Confine, then refuse a symlink root (400); a missing path is 404, a non-directory 400."""
    real = state.path(raw)
    literal = state.path(raw, follow=False)
    try:
        if stat.S_ISLNK(os.lstat(literal).st_mode):
            raise ExecdError(400, f"{raw} is a symlink; list its target instead", "symlink_root")
        if not stat.S_ISDIR(os.stat(real).st_mode):
            raise ExecdError(400, f"{raw} is not a directory", "not_a_directory")
    except OSError as exc:
        raise os_error(exc, raw) from None
    return real


@router.get(
    "/v1/directories/list", "List a directory tree page by page", query=ListQuery, response=Listing,
    errors=(400, 403, 404),
)
async def list_directory(request: Request, query: ListQuery) -> Listing:
    """Entries are returned in a stable order (pre-order, names sorted by code point) so following `next_cursor`
    until it is null yields every entry of an unchanged tree exactly once. Entries created or deleted while paging
    may be missed or omitted; none is returned twice."""
    root = _directory(get_state(request), query.path)
    rows, cursor = await asyncio.to_thread(listing.page, root, query.depth, query.limit, query.cursor)
    return Listing(path=root, entries=[fsops.info_from_stat(p, st) for p, st in rows], next_cursor=cursor)


@router.post(
    "/v1/directories", "Create a directory", body=MkdirRequest, response=FileInfo, status=201, errors=(400, 403, 404, 409)
)
async def make_directory(request: Request, body: MkdirRequest) -> FileInfo:
    """Idempotent: an existing directory is fine; an existing non-directory is 409."""
    path = get_state(request).path(body.path, follow=False)
    mode = fsops.parse_mode(body.mode)
    try:
        if body.parents:
            os.makedirs(path, mode=mode, exist_ok=True)  # type: ignore[arg-type]
        else:
            os.mkdir(path, mode=mode)  # type: ignore[arg-type]
    except FileExistsError:
        if not os.path.isdir(path) or not body.parents:
            raise ExecdError(409, f"{body.path} exists", "exists") from None
    except OSError as exc:
        raise os_error(exc, body.path) from None
    return fsops.file_info(path)


@router.delete("/v1/directories", "Delete a directory", query=RmdirQuery, errors=(400, 403, 404, 409))
async def delete_directory(request: Request, query: RmdirQuery) -> None:
    state = get_state(request)
    path = _directory(state, query.path)
    if path in state.roots:
        raise ExecdError(403, f"{query.path} is an allowed root and cannot be deleted", "forbidden")
    try:
        if query.recursive:
            await asyncio.to_thread(shutil.rmtree, path)
        else:
            os.rmdir(path)
    except OSError as exc:
        raise os_error(exc, query.path) from None
