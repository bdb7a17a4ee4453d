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
from .paths import Target
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


def _directory(state: State, raw: str) -> Target:
    """Confine, then refuse a symlink root (400); a missing path is 404, a non-directory 400."""
    literal = state.target(raw, follow=False)
    real = state.target(raw)
    try:
        with literal.parent() as dir_fd:
            if stat.S_ISLNK(os.stat(literal.name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise ExecdError(400, f"{raw} is a symlink; list its target instead", "symlink_root")
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
    dir_fd = root.open_dir()
    try:
        rows, cursor = await asyncio.to_thread(listing.page, dir_fd, root.path, query.depth, query.limit, query.cursor)
    finally:
        os.close(dir_fd)
    return Listing(path=root.path, entries=[fsops.info_from_stat(*row) for row in rows], next_cursor=cursor)


@router.post(
    "/v1/directories", "Create a directory", body=MkdirRequest, response=FileInfo, status=201,
    errors=(400, 403, 404, 409),
)
async def make_directory(request: Request, body: MkdirRequest) -> FileInfo:
    """Idempotent: an existing directory is fine; an existing non-directory is 409."""
    target = get_state(request).target(body.path, follow=False)
    mode = fsops.parse_mode(body.mode)
    try:
        with target.parent(create=body.parents) as dir_fd:
            try:
                os.mkdir(target.name, mode, dir_fd=dir_fd)  # type: ignore[arg-type]
            except FileExistsError:
                existing = os.stat(target.name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISDIR(existing.st_mode) or not body.parents:
                    raise ExecdError(409, f"{body.path} exists", "exists") from None
    except OSError as exc:
        raise os_error(exc, body.path) from None
    return fsops.file_info(target)


@router.delete("/v1/directories", "Delete a directory", query=RmdirQuery, errors=(400, 403, 404, 409))
async def delete_directory(request: Request, query: RmdirQuery) -> None:
    """Removes entries relative to directory fds without following links (`shutil.rmtree(dir_fd=...)`), so a
    directory swapped for a symlink meanwhile cannot make it delete anything outside the roots."""
    target = _directory(get_state(request), query.path)
    if target.is_root:
        raise ExecdError(403, f"{query.path} is an allowed root and cannot be deleted", "forbidden")
    try:
        with target.parent() as dir_fd:
            if not stat.S_ISDIR(os.stat(target.name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise ExecdError(400, f"{query.path} is not a directory", "not_a_directory")
            if query.recursive:
                await asyncio.to_thread(shutil.rmtree, target.name, dir_fd=dir_fd)
            else:
                os.rmdir(target.name, dir_fd=dir_fd)
    except OSError as exc:
        raise os_error(exc, query.path) from None
