"""The asyncio client: `AsyncClient` → `AsyncSandbox`, the same methods as the sync client (sync.py), awaited.

    async with AsyncClient() as client:
        async with client.claim(pool="python") as sbx:
            print((await sbx.commands.run("echo hi")).stdout)
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Generic, Literal, Protocol, TypeVar

import httpx
from pydantic import ValidationError

from . import _ops as ops
from . import config
from . import models as m
from .errors import ClaimFailed, InvalidRequest, NotFound, TransportError, error_from
from .terminal import AsyncTerminal

CHUNK = 1 << 20
Progress = Callable[[int], Any]


class _Closes(Protocol):
    async def __aexit__(self, *exc: Any) -> None: ...


T = TypeVar("T", bound=_Closes)
R = TypeVar("R")


class _Opening(Generic[T]):
    """What claim() and pty() return: await it for the object, or `async with` it to also close/release it."""

    def __init__(self, make: Callable[[], Awaitable[T]]):
        self._make: Callable[[], Awaitable[T]] = make
        self._obj: T | None = None

    def __await__(self) -> Generator[Any, None, T]:
        return self._make().__await__()

    async def __aenter__(self) -> T:
        self._obj = obj = await self._make()
        return obj

    async def __aexit__(self, *exc: Any) -> None:
        assert self._obj is not None, "__aexit__ without __aenter__"
        await self._obj.__aexit__(*exc)


class AsyncClient:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 connect_timeout: float = 10.0, retry: ops.Retry | None = None, max_connections: int = 32,
                 transport: httpx.AsyncBaseTransport | None = None):
        settings = config.resolve(url, token)
        self.url, self._token = settings.url, settings.token
        self.retry = retry or ops.Retry()
        self._connect_timeout = connect_timeout
        self._http = httpx.AsyncClient(
            base_url=self.url, transport=transport,
            headers={"Authorization": f"Bearer {self._token}", "User-Agent": ops.USER_AGENT},
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=15.0),
        )

    def _timeout(self, call: ops.Call) -> Any:
        return httpx.USE_CLIENT_DEFAULT if call.timeout is ops.UNSET else httpx.Timeout(
            call.timeout, connect=self._connect_timeout)

    async def _send(self, call: ops.Call, *, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            request = self._http.build_request(call.method, call.path, json=call.json, params=call.params,
                                               content=call.content, headers=call.headers,
                                               timeout=self._timeout(call))
            try:
                resp = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = self.retry.on_error(call, attempt, exc)
                if delay is None:
                    raise ops.transport_error(call, exc) from exc
                await asyncio.sleep(delay)
                continue
            if resp.status_code < 400:
                return resp
            body = await resp.aread()
            await resp.aclose()
            delay = self.retry.on_status(call, attempt, resp.status_code)
            if delay is None:
                raise error_from(resp.status_code, body, method=call.method, path=call.path)
            await asyncio.sleep(delay)

    async def call(self, call: ops.Call[R]) -> R:
        resp = await self._send(call)
        return call.result(resp)

    def claim(self, pool: str, *, env: Mapping[str, str] | None = None, ttl: int | None = None,
              name: str | None = None, snapshot: str | None = None,
              shutdown_policy: Literal["Delete", "Retain"] = "Delete",
              timeout: float = 120.0) -> _Opening[AsyncSandbox]:
        """See Client.claim. `sbx = await client.claim(...)`, or `async with client.claim(...) as sbx:` (released
        on exit)."""
        return _Opening(lambda: self._claim(pool, env=env, ttl=ttl, name=name, snapshot=snapshot,
                                            shutdown_policy=shutdown_policy, timeout=timeout))

    async def _claim(self, pool: str, *, env: Mapping[str, str] | None, ttl: int | None, name: str | None,
                     snapshot: str | None, shutdown_policy: Literal["Delete", "Retain"],
                     timeout: float) -> AsyncSandbox:
        try:
            req = m.ClaimRequest(name=name or ops.new_claim_name(), pool=pool, env=dict(env or {}), ttl_seconds=ttl,
                                 snapshot=snapshot, shutdown_policy=shutdown_policy, timeout_seconds=timeout)
        except ValidationError as exc:
            raise InvalidRequest(str(exc)) from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        claim = await self.call(ops.create_claim(req))
        delay = 0.1
        while claim.phase == "Pending" and loop.time() < deadline:
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)
            claim = await self.call(ops.get_claim(claim.name))
        if claim.phase == "Pending":
            await self.release(claim.name)
            raise ClaimFailed(f"claim {claim.name} was not Ready within {timeout:g} s (released)", claim=claim)
        if claim.phase in ("Failed", "Expired"):
            raise ClaimFailed(claim.message or f"claim {claim.name} is {claim.phase}", claim=claim)
        return AsyncSandbox(self, claim)

    async def sandbox(self, name: str) -> AsyncSandbox:
        return AsyncSandbox(self, await self.call(ops.get_claim(name)))

    async def claims(self, pool: str | None = None) -> list[m.Claim]:
        return await self.call(ops.list_claims(pool))

    async def pools(self) -> list[m.PoolStatus]:
        return await self.call(ops.list_pools())

    async def retained(self) -> list[m.RetainedSandbox]:
        """Sandboxes kept after their claim ended (claimed with shutdown_policy="Retain"), oldest first."""
        return await self.call(ops.list_retained())

    async def delete_retained(self, name: str) -> bool:
        """Delete a retained sandbox; False if there was none of that name."""
        try:
            await self.call(ops.delete_retained(name))
            return True
        except NotFound:
            return False

    async def snapshots(self) -> list[m.Snapshot]:
        """Snapshot images (Docker mode; Kubernetes answers InvalidRequest with code not_supported)."""
        return await self.call(ops.list_snapshots())

    async def delete_snapshot(self, ref: str) -> bool:
        """Remove a snapshot by its image reference or ID; False if there was none. Conflict while a sandbox or a
        pool uses it."""
        try:
            await self.call(ops.delete_snapshot(ref))
            return True
        except NotFound:
            return False

    # --- batches ----------------------------------------------------------------------------------------------------
    def batch(self, pool: str, replicas: int, command: str | Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, timeout: int | None = None, name: str | None = None,
              shutdown_policy: Literal["Delete", "Retain"] = "Delete",
              ttl_after_finished: int | None = None) -> _Opening[AsyncBatchHandle]:
        """See Client.batch. `b = await client.batch(...)`, or `async with client.batch(...) as b:` (deleted on
        exit); then `async for result in b:` as the tasks end."""
        req = ops.batch_request(pool, replicas, command, env=env, cwd=cwd, timeout=timeout, name=name,
                                shutdown_policy=shutdown_policy, ttl_after_finished=ttl_after_finished)

        async def make() -> AsyncBatchHandle:
            return AsyncBatchHandle(self, await self.call(ops.create_batch(req)))

        return _Opening(make)

    async def get_batch(self, name: str) -> AsyncBatchHandle:
        return AsyncBatchHandle(self, await self.call(ops.get_batch(name)))

    async def batches(self, pool: str | None = None) -> list[m.Batch]:
        return await self.call(ops.list_batches(pool))

    async def delete_batch(self, name: str) -> bool:
        try:
            await self.call(ops.delete_batch(name))
            return True
        except NotFound:
            return False

    async def release(self, name: str) -> bool:
        try:
            await self.call(ops.delete_claim(name))
            return True
        except NotFound:
            return False

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSandbox:
    def __init__(self, client: AsyncClient, claim: m.Claim):
        self._client, self.claim = client, claim
        self.name = claim.name
        self._base = f"/v1/claims/{ops.q(claim.name)}/execd"
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.name!r}, pool={self.claim.pool!r}, phase={self.claim.phase!r})"

    async def _call(self, call: ops.Call[R]) -> R:
        return await self._client.call(call)

    async def refresh(self) -> m.Claim:
        self.claim = await self._call(ops.get_claim(self.name))
        return self.claim

    async def renew(self, ttl: int) -> m.Claim:
        self.claim = await self._call(ops.renew(self.name, ttl))
        return self.claim

    async def pause(self) -> m.Claim:
        self.claim = await self._call(ops.pause(self.name))
        return self.claim

    async def resume(self) -> m.Claim:
        self.claim = await self._call(ops.resume(self.name))
        return self.claim

    async def snapshot(self, tag: str | None = None) -> m.Snapshot:
        return await self._call(ops.snapshot(self.name, tag))

    async def release(self) -> bool:
        return await self._client.release(self.name)

    def pty(self, command: str | Sequence[str] | None = None, *, cols: int = 80, rows: int = 24,
            cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None,
            ) -> _Opening[AsyncTerminal]:
        """`term = await sbx.pty()`, or `async with sbx.pty() as term:` (the session is ended on exit)."""
        return _Opening(lambda: self._pty(command, cols=cols, rows=rows, cwd=cwd, env=env, user=user))

    async def _pty(self, command: str | Sequence[str] | None, *, cols: int, rows: int, cwd: str | None,
                   env: Mapping[str, str] | None, user: str | None) -> AsyncTerminal:
        status = await self._call(ops.pty_create(self._base, ops.pty_body(command, cols=cols, rows=rows, cwd=cwd,
                                                                          env=env, user=user)))
        try:
            return await AsyncTerminal(self, status)._connect()
        except BaseException:
            await self._call(ops.pty_delete(self._base, status.id))
            raise

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()


class AsyncBatchHandle:
    """See BatchHandle: `async for result in batch:` as the tasks end; `async with` deletes it on exit."""

    def __init__(self, client: AsyncClient, info: m.Batch):
        self._client, self.info = client, info
        self.name = info.name

    def __repr__(self) -> str:
        return f"AsyncBatchHandle({self.name!r}, pool={self.info.pool!r}, phase={self.info.phase!r})"

    async def refresh(self) -> m.Batch:
        self.info = await self._client.call(ops.get_batch(self.name))
        return self.info

    async def events(self) -> AsyncIterator[m.BatchEvent]:
        follow = ops.BatchFollow()
        while True:
            error: Exception | None = None
            try:
                resp = await self._client._send(ops.batch_events(self.name), stream=True)
                try:
                    async for line in resp.aiter_lines():
                        event = follow.feed(line)
                        if event is not None:
                            yield event
                        if follow.ended:
                            return
                finally:
                    await resp.aclose()
            except (httpx.TransportError, TransportError) as exc:
                error = exc
            await asyncio.sleep(follow.broken(self.name, error))

    async def results(self) -> AsyncIterator[m.BatchTaskResult]:
        async for event in self.events():
            if event.type == "task" and event.task is not None:
                yield event.task

    def __aiter__(self) -> AsyncIterator[m.BatchTaskResult]:
        return self.results()

    async def wait(self) -> m.Batch:
        async for _ in self.events():
            pass
        return await self.refresh()

    async def delete(self) -> bool:
        return await self._client.delete_batch(self.name)

    async def __aenter__(self) -> AsyncBatchHandle:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.delete()


class AsyncCommands:
    def __init__(self, sandbox: AsyncSandbox):
        self._s = sandbox

    async def run(self, command: str | Sequence[str], *, cwd: str | None = None,
                  env: Mapping[str, str] | None = None, timeout: float | None = None,
                  user: str | None = None) -> m.CommandResult:
        body = ops.command_body(command, cwd=cwd, env=env, timeout=timeout, user=user)
        return await self._s._call(ops.run(self._s._base, body))

    async def stream(self, command: str | Sequence[str], *, cwd: str | None = None,
                     env: Mapping[str, str] | None = None, timeout: float | None = None,
                     user: str | None = None) -> AsyncCommandStream:
        body = ops.command_body(command, cwd=cwd, env=env, timeout=timeout, user=user)
        call: ops.Call[None] = ops.Call("POST", f"{self._s._base}/v1/command/stream", json=body,
                                        timeout=ops.command_timeout(timeout))
        return AsyncCommandStream(await self._s._client._send(call, stream=True))

    async def background(self, command: str | Sequence[str], *, cwd: str | None = None,
                         env: Mapping[str, str] | None = None, timeout: float | None = None,
                         user: str | None = None) -> AsyncBackground:
        body = ops.command_body(command, cwd=cwd, env=env, timeout=timeout, user=user, background=True)
        return AsyncBackground(self._s, await self._s._call(ops.background(self._s._base, body)))


class AsyncCommandStream:
    def __init__(self, resp: httpx.Response):
        self._resp = resp
        self.id: str | None = None
        self.pid: int | None = None
        self.exit: m.Exit | None = None

    async def __aiter__(self) -> AsyncIterator[m.Output]:
        sse = ops.SSE()
        try:
            async for line in self._resp.aiter_lines():
                event = sse.feed(line)
                if event is None:
                    continue
                kind, payload = ops.stream_event(*event)
                if kind == "start":
                    self.id, self.pid = payload["id"], payload["pid"]
                elif kind == "output":
                    yield payload
                elif kind == "exit":
                    self.exit = payload
        except httpx.TransportError as exc:
            raise TransportError(f"the output stream broke: {exc}") from exc
        finally:
            await self.close()

    @property
    def exit_code(self) -> int | None:
        return self.exit.exit_code if self.exit else None

    async def wait(self) -> m.Exit:
        async for _ in self:
            pass
        if self.exit is None:
            raise TransportError("the output stream ended without an exit event")
        return self.exit

    async def close(self) -> None:
        await self._resp.aclose()

    async def __aenter__(self) -> AsyncCommandStream:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncBackground:
    def __init__(self, sandbox: AsyncSandbox, status: m.CommandStatus):
        self._s, self.status_at_start = sandbox, status
        self.id, self.pid = status.id, status.pid
        self.cursor = 0

    async def status(self) -> m.CommandStatus:
        return await self._s._call(ops.command_status(self._s._base, self.id))

    async def logs(self) -> list[m.Output]:
        logs = await self._s._call(ops.command_logs(self._s._base, self.id, self.cursor))
        self.cursor = logs.next_cursor
        return logs.chunks

    async def wait(self, timeout: float | None = None, interval: float = 0.2) -> m.CommandStatus:
        async def poll() -> m.CommandStatus:
            while (st := await self.status()).running:
                await asyncio.sleep(interval)
            return st

        return await asyncio.wait_for(poll(), timeout)

    async def kill(self, signal: str = "TERM") -> m.CommandStatus:
        return await self._s._call(ops.interrupt(self._s._base, self.id, signal))


async def _achunks(f: IO[bytes], progress: Progress | None, size: int = CHUNK) -> AsyncIterator[bytes]:
    while chunk := await asyncio.to_thread(f.read, size):
        if progress:
            progress(len(chunk))
        yield chunk


class AsyncFiles:
    def __init__(self, sandbox: AsyncSandbox):
        self._s = sandbox

    def _base(self) -> str:
        return self._s._base

    async def read(self, path: str) -> bytes:
        return await self._s._call(ops.read(self._base(), path))

    async def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return (await self.read(path)).decode(encoding)

    async def write(self, path: str, data: bytes | str | IO[bytes] | AsyncIterable[bytes] | Iterable[bytes], *,
                    mode: str | None = None, mkdir: bool = True) -> m.FileInfo:
        if isinstance(data, str):
            data = data.encode()
        replayable = isinstance(data, (bytes, bytearray, memoryview))
        if hasattr(data, "read"):
            data = _achunks(data, None)  # type: ignore[arg-type]
        return await self._s._call(ops.upload(self._base(), path, data, mode=mode, mkdir=mkdir,
                                              replayable=replayable))

    async def upload(self, local: str | os.PathLike[str], path: str, *, progress: Progress | None = None,
                     mode: str | None = None, mkdir: bool = True) -> m.FileInfo:
        with open(local, "rb") as f:
            return await self._s._call(ops.upload(self._base(), path, _achunks(f, progress), mode=mode, mkdir=mkdir,
                                                  replayable=False))

    async def download(self, path: str, local: str | os.PathLike[str] | IO[bytes], *,
                       progress: Progress | None = None) -> int:
        call = ops.read(self._base(), path)
        call.timeout = None
        resp = await self._s._client._send(call, stream=True)
        total = 0
        try:
            if hasattr(local, "write"):
                async for chunk in resp.aiter_bytes(CHUNK):
                    await asyncio.to_thread(local.write, chunk)
                    total += len(chunk)
                    if progress:
                        progress(len(chunk))
                return total
            target = Path(local)
            tmp = target.with_name(f".{target.name}.corral-part")
            try:
                with open(tmp, "wb") as f:
                    async for chunk in resp.aiter_bytes(CHUNK):
                        await asyncio.to_thread(f.write, chunk)
                        total += len(chunk)
                        if progress:
                            progress(len(chunk))
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            return total
        except httpx.TransportError as exc:
            raise TransportError(f"download of {path} broke: {exc}") from exc
        finally:
            await resp.aclose()

    async def info(self, path: str) -> m.FileInfo:
        return await self._s._call(ops.file_info(self._base(), path))

    async def exists(self, path: str) -> bool:
        try:
            await self.info(path)
            return True
        except NotFound:
            return False

    async def list(self, path: str = ".", *, depth: int = 1, page_size: int = 1000) -> list[m.FileInfo]:
        return [e async for e in self.iter(path, depth=depth, page_size=page_size)]

    async def iter(self, path: str = ".", *, depth: int = 1, page_size: int = 1000) -> AsyncIterator[m.FileInfo]:
        cursor = None
        while True:
            page = await self._s._call(ops.list_page(self._base(), path, depth, page_size, cursor))
            for entry in page.entries:
                yield entry
            if not (cursor := page.next_cursor):
                return

    async def search(self, path: str, pattern: str, *, limit: int = 1000) -> m.SearchResult:
        return await self._s._call(ops.search(self._base(), path, pattern, limit))

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        try:
            await self._s._call(ops.remove_file(self._base(), path))
        except InvalidRequest as exc:
            if exc.code != "is_a_directory":
                raise
            await self._s._call(ops.remove_dir(self._base(), path, recursive))

    async def move(self, source: str, destination: str, *, overwrite: bool = False) -> m.FileInfo:
        return await self._s._call(ops.move(self._base(), source, destination, overwrite))

    async def mkdir(self, path: str, *, parents: bool = True, mode: str = "0755") -> m.FileInfo:
        return await self._s._call(ops.mkdir(self._base(), path, parents, mode))

    async def replace(self, path: str, old: str, new: str, *, count: int | None = None) -> int:
        return await self._s._call(ops.replace(self._base(), path, old, new, count))
