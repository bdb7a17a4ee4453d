"""/v1/pty: interactive sessions on a pseudo-terminal, driven over a WebSocket (OpenSandbox execd's frame format).

WebSocket `GET /v1/pty/{id}/ws?since=<offset>&takeover=1`:
- client -> server: binary `0x00` + bytes = stdin; text JSON `{"type":"stdin","data":"..."}`,
  `{"type":"resize","cols":C,"rows":R}`, `{"type":"signal","signal":"INT"}`, `{"type":"ping"}`.
- server -> client: text `{"type":"attached","offset":N}` first (the absolute offset the replay starts at), then
  binary `0x03` + bytes = replay of buffered output, binary `0x01` + bytes = live output, text
  `{"type":"exit","exit_code":N,"signal":S}` when the process has exited, `{"type":"pong"}`, `{"type":"error",...}`.
- one client at a time: a second one is closed with 4409 unless it passes `takeover=1`, which closes the holder
  with 4001. Disconnecting leaves the session running; reattach with `since` to replay what was missed.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import MutableMapping
from typing import Any

from pydantic import BaseModel, Field, model_validator
from starlette.requests import Request
from starlette.websockets import WebSocket, WebSocketDisconnect

from . import processes
from .endpoints import Router, new_id
from .errors import ExecdError, error_response
from .inputs import EnvMap, Text, UserSpec
from .ptysession import PtySession
from .state import State, get_state

router = Router("pty")
STDIN, STDOUT, REPLAY = b"\x00", b"\x01", b"\x03"


class PtyRequest(BaseModel):
    command: Text | None = Field(None, description="Shell command line (run by `/bin/sh -c`); default: a login shell.")
    argv: list[Text] | None = Field(None, min_length=1, description="Program and arguments, instead of `command`.")
    cwd: Text | None = None
    env: EnvMap = Field(default_factory=dict)
    user: UserSpec | None = None
    cols: int = Field(80, ge=1, le=1000)
    rows: int = Field(24, ge=1, le=1000)

    @model_validator(mode="after")
    def _not_both(self) -> PtyRequest:
        if self.command is not None and self.argv is not None:
            raise ValueError("give at most one of `command` or `argv`")
        return self


class PtyStatus(BaseModel):
    id: str
    pid: int
    running: bool
    exit_code: int | None
    signal: str | None
    cols: int
    rows: int
    output_offset: int = Field(description="Bytes of output so far; pass as `since` to replay only newer output.")
    attached: bool
    started_at: float


class PtyList(BaseModel):
    sessions: list[PtyStatus]


def _status(s: PtySession) -> PtyStatus:
    return PtyStatus(
        id=s.id, pid=s.pid, running=s.running, exit_code=s.exit_code, signal=s.signal, cols=s.cols, rows=s.rows,
        output_offset=s.offset, attached=s.client is not None, started_at=s.started,
    )


def _default_shell() -> list[str]:
    return ["/bin/bash", "-l"] if os.path.exists("/bin/bash") else ["/bin/sh", "-l"]


def _get(state: State, sid: str) -> PtySession:
    session = state.ptys.get(sid)
    if session is None:
        raise ExecdError(404, f"no pty session {sid}")
    return session


@router.post("/v1/pty", "Start a process on a pseudo-terminal", body=PtyRequest, response=PtyStatus, status=201,
             errors=(400, 403))
async def create_pty(request: Request, body: PtyRequest) -> PtyStatus:
    """Then connect to `/v1/pty/{id}/ws`. Output produced before that is buffered and replayed."""
    state = get_state(request)
    run_as = processes.resolve_user(body.user)
    argv = body.argv or (["/bin/sh", "-c", body.command] if body.command is not None else _default_shell())
    session = PtySession(
        new_id(), argv, cwd=processes.resolve_cwd(body.cwd, state.workspace),
        env=processes.child_env(state.env, body.env, run_as), run_as=run_as, rows=body.rows, cols=body.cols,
        buffer_bytes=state.settings.pty_buffer_bytes,
    )
    state.ptys[session.id] = session
    state.metrics.inc("execd_pty_sessions_total")
    return _status(session)


@router.get("/v1/pty", "List PTY sessions", response=PtyList)
async def list_ptys(request: Request) -> PtyList:
    return PtyList(sessions=[_status(s) for s in get_state(request).ptys.values()])


@router.get("/v1/pty/{id}", "Status of a PTY session", response=PtyStatus, errors=(404,),
            path_params={"id": "Session id."})
async def pty_status(request: Request) -> PtyStatus:
    return _status(_get(get_state(request), request.path_params["id"]))


@router.delete("/v1/pty/{id}", "End a PTY session (SIGHUP, then SIGKILL)", errors=(404,),
               path_params={"id": "Session id."})
async def delete_pty(request: Request) -> None:
    state = get_state(request)
    session = _get(state, request.path_params["id"])
    state.ptys.pop(session.id, None)
    if session.client is not None:
        session.client.put_nowait(("close", 1000))
    await session.close(state.settings.kill_grace_seconds)


async def _refuse(ws: WebSocket, status: int, message: str) -> None:
    """Answer the upgrade with a plain HTTP error in the error shape (or a close code if the server can't)."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(error_response(status, message))
    else:
        await ws.close(code=4000 + status, reason=message)


async def _pump_out(ws: WebSocket, session: PtySession, outbox: asyncio.Queue) -> None:
    while True:
        kind, data = await outbox.get()
        if kind == "out":
            session.delivered(len(data))
            await ws.send_bytes(STDOUT + data)
        elif kind == "exit":
            await ws.send_text(json.dumps({"type": "exit", "exit_code": session.exit_code, "signal": session.signal}))
        elif kind == "close":
            await ws.close(code=data)
            return


async def _handle_in(ws: WebSocket, session: PtySession, message: MutableMapping[str, Any]) -> None:
    if message.get("bytes") is not None:
        raw: bytes = message["bytes"]
        if raw[:1] == STDIN:
            session.write(raw[1:])
        return
    try:
        ctl = json.loads(message.get("text") or "")
        kind = ctl["type"]
        if kind == "stdin":
            session.write(str(ctl["data"]).encode())
        elif kind == "resize":
            rows, cols = int(ctl["rows"]), int(ctl["cols"])
            if not (1 <= rows <= 1000 and 1 <= cols <= 1000):
                raise ValueError("rows and cols must be 1..1000")
            session.resize(rows, cols)
        elif kind == "signal":
            session.send_signal(processes.parse_signal(ctl["signal"]))
        elif kind == "ping":
            await ws.send_text('{"type":"pong"}')
        else:
            raise ValueError(f"unknown control type {kind!r}")
    except (ValueError, KeyError, TypeError, ExecdError) as exc:
        await ws.send_text(json.dumps({"type": "error", "code": "invalid_frame", "message": str(exc)}))


@router.ws(
    "/v1/pty/{id}/ws", "Attach to a PTY session (WebSocket; see the module docs for frames)", errors=(401, 404, 409),
    path_params={"id": "Session id."},
)
async def pty_socket(ws: WebSocket) -> None:
    state = get_state(ws)
    session = state.ptys.get(ws.path_params["id"])
    takeover = ws.query_params.get("takeover") in ("1", "true")
    if session is None:
        return await _refuse(ws, 404, "no such pty session")
    if session.client is not None and not takeover:
        return await _refuse(ws, 409, "session is attached to another client (pass takeover=1 to evict it)")
    await ws.accept()
    if session.client is not None:
        session.client.put_nowait(("close", 4001))
    since_raw = ws.query_params.get("since")
    since = int(since_raw) if since_raw and since_raw.isascii() and since_raw.isdigit() else None
    outbox: asyncio.Queue = asyncio.Queue()
    replay, start = session.attach(outbox, since)
    sender: asyncio.Task | None = None
    try:
        await ws.send_text(json.dumps({"type": "attached", "offset": start}))
        if replay:
            await ws.send_bytes(REPLAY + replay)
        sender = asyncio.ensure_future(_pump_out(ws, session, outbox))
        while True:
            receiver = asyncio.ensure_future(ws.receive())
            done, _ = await asyncio.wait({receiver, sender}, return_when=asyncio.FIRST_COMPLETED)
            if sender in done:  # taken over or session closed
                receiver.cancel()
                return
            message = receiver.result()
            if message["type"] == "websocket.disconnect":
                return
            await _handle_in(ws, session, message)
    except (WebSocketDisconnect, RuntimeError):
        return
    finally:
        if sender is not None:
            sender.cancel()
        session.detach(outbox)
