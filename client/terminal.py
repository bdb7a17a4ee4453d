"""Terminal sessions over execd's PTY WebSocket, through the claims API (same token). `Terminal` (sync, on
websockets' sync client) and `AsyncTerminal` (asyncio). The session outlives the WebSocket until close(kill=True),
which ends its process tree (execd: SIGHUP, then SIGKILL)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from . import _ops as ops
from . import models as m
from .errors import CorralError, NotFound, TransportError, error_from

if TYPE_CHECKING:
    from .aio import AsyncSandbox
    from .sync import Sandbox


def _connect_error(exc: Exception) -> CorralError:
    resp = getattr(exc, "response", None)
    if resp is not None and getattr(resp, "status_code", None):
        return error_from(resp.status_code, bytes(resp.body or b""), method="GET", path="pty websocket")
    return TransportError(f"terminal WebSocket: {type(exc).__name__}: {exc}")


class _State:
    """What both terminals track: output not yet read, exit code and signal once the process has exited."""

    def __init__(self, status: m.PtyStatus):
        self.id = status.id
        self.status = status
        self.cols, self.rows = status.cols, status.rows
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.closed = False

    def handle(self, frame: bytes | str) -> bytes | None:
        kind, payload = ops.parse_frame(frame)
        if kind == "output":
            output: bytes = payload
            return output
        if kind == "exit":
            self.exit_code, self.signal = payload.get("exit_code"), payload.get("signal")
        elif kind == "error":
            raise CorralError(str(payload.get("message", payload)), code=str(payload.get("code", "pty_error")))
        return None


class Terminal(_State):
    """`term.write("ls\\n")`, `term.read_until("$ ")`, `term.resize(120, 40)`, `term.wait()` → exit code."""

    def __init__(self, sandbox: Sandbox, status: m.PtyStatus, *, since: int | None = None):
        from websockets.sync.client import connect

        super().__init__(status)
        self._s = sandbox
        client = sandbox._client
        url = ops.ws_url(client.url, f"{sandbox._base}/v1/pty/{ops.q(status.id)}/ws")
        if since is not None:
            url += f"?since={since}"
        try:
            self._ws = connect(url, additional_headers={"Authorization": f"Bearer {client._token}"},
                               max_size=None, open_timeout=30, user_agent_header=ops.USER_AGENT)
        except Exception as exc:  # noqa: BLE001 - handshake refused (401/404/409) or no connection
            raise _connect_error(exc) from exc

    def write(self, data: bytes | str) -> None:
        self._ws.send(ops.stdin_frame(data))

    def resize(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        self._ws.send(ops.resize_frame(cols, rows))

    def send_signal(self, sig: str = "INT") -> None:
        """Signal the terminal's foreground process group."""
        self._ws.send(ops.signal_frame(sig))

    def read(self, timeout: float | None = None) -> bytes:
        """The next chunk of output; b"" once the process has exited and its output is drained. TimeoutError if
        nothing came within `timeout`."""
        from websockets.exceptions import ConnectionClosed

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.exit_code is not None and self.closed:
                return b""
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                frame = self._ws.recv(timeout=left)
            except ConnectionClosed:
                self.closed = True
                return b""
            out = self.handle(frame)
            if out:
                return out
            if self.exit_code is not None:
                self.closed = True  # execd sends exit after the last output
                return b""

    def read_until(self, pattern: bytes | str, timeout: float = 30.0) -> bytes:
        """Output until `pattern` appears (inclusive of everything read so far); TimeoutError if it does not."""
        want = pattern.encode() if isinstance(pattern, str) else pattern
        deadline, seen = time.monotonic() + timeout, b""
        while want not in seen:
            chunk = self.read(timeout=max(0.0, deadline - time.monotonic()))
            if not chunk:
                raise EOFError(f"terminal exited before {pattern!r} appeared; output: {seen[-500:]!r}")
            seen += chunk
        return seen

    def wait(self, timeout: float | None = None) -> int:
        """Read (and drop) output until the process exits; its exit code (128+N if killed by signal N)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exit_code is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not self.read(timeout=left) and self.exit_code is None:
                self.exit_code = self._s._call(ops.pty_status(self._s._base, self.id)).exit_code
                break
        return self.exit_code if self.exit_code is not None else -1

    def close(self, kill: bool = True) -> None:
        """Close the WebSocket; with kill (default) also end the session and its processes."""
        self._ws.close()
        self.closed = True
        if kill:
            try:
                self._s._call(ops.pty_delete(self._s._base, self.id))
            except NotFound:
                pass

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncTerminal(_State):
    """The asyncio twin of Terminal; create it with `await sandbox.pty()`."""

    def __init__(self, sandbox: AsyncSandbox, status: m.PtyStatus):
        super().__init__(status)
        self._s = sandbox
        self._ws: Any = None

    async def _connect(self, since: int | None = None) -> AsyncTerminal:
        from websockets.asyncio.client import connect

        client = self._s._client
        url = ops.ws_url(client.url, f"{self._s._base}/v1/pty/{ops.q(self.id)}/ws")
        if since is not None:
            url += f"?since={since}"
        try:
            self._ws = await connect(url, additional_headers={"Authorization": f"Bearer {client._token}"},
                                     max_size=None, open_timeout=30, user_agent_header=ops.USER_AGENT)
        except Exception as exc:  # noqa: BLE001
            raise _connect_error(exc) from exc
        return self

    async def write(self, data: bytes | str) -> None:
        await self._ws.send(ops.stdin_frame(data))

    async def resize(self, cols: int, rows: int) -> None:
        self.cols, self.rows = cols, rows
        await self._ws.send(ops.resize_frame(cols, rows))

    async def send_signal(self, sig: str = "INT") -> None:
        await self._ws.send(ops.signal_frame(sig))

    async def read(self, timeout: float | None = None) -> bytes:
        from websockets.exceptions import ConnectionClosed

        async def next_output() -> bytes:
            while True:
                if self.exit_code is not None and self.closed:
                    return b""
                try:
                    frame = await self._ws.recv()
                except ConnectionClosed:
                    self.closed = True
                    return b""
                out = self.handle(frame)
                if out:
                    return out
                if self.exit_code is not None:
                    self.closed = True
                    return b""

        return await asyncio.wait_for(next_output(), timeout)

    async def read_until(self, pattern: bytes | str, timeout: float = 30.0) -> bytes:
        want = pattern.encode() if isinstance(pattern, str) else pattern
        loop = asyncio.get_running_loop()
        deadline, seen = loop.time() + timeout, b""
        while want not in seen:
            chunk = await self.read(timeout=max(0.0, deadline - loop.time()))
            if not chunk:
                raise EOFError(f"terminal exited before {pattern!r} appeared; output: {seen[-500:]!r}")
            seen += chunk
        return seen

    async def wait(self, timeout: float | None = None) -> int:
        async def drain() -> None:
            while self.exit_code is None:
                if not await self.read() and self.exit_code is None:
                    self.exit_code = (await self._s._call(ops.pty_status(self._s._base, self.id))).exit_code
                    return

        await asyncio.wait_for(drain(), timeout)
        return self.exit_code if self.exit_code is not None else -1

    def __aiter__(self) -> AsyncTerminal:
        return self

    async def __anext__(self) -> bytes:
        chunk = await self.read()
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def close(self, kill: bool = True) -> None:
        if self._ws is not None:
            await self._ws.close()
        self.closed = True
        if kill:
            try:
                await self._s._call(ops.pty_delete(self._s._base, self.id))
            except NotFound:
                pass

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
