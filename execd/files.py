"""/v1/files: streaming upload/download (never the whole file in memory), info, move, delete, chmod, search, replace."""

from __future__ import annotations

import asyncio
import errno
import os
import stat

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from . import fsops
from .endpoints import Router
from .errors import ExecdError, os_error
from .fdresponse import FdFileResponse
from .fsops import FileInfo
from .processes import MAX_ID
from .state import get_state

router = Router("files")
WRITE_BATCH = 4 << 20  # upload bytes are written in batches of this size from a worker thread (memory bound)
REPLACE_MAX_BYTES = 64 << 20  # replace-in-file reads the file into memory: bounded


class PathQuery(BaseModel):
    path: str = Field(description="Absolute, or relative to the workspace; must resolve inside the allowed roots.")


class UploadQuery(PathQuery):
    mode: str | None = Field(None, description="Octal permission bits; default: keep the existing file's, or 0644.")
    mkdir: bool = Field(True, description="Create missing parent directories.")


class SearchQuery(PathQuery):
    pattern: str = Field(min_length=1, description="Glob: `*`, `?`, `[...]`, `**` for any depth. Without `/` it "
                         "matches entry names, with `/` paths relative to `path`.")
    limit: int = Field(1000, ge=1, le=100_000, description="Most matches returned.")


class SearchResult(BaseModel):
    matches: list[FileInfo]
    truncated: bool = Field(description="Not every match is listed: more than `limit` matched, the time budget ran "
                            "out (`timed_out`), or the tree is deeper than the walk goes.")
    timed_out: bool = Field(False, description="The search stopped at the daemon's time budget; the matches are "
                            "those found until then.")


class MoveRequest(BaseModel):
    source: str
    destination: str
    overwrite: bool = Field(False, description="Replace an existing destination (else 409).")


class ChmodRequest(BaseModel):
    path: str
    mode: str = Field(description="Octal permission bits, e.g. 0755.")
    uid: int | None = Field(None, ge=0, le=MAX_ID, description="Also change the owner (execd must be allowed to).")
    gid: int | None = Field(None, ge=0, le=MAX_ID)


class ReplaceRequest(BaseModel):
    path: str
    old: str = Field(min_length=1, description="Text to find (exact, UTF-8).")
    new: str = Field(description="Replacement text.")
    count: int | None = Field(None, ge=1, description="Replace at most this many occurrences (default all).")


class ReplaceResult(BaseModel):
    path: str
    replacements: int


@router.get("/v1/files/info", "Metadata of a file or directory", query=PathQuery, response=FileInfo,
            errors=(400, 403, 404))
async def info(request: Request, query: PathQuery) -> FileInfo:
    """Follows symlinks (a link resolving outside the roots is 403); see /v1/directories/list to see links as links."""
    return fsops.file_info(get_state(request).target(query.path))


@router.get(
    "/v1/files/download", "Download a file (streamed; supports Range)", query=PathQuery, errors=(400, 403, 404, 416),
    response_media="application/octet-stream",
)
async def download(request: Request, query: PathQuery) -> Response:
    state = get_state(request)
    fd, st = fsops.open_file(state.target(query.path))
    state.metrics.inc("execd_bytes_total", st.st_size, direction="download")
    return FdFileResponse(fd, st, request.headers.get("range"))


@router.post(
    "/v1/files/upload", "Upload a file (raw body, streamed, atomic)", query=UploadQuery, response=FileInfo,
    errors=(400, 403, 404), request_media="application/octet-stream",
)
async def upload(request: Request, query: UploadQuery) -> FileInfo:
    """The request body is the file's bytes. They are streamed into a temp file beside the target, which is renamed
    over it once complete, so a reader or a concurrent writer never sees a torn file. Upload onto a symlink replaces
    the link, not its target."""
    state = get_state(request)
    target = state.target(query.path, follow=False)
    if target.is_root:
        raise ExecdError(400, f"{query.path} is a directory", "is_a_directory")
    mode = fsops.parse_mode(query.mode)
    with target.parent(create=query.mkdir) as dir_fd:
        writer = fsops.AtomicWriter(dir_fd, target.name, mode, query.path)
    batch: list[bytes] = []
    pending = 0
    try:
        async for chunk in request.stream():
            batch.append(chunk)
            pending += len(chunk)
            if pending >= WRITE_BATCH:  # off the event loop: writeback throttling must not stall other requests
                await asyncio.to_thread(writer.write_all, batch)
                batch, pending = [], 0
        writer.write_all(batch)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    state.metrics.inc("execd_bytes_total", writer.size, direction="upload")
    return fsops.file_info(target)


@router.delete("/v1/files", "Delete a file or symlink", query=PathQuery, errors=(400, 403, 404))
async def delete(request: Request, query: PathQuery) -> None:
    """A symlink is removed, never its target. Directories: DELETE /v1/directories."""
    target = get_state(request).target(query.path, follow=False)
    try:
        with target.parent() as dir_fd:
            if stat.S_ISDIR(os.stat(target.name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                raise ExecdError(400, f"{query.path} is a directory; use DELETE /v1/directories", "is_a_directory")
            os.unlink(target.name, dir_fd=dir_fd)
    except OSError as exc:
        raise os_error(exc, query.path) from None


@router.post("/v1/files/mv", "Move or rename", body=MoveRequest, response=FileInfo, errors=(400, 403, 404, 409))
async def move(request: Request, body: MoveRequest) -> FileInfo:
    state = get_state(request)
    src = state.target(body.source, follow=False)
    dst = state.target(body.destination, follow=False)
    if src.is_root or dst.is_root:
        raise ExecdError(403, "an allowed root cannot be moved or replaced", "forbidden")
    try:
        with src.parent() as src_fd, dst.parent() as dst_fd:
            os.stat(src.name, dir_fd=src_fd, follow_symlinks=False)
            if not body.overwrite:
                try:
                    os.stat(dst.name, dir_fd=dst_fd, follow_symlinks=False)
                    raise ExecdError(409, f"{body.destination} exists (pass overwrite)", "exists")
                except FileNotFoundError:
                    pass
            try:
                os.rename(src.name, dst.name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            except OSError as exc:
                if exc.errno != errno.EXDEV:  # another filesystem (e.g. /tmp on tmpfs): copy, then remove
                    raise
                await asyncio.to_thread(fsops.move_across, src_fd, src.name, dst_fd, dst.name)
    except OSError as exc:
        raise os_error(exc, body.source) from None
    return fsops.file_info(dst)


@router.post("/v1/files/permissions", "Change mode (and owner)", body=ChmodRequest, response=FileInfo,
             errors=(400, 403, 404))
async def chmod(request: Request, body: ChmodRequest) -> FileInfo:
    """Acts on what `path` resolves to (a symlink inside the roots is followed there, once, at resolution)."""
    target = get_state(request).target(body.path)
    mode = fsops.parse_mode(body.mode)
    try:
        with target.parent() as dir_fd:
            try:
                os.chmod(target.name, mode, dir_fd=dir_fd, follow_symlinks=False)  # type: ignore[arg-type]
            except (NotImplementedError, ValueError):  # glibc refuses to chmod a link: one appeared since
                raise ExecdError(400, f"{body.path} changed into a symlink", "symlink_in_path") from None
            if body.uid is not None or body.gid is not None:
                uid, gid = -1 if body.uid is None else body.uid, -1 if body.gid is None else body.gid
                os.chown(target.name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise os_error(exc, body.path) from None
    return fsops.file_info(target)


@router.get("/v1/files/search", "Glob search under a directory", query=SearchQuery, response=SearchResult,
            errors=(400, 403, 404))
async def search(request: Request, query: SearchQuery) -> SearchResult:
    """Matching costs linear time whatever the pattern, runs in a worker thread, and stops after the daemon's time
    budget (`timed_out`); `truncated` says the matches are not all there are."""
    state = get_state(request)
    fsops.compile_pattern(query.pattern)  # a bad glob is a 400 before any walking
    target = state.target(query.path)
    dir_fd = target.open_dir()
    try:
        found = await asyncio.to_thread(
            fsops.search, dir_fd, target.path, query.pattern, query.limit,
            state.settings.search_budget_seconds,
        )
    finally:
        os.close(dir_fd)
    return SearchResult(matches=found.matches, truncated=found.truncated, timed_out=found.timed_out)


@router.post("/v1/files/replace", "Replace text in a file (atomic)", body=ReplaceRequest, response=ReplaceResult,
             errors=(400, 403, 404, 413))
async def replace(request: Request, body: ReplaceRequest) -> ReplaceResult:
    target = get_state(request).target(body.path)
    fd, st = fsops.open_file(target)
    if st.st_size > REPLACE_MAX_BYTES:
        os.close(fd)
        raise ExecdError(413, f"{body.path} is larger than {REPLACE_MAX_BYTES} bytes", "too_large")

    def work() -> int:
        try:
            data = fsops.read_all(fd, st.st_size)
        finally:
            os.close(fd)
        if len(data) > REPLACE_MAX_BYTES:
            raise ExecdError(413, f"{body.path} is larger than {REPLACE_MAX_BYTES} bytes", "too_large")
        old, new = body.old.encode(), body.new.encode()
        found = data.count(old)
        n = found if body.count is None else min(found, body.count)
        if n:
            with target.parent() as dir_fd:
                writer = fsops.AtomicWriter(dir_fd, target.name, stat.S_IMODE(st.st_mode), body.path)
            try:
                writer.write(data.replace(old, new, n))
                writer.commit()
            except BaseException:
                writer.abort()
                raise
        return n

    try:
        n = await asyncio.to_thread(work)
    except OSError as exc:
        raise os_error(exc, body.path) from None
    return ReplaceResult(path=target.path, replacements=n)
