"""What the sync and async clients share: each API operation as a `Call` (method, path, body, whether a retry is
safe, how to parse the answer), the retry policy, the Server-Sent Events parser and the PTY frame format. The two
clients only differ in how they send a Call (httpx.Client vs httpx.AsyncClient) and in their streaming code."""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast
from urllib.parse import quote

import httpx

from corral.api.wire import BATCH_KEEPALIVE_SECONDS

from . import models as m
from .errors import CorralError, InvalidRequest, TransportError, error_from

USER_AGENT = "corral-client/0.1"
RETRY_STATUS = {502, 503, 504}
UNSET: Any = object()   # "the client's default timeout" (None means no timeout)
R = TypeVar("R")


@dataclass
class Call(Generic[R]):
    method: str
    path: str
    json: Any = None
    params: Mapping[str, Any] | None = None
    content: Any = None
    idempotent: bool = False
    timeout: Any = UNSET
    parse: Callable[[httpx.Response], R] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def result(self, resp: httpx.Response) -> R:
        """The parsed answer; a Call without a parser is a Call[None]."""
        return self.parse(resp) if self.parse else cast(R, None)


@dataclass(frozen=True)
class Retry:
    """Retries with exponential backoff and jitter. Any call is retried when the connection could not be made (the
    request never left); an idempotent call also on a timeout, a dropped connection or a 502/503/504."""

    attempts: int = 4            # total tries
    backoff: float = 0.2         # first delay, doubled each time
    max_backoff: float = 5.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_backoff, self.backoff * (2.0 ** (attempt - 1)))
        return base * (0.5 + random.random() / 2)

    def on_error(self, call: Call, attempt: int, exc: Exception) -> float | None:
        if attempt >= self.attempts:
            return None
        never_sent = isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))
        return self.delay(attempt) if never_sent or call.idempotent else None

    def on_status(self, call: Call, attempt: int, status: int) -> float | None:
        if attempt >= self.attempts or not call.idempotent or status not in RETRY_STATUS:
            return None
        return self.delay(attempt)


def transport_error(call: Call, exc: Exception) -> CorralError:
    return TransportError(f"{type(exc).__name__}: {exc}", method=call.method, path=call.path)


def check(resp: httpx.Response, call: Call, body: bytes | None = None) -> None:
    if resp.status_code >= 400:
        raise error_from(resp.status_code, resp.content if body is None else body, method=call.method,
                         path=call.path)


def q(name: str) -> str:
    return quote(name, safe="")


def new_claim_name() -> str:
    # Named by the client, so that a retried create is idempotent on the server (same name -> same claim).
    return f"c-{secrets.token_hex(6)}"


# --- the claims API ---------------------------------------------------------------------------------------------
def create_claim(req: m.ClaimRequest) -> Call[m.Claim]:
    return Call("POST", "/v1/claims", json=req.model_dump(mode="json", by_alias=True, exclude_none=True),
                idempotent=req.name is not None, timeout=req.timeout_seconds + 30.0,
                parse=lambda r: m.Claim.model_validate(r.json()))


def get_claim(name: str) -> Call[m.Claim]:
    return Call("GET", f"/v1/claims/{q(name)}", idempotent=True, parse=lambda r: m.Claim.model_validate(r.json()))


def list_claims(pool: str | None = None) -> Call[list[m.Claim]]:
    return Call("GET", "/v1/claims", params={"pool": pool} if pool else None, idempotent=True,
                parse=lambda r: [m.Claim.model_validate(c) for c in r.json()["items"]])


def delete_claim(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/claims/{q(name)}", idempotent=True)


def renew(name: str, ttl: int) -> Call[m.Claim]:
    return Call("POST", f"/v1/claims/{q(name)}/renew", json={"ttlSeconds": int(ttl)}, idempotent=True,
                parse=lambda r: m.Claim.model_validate(r.json()))


def pause(name: str) -> Call[m.Claim]:
    return Call("POST", f"/v1/claims/{q(name)}/pause", idempotent=True,
                parse=lambda r: m.Claim.model_validate(r.json()))


def resume(name: str) -> Call[m.Claim]:
    return Call("POST", f"/v1/claims/{q(name)}/resume", idempotent=True,
                parse=lambda r: m.Claim.model_validate(r.json()))


def snapshot(name: str, tag: str | None) -> Call[m.Snapshot]:
    return Call("POST", f"/v1/claims/{q(name)}/snapshot", json={"tag": tag} if tag else {}, idempotent=tag is not None,
                timeout=600.0, parse=lambda r: m.Snapshot.model_validate(r.json()))


def list_pools() -> Call[list[m.PoolStatus]]:
    return Call("GET", "/v1/pools", idempotent=True,
                parse=lambda r: [m.PoolStatus.model_validate(p) for p in r.json()["items"]])


def list_retained() -> Call[list[m.RetainedSandbox]]:
    return Call("GET", "/v1/retained", idempotent=True,
                parse=lambda r: [m.RetainedSandbox.model_validate(s) for s in r.json()["items"]])


def delete_retained(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/retained/{q(name)}", idempotent=True)


def list_snapshots() -> Call[list[m.Snapshot]]:
    return Call("GET", "/v1/snapshots", idempotent=True,
                parse=lambda r: [m.Snapshot.model_validate(s) for s in r.json()["items"]])


def delete_snapshot(ref: str) -> Call[None]:
    # A reference keeps its '/' and ':' (the route takes the rest of the path); anything else is escaped.
    return Call("DELETE", f"/v1/snapshots/{quote(ref, safe='/:@')}", idempotent=True, timeout=120.0)


# --- batches ----------------------------------------------------------------------------------------------------
# The events stream sends a line at least every wire.BATCH_KEEPALIVE_SECONDS: silence for three of those is a dead
# connection, opened again (a reconnect gets every ended index again; BatchFollow drops the ones already seen).
EVENTS_READ_TIMEOUT = 3 * BATCH_KEEPALIVE_SECONDS
RECONNECTS = 5  # tries in a row without a line before following a batch gives up


def new_batch_name() -> str:
    # Named by the client, so that a retried create is idempotent on the server (same name -> same batch).
    return f"b-{secrets.token_hex(6)}"


def batch_request(pool: str, replicas: int, command: str | Sequence[str], *, env: Mapping[str, str] | None,
                  cwd: str | None, timeout: int | None, name: str | None, shutdown_policy: str,
                  ttl_after_finished: int | None) -> m.BatchRequest:
    """The request, checked here as the server would (InvalidRequest naming what is wrong, before any call)."""
    from pydantic import ValidationError

    task: dict[str, Any] = {"command": command} if isinstance(command, str) else {"argv": list(command)}
    task.update({k: v for k, v in (("env", dict(env or {})), ("working_dir", cwd), ("timeout_seconds", timeout))
                 if v is not None})
    try:
        return m.BatchRequest.model_validate({
            "name": name or new_batch_name(), "pool": pool, "replicas": replicas, "task": task,
            "shutdown_policy": shutdown_policy, "ttl_seconds_after_finished": ttl_after_finished})
    except ValidationError as exc:
        raise InvalidRequest(str(exc)) from None


def create_batch(req: m.BatchRequest) -> Call[m.Batch]:
    return Call("POST", "/v1/batches", json=req.model_dump(mode="json", by_alias=True, exclude_none=True),
                idempotent=req.name is not None, parse=lambda r: m.Batch.model_validate(r.json()))


def get_batch(name: str) -> Call[m.Batch]:
    return Call("GET", f"/v1/batches/{q(name)}", idempotent=True, parse=lambda r: m.Batch.model_validate(r.json()))


def list_batches(pool: str | None = None) -> Call[list[m.Batch]]:
    return Call("GET", "/v1/batches", params={"pool": pool} if pool else None, idempotent=True,
                parse=lambda r: [m.Batch.model_validate(b) for b in r.json()["items"]])


def delete_batch(name: str) -> Call[None]:
    return Call("DELETE", f"/v1/batches/{q(name)}", idempotent=True, timeout=60.0)


def batch_events(name: str) -> Call[None]:
    return Call("GET", f"/v1/batches/{q(name)}/events", idempotent=True, timeout=EVENTS_READ_TIMEOUT)


class BatchFollow:
    """Reading a batch's events stream, across reconnects: every ended index once, in the order they ended.

    `feed` takes each line (None for a blank one, or a task line already seen before a reconnect), raises the
    stream's `error` line as the matching CorralError; `ended` is set by the `end` line. `broken` says how long to
    wait before opening the stream again after it broke (or ended without `end`), and raises TransportError once
    RECONNECTS tries in a row brought no line."""

    def __init__(self, retry: Retry | None = None) -> None:
        self.seen: set[int] = set()
        self.last: m.BatchEvent | None = None
        self.ended = False
        self.failures = 0
        self.retry = retry or Retry(attempts=RECONNECTS)

    def feed(self, line: str | bytes) -> m.BatchEvent | None:
        if not line.strip():
            return None
        event = m.BatchEvent.model_validate_json(line)
        self.last, self.failures = event, 0
        if event.type == "error":
            err = event.error
            raise error_from(404 if err and err.code == "not_found" else 503,
                             (err.model_dump_json() if err else "{}").encode(), method="GET",
                             path=f"/v1/batches/{event.batch}/events")
        if event.type == "end":
            self.ended = True
        if event.type == "task" and event.task is not None:
            if event.task.index in self.seen:
                return None
            self.seen.add(event.task.index)
        return event

    def broken(self, name: str, exc: Exception | None) -> float:
        self.failures += 1
        if self.failures >= RECONNECTS:
            why = f"{type(exc).__name__}: {exc}" if exc else "it ended without an end line"
            raise TransportError(f"following batch {name} failed {self.failures} times in a row ({why})",
                                 method="GET", path=f"/v1/batches/{name}/events")
        return self.retry.delay(self.failures)


# --- execd, through the proxy -----------------------------------------------------------------------------------
def command_body(command: str | Sequence[str], *, cwd: str | None, env: Mapping[str, str] | None,
                 timeout: float | None, user: str | None, background: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"command": command} if isinstance(command, str) else {"argv": list(command)}
    for key, value in (("cwd", cwd), ("timeout", timeout), ("user", user)):
        if value is not None:
            body[key] = value
    if env:
        body["env"] = dict(env)
    if background:
        body["background"] = True
    return body


def command_timeout(timeout: float | None) -> float | None:
    """The HTTP read timeout of a command call: the command's own timeout plus slack, or none at all."""
    return None if timeout is None else timeout + 30.0


def run(base: str, body: dict[str, Any]) -> Call[m.CommandResult]:
    return Call("POST", f"{base}/v1/command", json=body, timeout=command_timeout(body.get("timeout")),
                parse=lambda r: m.CommandResult.from_wire(r.json()))


def background(base: str, body: dict[str, Any]) -> Call[m.CommandStatus]:
    return Call("POST", f"{base}/v1/command", json=body, parse=lambda r: m.CommandStatus.model_validate(r.json()))


def command_status(base: str, cid: str) -> Call[m.CommandStatus]:
    return Call("GET", f"{base}/v1/command/{q(cid)}", idempotent=True,
                parse=lambda r: m.CommandStatus.model_validate(r.json()))


def command_logs(base: str, cid: str, cursor: int) -> Call[m.Logs]:
    return Call("GET", f"{base}/v1/command/{q(cid)}/logs", params={"cursor": cursor}, idempotent=True,
                parse=lambda r: m.Logs.from_wire(r.json()))


def interrupt(base: str, cid: str, sig: str) -> Call[m.CommandStatus]:
    return Call("DELETE", f"{base}/v1/command/{q(cid)}", params={"signal": sig}, idempotent=True,
                parse=lambda r: m.CommandStatus.model_validate(r.json()))


def file_info(base: str, path: str) -> Call[m.FileInfo]:
    return Call("GET", f"{base}/v1/files/info", params={"path": path}, idempotent=True,
                parse=lambda r: m.FileInfo.model_validate(r.json()))


def read(base: str, path: str) -> Call[bytes]:
    return Call("GET", f"{base}/v1/files/download", params={"path": path}, idempotent=True, parse=lambda r: r.content)


def upload(base: str, path: str, content: Any, *, mode: str | None, mkdir: bool, replayable: bool) -> Call[m.FileInfo]:
    params: dict[str, Any] = {"path": path, "mkdir": "true" if mkdir else "false"}
    if mode:
        params["mode"] = mode
    return Call("POST", f"{base}/v1/files/upload", params=params, content=content, idempotent=replayable,
                timeout=None if not replayable else UNSET, headers={"content-type": "application/octet-stream"},
                parse=lambda r: m.FileInfo.model_validate(r.json()))


def remove_file(base: str, path: str) -> Call[None]:
    return Call("DELETE", f"{base}/v1/files", params={"path": path}, idempotent=True)


def remove_dir(base: str, path: str, recursive: bool) -> Call[None]:
    return Call("DELETE", f"{base}/v1/directories", params={"path": path, "recursive": str(recursive).lower()},
                idempotent=True, timeout=None)


def move(base: str, source: str, destination: str, overwrite: bool) -> Call[m.FileInfo]:
    return Call("POST", f"{base}/v1/files/mv",
                json={"source": source, "destination": destination, "overwrite": overwrite},
                parse=lambda r: m.FileInfo.model_validate(r.json()))


def mkdir(base: str, path: str, parents: bool, mode: str) -> Call[m.FileInfo]:
    return Call("POST", f"{base}/v1/directories", json={"path": path, "parents": parents, "mode": mode},
                idempotent=True, parse=lambda r: m.FileInfo.model_validate(r.json()))


def list_page(base: str, path: str, depth: int, limit: int, cursor: str | None) -> Call[m.Listing]:
    params: dict[str, Any] = {"path": path, "depth": depth, "limit": limit}
    if cursor:
        params["cursor"] = cursor
    return Call("GET", f"{base}/v1/directories/list", params=params, idempotent=True,
                parse=lambda r: m.Listing.model_validate(r.json()))


def search(base: str, path: str, pattern: str, limit: int) -> Call[m.SearchResult]:
    return Call("GET", f"{base}/v1/files/search", params={"path": path, "pattern": pattern, "limit": limit},
                idempotent=True, parse=lambda r: m.SearchResult.model_validate(r.json()))


def replace(base: str, path: str, old: str, new: str, count: int | None) -> Call[int]:
    body: dict[str, Any] = {"path": path, "old": old, "new": new}
    if count is not None:
        body["count"] = count
    return Call("POST", f"{base}/v1/files/replace", json=body, parse=lambda r: r.json()["replacements"])


def pty_create(base: str, body: dict[str, Any]) -> Call[m.PtyStatus]:
    return Call("POST", f"{base}/v1/pty", json=body, parse=lambda r: m.PtyStatus.model_validate(r.json()))


def pty_status(base: str, pid: str) -> Call[m.PtyStatus]:
    return Call("GET", f"{base}/v1/pty/{q(pid)}", idempotent=True, parse=lambda r: m.PtyStatus.model_validate(r.json()))


def pty_delete(base: str, pid: str) -> Call[None]:
    return Call("DELETE", f"{base}/v1/pty/{q(pid)}", idempotent=True)


def pty_body(command: str | Sequence[str] | None, *, cols: int, rows: int, cwd: str | None,
             env: Mapping[str, str] | None, user: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"cols": cols, "rows": rows}
    if isinstance(command, str):
        body["command"] = command
    elif command is not None:
        body["argv"] = list(command)
    if cwd:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if user:
        body["user"] = user
    return body


def ws_url(api_url: str, path: str) -> str:
    scheme, rest = api_url.split("://", 1)
    return ("wss" if scheme == "https" else "ws") + "://" + rest.rstrip("/") + path


# --- Server-Sent Events of /v1/command/stream -------------------------------------------------------------------
class SSE:
    """Feed lines, get (event, data) pairs at each blank line."""

    def __init__(self) -> None:
        self.event = "message"
        self.data: list[str] = []

    def feed(self, line: str) -> tuple[str, str] | None:
        if not line:
            if not self.data:
                return None
            out = (self.event, "\n".join(self.data))
            self.event, self.data = "message", []
            return out
        if line.startswith(":"):
            return None
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "event":
            self.event = value
        elif key == "data":
            self.data.append(value)
        return None


def stream_event(event: str, data: str) -> tuple[str, Any]:
    """("start", {id, pid}) | ("output", Output) | ("exit", Exit) | (other, raw dict)."""
    payload = json.loads(data)
    if event in ("stdout", "stderr"):
        return "output", m.Output.from_wire(payload)
    if event == "exit":
        return "exit", m.Exit.model_validate(payload)
    return event, payload


# --- PTY WebSocket frames (execd's format) -----------------------------------------------------------------------
STDIN, STDOUT, REPLAY = b"\x00", b"\x01", b"\x03"


def stdin_frame(data: bytes | str) -> bytes:
    return STDIN + (data.encode() if isinstance(data, str) else data)


def resize_frame(cols: int, rows: int) -> str:
    return json.dumps({"type": "resize", "cols": int(cols), "rows": int(rows)})


def signal_frame(sig: str) -> str:
    return json.dumps({"type": "signal", "signal": sig})


def parse_frame(frame: bytes | str) -> tuple[str, Any]:
    """("output", bytes) | ("exit", {exit_code, signal}) | ("attached", {...}) | ("error", {...}) | (type, msg)."""
    if isinstance(frame, bytes):
        if frame[:1] in (STDOUT, REPLAY):
            return "output", frame[1:]
        return "unknown", frame
    msg = json.loads(frame)
    return str(msg.get("type", "unknown")), msg
