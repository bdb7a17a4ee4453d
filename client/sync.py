"""The synchronous client: `Client` (one httpx connection pool) → `Sandbox` handles with `.commands`, `.files`,
`.pty()`. The async twin is aio.py; both build their requests with _ops.py."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal, TypeVar

import httpx
from pydantic import ValidationError

from . import _ops as ops
from . import config
from . import models as m
from .errors import ClaimFailed, InvalidRequest, NotFound, TransportError, error_from
from .terminal import Terminal

CHUNK = 1 << 20
Progress = Callable[[int], Any]   # called with the number of bytes just moved

R = TypeVar("R")


class Client:
    """A client of the claims API. Reads the address and token from the arguments, `CORRAL_API_URL` /
    `CORRAL_API_TOKEN`, or ~/.config/corral/config.toml. Thread-safe; close it (or use `with`) when done."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0,
                 connect_timeout: float = 10.0, retry: ops.Retry | None = None, max_connections: int = 32,
                 transport: httpx.BaseTransport | None = None):
        settings = config.resolve(url, token)
        self.url, self._token = settings.url, settings.token
        self.retry = retry or ops.Retry()
        self._connect_timeout = connect_timeout
        self._http = httpx.Client(
            base_url=self.url, transport=transport,
            headers={"Authorization": f"Bearer {self._token}", "User-Agent": ops.USER_AGENT},
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                                keepalive_expiry=15.0),
        )

    # --- plumbing ---------------------------------------------------------------------------------------------------
    def _timeout(self, call: ops.Call) -> Any:
        return httpx.USE_CLIENT_DEFAULT if call.timeout is ops.UNSET else httpx.Timeout(
            call.timeout, connect=self._connect_timeout)

    def _send(self, call: ops.Call, *, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            attempt += 1
            request = self._http.build_request(call.method, call.path, json=call.json, params=call.params,
                                               content=call.content, headers=call.headers,
                                               timeout=self._timeout(call))
            try:
                resp = self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                delay = self.retry.on_error(call, attempt, exc)
                if delay is None:
                    raise ops.transport_error(call, exc) from exc
                time.sleep(delay)
                continue
            if resp.status_code < 400:
                return resp
            body = resp.read()
            resp.close()
            delay = self.retry.on_status(call, attempt, resp.status_code)
            if delay is None:
                raise error_from(resp.status_code, body, method=call.method, path=call.path)
            time.sleep(delay)

    def call(self, call: ops.Call[R]) -> R:
        resp = self._send(call)
        return call.result(resp)

    # --- claims -----------------------------------------------------------------------------------------------------
    def claim(self, pool: str, *, env: Mapping[str, str] | None = None, ttl: int | None = None,
              name: str | None = None, snapshot: str | None = None,
              shutdown_policy: Literal["Delete", "Retain"] = "Delete", timeout: float = 120.0) -> Sandbox:
        """Claim a sandbox of `pool` (a WarmPool or Pool) and wait until it is Ready. `ttl`: lease in seconds
        (renew() extends it), `env`: for its commands, `snapshot`: start from a snapshot image. Raises ClaimFailed
        if the claim fails or is not Ready within `timeout` (it is released then), NotFound for an unknown pool."""
        try:
            req = m.ClaimRequest(name=name or ops.new_claim_name(), pool=pool, env=dict(env or {}), ttl_seconds=ttl,
                                 snapshot=snapshot, shutdown_policy=shutdown_policy, timeout_seconds=timeout)
        except ValidationError as exc:
            raise InvalidRequest(str(exc)) from None
        deadline = time.monotonic() + timeout
        claim = self.call(ops.create_claim(req))
        delay = 0.1
        while claim.phase == "Pending" and time.monotonic() < deadline:
            time.sleep(delay)
            delay = min(1.0, delay * 2)
            claim = self.call(ops.get_claim(claim.name))
        if claim.phase == "Pending":
            self.release(claim.name)
            raise ClaimFailed(f"claim {claim.name} was not Ready within {timeout:g} s (released)", claim=claim)
        if claim.phase in ("Failed", "Expired"):
            raise ClaimFailed(claim.message or f"claim {claim.name} is {claim.phase}", claim=claim)
        return Sandbox(self, claim)

    def sandbox(self, name: str) -> Sandbox:
        """A handle on an existing claim (e.g. made by `corral claim`)."""
        return Sandbox(self, self.call(ops.get_claim(name)))

    def claims(self, pool: str | None = None) -> list[m.Claim]:
        return self.call(ops.list_claims(pool))

    def pools(self) -> list[m.PoolStatus]:
        return self.call(ops.list_pools())

    def retained(self) -> list[m.RetainedSandbox]:
        """Sandboxes kept after their claim ended (claimed with shutdown_policy="Retain"), oldest first."""
        return self.call(ops.list_retained())

    def delete_retained(self, name: str) -> bool:
        """Delete a retained sandbox; False if there was none of that name."""
        try:
            self.call(ops.delete_retained(name))
            return True
        except NotFound:
            return False

    def snapshots(self) -> list[m.Snapshot]:
        """Snapshot images (Docker mode; Kubernetes answers InvalidRequest with code not_supported)."""
        return self.call(ops.list_snapshots())

    def delete_snapshot(self, ref: str) -> bool:
        """Remove a snapshot by its image reference or ID; False if there was none. Conflict while a sandbox or a
        pool uses it."""
        try:
            self.call(ops.delete_snapshot(ref))
            return True
        except NotFound:
            return False

    # --- batches ----------------------------------------------------------------------------------------------------
    def batch(self, pool: str, replicas: int, command: str | Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, timeout: int | None = None, name: str | None = None,
              shutdown_policy: Literal["Delete", "Retain"] = "Delete",
              ttl_after_finished: int | None = None) -> BatchHandle:
        """Start a batch: `replicas` sandboxes of `pool` (warm first, cold for the rest) and `command` in each (a
        string runs through /bin/sh -c, a list without a shell), its index in CORRAL_BATCH_INDEX. Returns at once;
        iterate the handle for each task's result as it ends. `timeout`: seconds before a task is killed (its index
        fails, TaskTimeout). `with client.batch(...) as b:` deletes the batch on exit. InvalidRequest for a bad
        request, NotFound for an unknown pool."""
        req = ops.batch_request(pool, replicas, command, env=env, cwd=cwd, timeout=timeout, name=name,
                                shutdown_policy=shutdown_policy, ttl_after_finished=ttl_after_finished)
        return BatchHandle(self, self.call(ops.create_batch(req)))

    def get_batch(self, name: str) -> BatchHandle:
        """A handle on an existing batch (e.g. started by `corral batch`)."""
        return BatchHandle(self, self.call(ops.get_batch(name)))

    def batches(self, pool: str | None = None) -> list[m.Batch]:
        """Batches, oldest first (their results without output)."""
        return self.call(ops.list_batches(pool))

    def delete_batch(self, name: str) -> bool:
        """Delete a batch, its running tasks and its sandboxes; False if there was none of that name."""
        try:
            self.call(ops.delete_batch(name))
            return True
        except NotFound:
            return False

    def release(self, name: str) -> bool:
        """End a claim; False if there was none of that name (already released)."""
        try:
            self.call(ops.delete_claim(name))
            return True
        except NotFound:
            return False

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Sandbox:
    """A claimed sandbox. `with client.claim(...) as sbx:` releases the claim on exit."""

    def __init__(self, client: Client, claim: m.Claim):
        self._client, self.claim = client, claim
        self.name = claim.name
        self._base = f"/v1/claims/{ops.q(claim.name)}/execd"
        self.commands = Commands(self)
        self.files = Files(self)

    def __repr__(self) -> str:
        return f"Sandbox({self.name!r}, pool={self.claim.pool!r}, phase={self.claim.phase!r})"

    def _call(self, call: ops.Call[R]) -> R:
        return self._client.call(call)

    def refresh(self) -> m.Claim:
        self.claim = self._call(ops.get_claim(self.name))
        return self.claim

    def renew(self, ttl: int) -> m.Claim:
        """Extend the lease to now + ttl seconds."""
        self.claim = self._call(ops.renew(self.name, ttl))
        return self.claim

    def pause(self) -> m.Claim:
        self.claim = self._call(ops.pause(self.name))
        return self.claim

    def resume(self) -> m.Claim:
        self.claim = self._call(ops.resume(self.name))
        return self.claim

    def snapshot(self, tag: str | None = None) -> m.Snapshot:
        return self._call(ops.snapshot(self.name, tag))

    def release(self) -> bool:
        return self._client.release(self.name)

    def pty(self, command: str | Sequence[str] | None = None, *, cols: int = 80, rows: int = 24,
            cwd: str | None = None, env: Mapping[str, str] | None = None, user: str | None = None) -> Terminal:
        """Start a process (default: a login shell) on a terminal and attach to it."""
        status = self._call(ops.pty_create(self._base, ops.pty_body(command, cols=cols, rows=rows, cwd=cwd, env=env,
                                                                    user=user)))
        try:
            return Terminal(self, status)
        except BaseException:
            self._call(ops.pty_delete(self._base, status.id))
            raise

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


class BatchHandle:
    """A batch: `for result in batch:` yields each index's BatchTaskResult as its task ends (in the order they end,
    each once, with the tail of its output), over one streaming response, reopened if it breaks. `with` deletes it
    on exit."""

    def __init__(self, client: Client, info: m.Batch):
        self._client, self.info = client, info
        self.name = info.name

    def __repr__(self) -> str:
        return f"BatchHandle({self.name!r}, pool={self.info.pool!r}, phase={self.info.phase!r})"

    def refresh(self) -> m.Batch:
        """The batch now, every index's result (ended ones with their output's tail)."""
        self.info = self._client.call(ops.get_batch(self.name))
        return self.info

    def events(self) -> Iterator[m.BatchEvent]:
        """Every line of the events stream (progress, task, end) until the batch is finished; a task line once per
        index, even across reconnects."""
        follow = ops.BatchFollow()
        while True:
            error: Exception | None = None
            try:
                resp = self._client._send(ops.batch_events(self.name), stream=True)
                try:
                    for line in resp.iter_lines():
                        event = follow.feed(line)
                        if event is not None:
                            yield event
                        if follow.ended:
                            return
                finally:
                    resp.close()
            except (httpx.TransportError, TransportError) as exc:
                error = exc
            time.sleep(follow.broken(self.name, error))

    def results(self) -> Iterator[m.BatchTaskResult]:
        for event in self.events():
            if event.type == "task" and event.task is not None:
                yield event.task

    def __iter__(self) -> Iterator[m.BatchTaskResult]:
        return self.results()

    def wait(self) -> m.Batch:
        """Until the batch is finished; then the batch with every result."""
        for _ in self.events():
            pass
        return self.refresh()

    def delete(self) -> bool:
        return self._client.delete_batch(self.name)

    def __enter__(self) -> BatchHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.delete()


class Commands:
    def __init__(self, sandbox: Sandbox):
        self._s = sandbox

    def run(self, command: str | Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
            timeout: float | None = None, user: str | None = None) -> m.CommandResult:
        """Run to completion (a string runs under /bin/sh -c, a list as argv). A non-zero exit is a result, not an
        error: look at `exit_code`. `timeout` kills the whole process tree."""
        body = ops.command_body(command, cwd=cwd, env=env, timeout=timeout, user=user)
        return self._s._call(ops.run(self._s._base, body))

    def stream(self, command: str | Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None,
               timeout: float | None = None, user: str | None = None) -> CommandStream:
        """Run and iterate over its output as it comes (`Output` chunks); `.exit_code` once the iteration ends."""
        body = ops.command_body(command, cwd=cwd, env=env, timeout=timeout, user=user)
        call: ops.Call[None] = ops.Call("POST", f"{self._s._base}/v1/command/stream", json=body,
                                        timeout=ops.command_timeout(timeout))
        return CommandStream(self._s._client._send(call, stream=True))

    def background(self, command: str | Sequence[str], *, cwd: str | None = None,
                   env: Mapping[str, str] | None = None, timeout: float | None = None,
                   user: str | None = None) -> Background:
        """Start and return at once; follow it with `.logs()`, `.wait()`, `.kill()`."""
        body = ops.command_body(command, cwd=cwd, env=env, timeout=timeout, user=user, background=True)
        return Background(self._s, self._s._call(ops.background(self._s._base, body)))


class CommandStream:
    def __init__(self, resp: httpx.Response):
        self._resp = resp
        self.id: str | None = None
        self.pid: int | None = None
        self.exit: m.Exit | None = None

    def __iter__(self) -> Iterator[m.Output]:
        sse = ops.SSE()
        try:
            for line in self._resp.iter_lines():
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
            self.close()

    @property
    def exit_code(self) -> int | None:
        return self.exit.exit_code if self.exit else None

    def wait(self) -> m.Exit:
        for _ in self:
            pass
        if self.exit is None:
            raise TransportError("the output stream ended without an exit event")
        return self.exit

    def close(self) -> None:
        self._resp.close()   # closing early ends the command (execd kills it when its client goes away)

    def __enter__(self) -> CommandStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Background:
    def __init__(self, sandbox: Sandbox, status: m.CommandStatus):
        self._s, self.status_at_start = sandbox, status
        self.id, self.pid = status.id, status.pid
        self.cursor = 0

    def status(self) -> m.CommandStatus:
        return self._s._call(ops.command_status(self._s._base, self.id))

    def logs(self) -> list[m.Output]:
        """Output since the last call (the retained log is bounded; see Logs.dropped)."""
        logs = self._s._call(ops.command_logs(self._s._base, self.id, self.cursor))
        self.cursor = logs.next_cursor
        return logs.chunks

    def wait(self, timeout: float | None = None, interval: float = 0.2) -> m.CommandStatus:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (st := self.status()).running:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"command {self.id} still running after {timeout} s")
            time.sleep(interval)
        return st

    def kill(self, signal: str = "TERM") -> m.CommandStatus:
        return self._s._call(ops.interrupt(self._s._base, self.id, signal))


def _chunks(f: IO[bytes], progress: Progress | None, size: int = CHUNK) -> Iterator[bytes]:
    while chunk := f.read(size):
        if progress:
            progress(len(chunk))
        yield chunk


class Files:
    def __init__(self, sandbox: Sandbox):
        self._s = sandbox

    def _base(self) -> str:
        return self._s._base

    def read(self, path: str) -> bytes:
        return self._s._call(ops.read(self._base(), path))

    def read_text(self, path: str, encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(self, path: str, data: bytes | str | IO[bytes] | Iterable[bytes], *, mode: str | None = None,
              mkdir: bool = True) -> m.FileInfo:
        """Write a file atomically (readers never see a partial file): bytes, text, a binary file object or an
        iterable of chunks (streamed)."""
        if isinstance(data, str):
            data = data.encode()
        replayable = isinstance(data, (bytes, bytearray, memoryview))
        if hasattr(data, "read"):
            data = _chunks(data, None)  # type: ignore[arg-type]
        return self._s._call(ops.upload(self._base(), path, data, mode=mode, mkdir=mkdir, replayable=replayable))

    def upload(self, local: str | os.PathLike[str], path: str, *, progress: Progress | None = None,
               mode: str | None = None, mkdir: bool = True) -> m.FileInfo:
        """Stream a local file into the sandbox in 1 MiB chunks (constant memory)."""
        with open(local, "rb") as f:
            return self._s._call(ops.upload(self._base(), path, _chunks(f, progress), mode=mode, mkdir=mkdir,
                                            replayable=False))

    def download(self, path: str, local: str | os.PathLike[str] | IO[bytes], *,
                 progress: Progress | None = None) -> int:
        """Stream a sandbox file to a local path (written beside it, then renamed) or file object; returns bytes."""
        call = ops.read(self._base(), path)
        call.timeout = None
        resp = self._s._client._send(call, stream=True)
        total = 0
        try:
            if hasattr(local, "write"):
                for chunk in resp.iter_bytes(CHUNK):
                    local.write(chunk)
                    total += len(chunk)
                    if progress:
                        progress(len(chunk))
                return total
            target = Path(local)
            tmp = target.with_name(f".{target.name}.corral-part")
            try:
                with open(tmp, "wb") as f:
                    for chunk in resp.iter_bytes(CHUNK):
                        f.write(chunk)
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
            resp.close()

    def info(self, path: str) -> m.FileInfo:
        return self._s._call(ops.file_info(self._base(), path))

    def exists(self, path: str) -> bool:
        try:
            self.info(path)
            return True
        except NotFound:
            return False

    def list(self, path: str = ".", *, depth: int = 1, page_size: int = 1000) -> list[m.FileInfo]:
        return list(self.iter(path, depth=depth, page_size=page_size))

    def iter(self, path: str = ".", *, depth: int = 1, page_size: int = 1000) -> Iterator[m.FileInfo]:
        """Every entry under `path` (pre-order, names sorted), page by page."""
        cursor = None
        while True:
            page = self._s._call(ops.list_page(self._base(), path, depth, page_size, cursor))
            yield from page.entries
            if not (cursor := page.next_cursor):
                return

    def search(self, path: str, pattern: str, *, limit: int = 1000) -> m.SearchResult:
        """Glob (`*`, `?`, `[..]`, `**`) under `path`."""
        return self._s._call(ops.search(self._base(), path, pattern, limit))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Delete a file, a symlink, or a directory (non-empty ones need recursive=True)."""
        try:
            self._s._call(ops.remove_file(self._base(), path))
        except InvalidRequest as exc:
            if exc.code != "is_a_directory":
                raise
            self._s._call(ops.remove_dir(self._base(), path, recursive))

    def move(self, source: str, destination: str, *, overwrite: bool = False) -> m.FileInfo:
        return self._s._call(ops.move(self._base(), source, destination, overwrite))

    def mkdir(self, path: str, *, parents: bool = True, mode: str = "0755") -> m.FileInfo:
        return self._s._call(ops.mkdir(self._base(), path, parents, mode))

    def replace(self, path: str, old: str, new: str, *, count: int | None = None) -> int:
        return self._s._call(ops.replace(self._base(), path, old, new, count))
