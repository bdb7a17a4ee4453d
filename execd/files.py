"""/v1/files: streaming upload/download (never the whole file in memory), info, move, delete, chmod, search, replace."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import FileResponse, Response

from . import fsops
from .endpoints import Router
from .errors import ExecdError, os_error
from .fsops import FileInfo
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
    truncated: bool = Field(description="More entries matched than `limit`.")


class MoveRequest(BaseModel):
    source: str
    destination: str
    overwrite: bool = Field(False, description="Replace an existing destination (else 409).")


class ChmodRequest(BaseModel):
    path: str
    mode: str = Field(description="Octal permission bits, e.g. 0755.")
    uid: int | None = Field(None, description="Also change the owner (execd must be allowed to).")
    gid: int | None = None


class ReplaceRequest(BaseModel):
    path: str
    old: str = Field(min_length=1, description="Text to find (exact, UTF-8).")
    new: str = Field(description="Replacement text.")
    count: int | None = Field(None, ge=1, description="Replace at most this many occurrences (default all).")


class ReplaceResult(BaseModel):
    path: str
    replacements: int


class ChunkedFileResponse(FileResponse):
    chunk_size = 1 << 20  # fewer thread hops than Starlette's 64 KiB


@router.get("/v1/files/info", "Metadata of a file or directory", query=PathQuery, response=FileInfo, errors=(403, 404))
async def info(request: Request, query: PathQuery) -> FileInfo:
    """Follows symlinks (a link resolving outside the roots is 403); see /v1/directories/list to see links as links."""
    return fsops.file_info(get_state(request).path(query.path))


@router.get(
    "/v1/files/download", "Download a file (streamed; supports Range)", query=PathQuery, errors=(400, 403, 404),
    response_media="application/octet-stream",
)
async def download(request: Request, query: PathQuery) -> Response:
    state = get_state(request)
    path = state.path(query.path)
    st = fsops.file_info(path)
    if st.type != "file":
        raise ExecdError(400, f"{query.path} is not a regular file", "not_a_file")
    state.metrics.inc("execd_bytes_total", st.size, direction="download")
    return ChunkedFileResponse(path, media_type="application/octet-stream", stat_result=os.stat(path))


@router.post(
    "/v1/files/upload", "Upload a file (raw body, streamed, atomic)", query=UploadQuery, response=FileInfo,
    errors=(400, 403, 404), request_media="application/octet-stream",
)
async def upload(request: Request, query: UploadQuery) -> FileInfo:
    """The request body is the file's bytes. They are streamed into a temp file beside the target, which is renamed
    over it once complete, so a reader or a concurrent writer never sees a torn file. Upload onto a symlink replaces
    the link, not its target."""
    state = get_state(request)
    path = state.path(query.path, follow=False)
    mode = fsops.parse_mode(query.mode)
    if query.mkdir:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except OSError as exc:
            raise os_error(exc, query.path) from None
    writer = fsops.AtomicWriter(path, mode)
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
    return fsops.file_info(path, follow=False)


@router.delete("/v1/files", "Delete a file or symlink", query=PathQuery, errors=(400, 403, 404))
async def delete(request: Request, query: PathQuery) -> None:
    """A symlink is removed, never its target. Directories: DELETE /v1/directories."""
    path = get_state(request).path(query.path, follow=False)
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise ExecdError(400, f"{query.path} is a directory; use DELETE /v1/directories", "is_a_directory")
        os.unlink(path)
    except OSError as exc:
        raise os_error(exc, query.path) from None


@router.post("/v1/files/mv", "Move or rename", body=MoveRequest, response=FileInfo, errors=(400, 403, 404, 409))
async def move(request: Request, body: MoveRequest) -> FileInfo:
    state = get_state(request)
    src = state.path(body.source, follow=False)
    dst = state.path(body.destination, follow=False)
    if src in state.roots:
        raise ExecdError(403, f"{body.source} is an allowed root and cannot be moved", "forbidden")
    try:
        os.lstat(src)
        if os.path.lexists(dst) and not body.overwrite:
            raise ExecdError(409, f"{body.destination} exists (pass overwrite)", "exists")
        try:
            os.replace(src, dst)
        except OSError as exc:
            if exc.errno != 18:  # EXDEV: another filesystem (e.g. /tmp on tmpfs)
                raise
            await asyncio.to_thread(shutil.move, src, dst)
    except OSError as exc:
        raise os_error(exc, body.source) from None
    return fsops.file_info(dst, follow=False)


@router.post("/v1/files/permissions", "Change mode (and owner)", body=ChmodRequest, response=FileInfo, errors=(400, 403, 404))
async def chmod(request: Request, body: ChmodRequest) -> FileInfo:
    path = get_state(request).path(body.path)
    mode = fsops.parse_mode(body.mode)
    try:
        os.chmod(path, mode)  # type: ignore[arg-type]
        if body.uid is not None or body.gid is not None:
            os.chown(path, -1 if body.uid is None else body.uid, -1 if body.gid is None else body.gid)
    except OSError as exc:
        raise os_error(exc, body.path) from None
    return fsops.file_info(path)


@router.get("/v1/files/search", "Glob search under a directory", query=SearchQuery, response=SearchResult, errors=(400, 403, 404))
async def search(request: Request, query: SearchQuery) -> SearchResult:
    root = get_state(request).path(query.path)
    if fsops.file_info(root).type != "directory":
        raise ExecdError(400, f"{query.path} is not a directory", "not_a_directory")
    matches, truncated = await asyncio.to_thread(fsops.search, root, query.pattern, query.limit)
    return SearchResult(matches=matches, truncated=truncated)


@router.post("/v1/files/replace", "Replace text in a file (atomic)", body=ReplaceRequest, response=ReplaceResult, errors=(400, 403, 404, 413))
async def replace(request: Request, body: ReplaceRequest) -> ReplaceResult:
    path = get_state(request).path(body.path)
    st = fsops.file_info(path)
    if st.type != "file":
        raise ExecdError(400, f"{body.path} is not a regular file", "not_a_file")
    if st.size > REPLACE_MAX_BYTES:
        raise ExecdError(413, f"{body.path} is larger than {REPLACE_MAX_BYTES} bytes", "too_large")

    def work() -> int:
        with open(path, "rb") as f:
            data = f.read()
        old, new = body.old.encode(), body.new.encode()
        found = data.count(old)
        n = found if body.count is None else min(found, body.count)
        if n:
            writer = fsops.AtomicWriter(path, None)
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
    return ReplaceResult(path=path, replacements=n)
