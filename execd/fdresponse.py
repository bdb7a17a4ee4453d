"""A streamed download of an already-open file descriptor, with single-range support.

Starlette's FileResponse opens its file again by path, which would reopen a name that was confined earlier (the
check-then-use gap paths.py closes). This response reads the fd that was opened through the confined directory
fds, in 1 MiB `pread`s from a worker thread, and closes it when done or when the client goes away.
"""

from __future__ import annotations

import os
import re
from email.utils import formatdate
from typing import Any, Literal

import anyio.to_thread
from starlette.responses import Response

from .errors import error_response

CHUNK = 1 << 20
_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None | Literal[False]:
    """`Range` -> (start, end inclusive); None to send the whole file (no, several or unparseable ranges: RFC 9110
    lets a server ignore them); False when the one range asked for lies outside the file (416)."""
    if not header:
        return None
    m = _RANGE.match(header)
    if not m or (not m.group(1) and not m.group(2)):
        return None
    first, last = m.group(1), m.group(2)
    if not first:  # suffix: the last N bytes
        n = int(last)
        return (max(size - n, 0), size - 1) if n and size else False
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        return False
    return start, end


class FdFileResponse(Response):
    """Send the open regular file `fd` (owned: closed at the end) as application/octet-stream."""

    def __init__(self, fd: int, st: os.stat_result, range_header: str | None) -> None:
        super().__init__(media_type="application/octet-stream")
        self.fd = fd
        self.size = st.st_size
        self.range = parse_range(range_header, self.size)
        self.raw_headers = [
            (b"content-type", b"application/octet-stream"),
            (b"accept-ranges", b"bytes"),
            (b"last-modified", formatdate(st.st_mtime, usegmt=True).encode()),
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            if self.range is False:
                refused = error_response(416, f"range outside the file's {self.size} bytes")
                refused.headers["content-range"] = f"bytes */{self.size}"
                return await refused(scope, receive, send)
            start, end = self.range if self.range else (0, self.size - 1)
            status, length = (206, end - start + 1) if self.range else (200, self.size)
            headers = [*self.raw_headers, (b"content-length", str(length).encode())]
            if self.range:
                headers.append((b"content-range", f"bytes {start}-{end}/{self.size}".encode()))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            if scope.get("method") == "HEAD":
                return await send({"type": "http.response.body", "body": b""})
            offset, left = start, length
            while left > 0:
                data = await anyio.to_thread.run_sync(os.pread, self.fd, min(CHUNK, left), offset)
                if not data:  # the file shrank meanwhile: end early (the client sees a short body)
                    break
                offset += len(data)
                left -= len(data)
                if left > 0:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                else:
                    return await send({"type": "http.response.body", "body": data})
            await send({"type": "http.response.body", "body": b""})  # empty file, or cut short
        finally:
            os.close(self.fd)
