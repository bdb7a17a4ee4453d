"""/v1/command: run to completion, stream as Server-Sent Events, or run in the background (status, logs, interrupt)."""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import BaseModel, Field, model_validator
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from . import processes, wire
from .endpoints import Router, new_id
from .errors import ExecdError
from .inputs import MAX_TIMEOUT_SECONDS, CommandKey, EnvMap, Text, UserSpec
from .runner import Command, Event
from .state import State, get_state

router = Router("commands")
DONE_WAIT_SECONDS = 5.0  # after SIGKILL, how long DELETE waits for the command to be reaped


class CommandRequest(BaseModel):
    command: Text | None = Field(None, description="Shell command line, run by `/bin/sh -c`.")
    argv: list[Text] | None = Field(None, min_length=1, description="Program and arguments, run without a shell.")
    cwd: Text | None = Field(
        None, description="Working directory (default: the workspace); relative to it if relative.")
    env: EnvMap = Field(default_factory=dict, description=f"Added to execd's env and the env from PUT {wire.ENV_PATH}.")
    timeout: float | None = Field(None, gt=0, le=MAX_TIMEOUT_SECONDS,
                                  description="Seconds; on expiry the whole process tree is SIGKILLed.")
    user: UserSpec | None = Field(None, description="User name or numeric uid to run as (execd must be root).")
    background: bool = Field(False, description="POST /v1/command only: answer 202 at once; use status/logs/DELETE.")
    key: CommandKey | None = Field(None, description=(
        "Background commands only: the caller's name for this command. While execd holds a command with the same "
        "key (running, or finished and retained), the POST starts nothing and answers 200 with that command's "
        "status: a caller that died between its request and recording the id asks again without running it twice."))

    @model_validator(mode="after")
    def _one_of(self) -> CommandRequest:
        if (self.command is None) == (self.argv is None):
            raise ValueError("give exactly one of `command` or `argv`")
        return self


class CommandResult(BaseModel):
    id: str
    exit_code: int = Field(description="Exit status; 128+N when killed by signal N (as a shell reports it).")
    signal: str | None = Field(None, description="Name of the signal that killed the command, if any.")
    timed_out: bool
    interrupted: bool
    duration_ms: float
    stdout: str = Field(description="Output, as text when it is valid UTF-8, else base64 (see stdout_encoding).")
    stdout_encoding: Literal["utf-8", "base64"]
    stderr: str
    stderr_encoding: Literal["utf-8", "base64"]
    truncated: bool = Field(description="True if a stream exceeded the daemon's output cap and was cut.")


class CommandStatus(BaseModel):
    id: str
    pid: int
    mode: Literal["run", "stream", "background"]
    running: bool
    exit_code: int | None
    signal: str | None
    timed_out: bool
    interrupted: bool
    started_at: float = Field(description="Unix time.")
    finished_at: float | None
    duration_ms: float
    key: str | None = Field(None, description="The key it was started with (POST /v1/command), if any.")


class CommandList(BaseModel):
    commands: list[CommandStatus]


class OutputChunk(BaseModel):
    seq: int = Field(description="Order of the chunk among all output events of the command.")
    stream: Literal["stdout", "stderr"]
    data: str
    encoding: Literal["utf-8", "base64"]


class CommandStarted(BaseModel):
    """The stream's `start` event."""

    id: str
    pid: int


class CommandExit(BaseModel):
    """The stream's `exit` event."""

    exit_code: int | None = Field(description="As in CommandResult; null only if the command could not be reaped.")
    signal: str | None
    timed_out: bool
    interrupted: bool
    duration_ms: float


class CommandLogs(BaseModel):
    id: str
    running: bool
    chunks: list[OutputChunk]
    next_cursor: int = Field(description="Pass as `cursor` to get only later output.")
    dropped: int = Field(description="Chunks discarded because the retained log is bounded.")
    dropped_bytes: int = Field(0, description="Bytes of output discarded (per-command or daemon-wide bound).")
    truncated: bool = Field(False, description="Output was discarded: the oldest chunks of this command, or all of "
                            "it once finished, when the daemon's bound on all retained output was reached.")


class LogsQuery(BaseModel):
    cursor: int = Field(0, ge=0, description="Return chunks with seq greater than this.")


class InterruptQuery(BaseModel):
    signal: str = Field("TERM", description="Signal name or number; escalates to KILL after the grace period.")


def _status(cmd: Command) -> CommandStatus:
    return CommandStatus(
        id=cmd.id, pid=cmd.pid, mode=cmd.mode, running=cmd.running, exit_code=cmd.exit_code, signal=cmd.signal,  # type: ignore[arg-type]
        timed_out=cmd.timed_out, interrupted=cmd.interrupted, started_at=cmd.started, finished_at=cmd.finished,
        duration_ms=cmd.duration_ms, key=cmd.key,
    )


def _chunk(event: Event) -> OutputChunk:
    data, encoding = processes.encode_output(event.data)
    return OutputChunk(seq=event.seq, stream=event.stream, data=data, encoding=encoding)  # type: ignore[arg-type]


def _start(state: State, body: CommandRequest, mode: str) -> Command:
    run_as = processes.resolve_user(body.user)
    argv = body.argv if body.argv is not None else ["/bin/sh", "-c", body.command or ""]
    proc = processes.spawn(
        argv,
        cwd=processes.resolve_cwd(body.cwd, state.workspace),
        env=processes.child_env(state.env, body.env, run_as),
        run_as=run_as,
    )
    s = state.settings
    cmd = Command(
        id=new_id(), mode=mode, proc=proc, timeout=body.timeout, max_output=s.max_output_bytes,
        log_bytes=s.log_buffer_bytes, metrics=state.metrics,
    )
    cmd.key = body.key if mode == "background" else None
    state.commands[cmd.id] = cmd
    if mode == "background":
        cmd.retention = state.retention
        state.retention.track(cmd)
    state.metrics.inc("execd_commands_total", mode=mode)
    return cmd


def _forget_finished(state: State) -> None:
    finished = [c for c in state.commands.values() if not c.running and c.mode == "background"]
    for cmd in finished[: max(0, len(finished) - state.settings.max_finished_commands)]:
        state.commands.pop(cmd.id, None)
        state.retention.forget(cmd)


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


@router.post(
    "/v1/command", "Run a command to completion (or start it in the background)", body=CommandRequest,
    response=CommandResult, errors=(400, 403), extra_responses={202: CommandStatus},
)
async def run_command(request: Request, body: CommandRequest) -> CommandResult | Response:
    """Runs the command and answers when it has exited, with its whole output (binary-safe, capped per stream).

    A command that exits non-zero, times out or is interrupted is still a 200: look at `exit_code`, `timed_out`,
    `interrupted`. If the client disconnects first, the command's whole process tree is killed. With
    `background: true` the answer is 202 with the command's status; follow it with GET /v1/command/{id}[/logs]
    (or /wait); 200 with the status of the command already started with the same `key`.
    """
    state = get_state(request)
    if body.background:
        same = body.key and next((c for c in state.commands.values() if c.key == body.key), None)
        if same:
            return Response(_status(same).model_dump_json(), status_code=200, media_type="application/json")
        cmd = _start(state, body, "background")
        asyncio.get_running_loop().create_task(cmd.run()).add_done_callback(lambda _: _forget_finished(state))
        return Response(_status(cmd).model_dump_json(), status_code=202, media_type="application/json")
    cmd = _start(state, body, "run")
    runner = asyncio.ensure_future(cmd.run())
    watcher = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({runner, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not runner.done():  # client went away: kill the tree
            runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    finally:
        watcher.cancel()
        state.commands.pop(cmd.id, None)
    out, out_enc = processes.encode_output(bytes(cmd.stdout))
    err, err_enc = processes.encode_output(bytes(cmd.stderr))
    return CommandResult(
        id=cmd.id, exit_code=cmd.exit_code if cmd.exit_code is not None else -1, signal=cmd.signal,
        timed_out=cmd.timed_out, interrupted=cmd.interrupted, duration_ms=cmd.duration_ms, stdout=out,
        stdout_encoding=out_enc, stderr=err, stderr_encoding=err_enc, truncated=cmd.truncated,  # type: ignore[arg-type]
    )


def _sse(event: str, payload: str, seq: int | None = None) -> bytes:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {payload}\n\n".encode()


@router.post(
    "/v1/command/stream", "Run a command, streaming its output as Server-Sent Events", body=CommandRequest,
    errors=(400, 403), response_media="text/event-stream",
    events={"start": CommandStarted, "stdout": OutputChunk, "stderr": OutputChunk, "exit": CommandExit},
)
async def stream_command(request: Request, body: CommandRequest) -> StreamingResponse:
    """Events, in order: `start` {id, pid}; `stdout` / `stderr` {seq, stream, data, encoding} as output arrives
    (a chunk never splits a UTF-8 character; non-UTF-8 chunks are base64); `exit` {exit_code, signal, timed_out,
    interrupted, duration_ms}. Disconnecting kills the command's whole process tree. `background` is ignored."""
    state = get_state(request)
    cmd = _start(state, body, "stream")
    runner = asyncio.ensure_future(cmd.run())

    async def events():
        try:
            yield _sse("start", CommandStarted(id=cmd.id, pid=cmd.pid).model_dump_json())
            assert cmd.queue is not None
            while (event := await cmd.queue.get()) is not None:
                cmd.consumed(event)
                yield _sse(event.stream, _chunk(event).model_dump_json(), event.seq)
            await runner
            yield _sse("exit", CommandExit(
                exit_code=cmd.exit_code, signal=cmd.signal, timed_out=cmd.timed_out, interrupted=cmd.interrupted,
                duration_ms=cmd.duration_ms,
            ).model_dump_json())
        finally:
            if not runner.done():
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
            state.commands.pop(cmd.id, None)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-store"})


def _get(state: State, command_id: str) -> Command:
    cmd = state.commands.get(command_id)
    if cmd is None:
        raise ExecdError(404, f"no command {command_id}")
    return cmd


@router.get("/v1/command", "List running and retained background commands", response=CommandList)
async def list_commands(request: Request) -> CommandList:
    return CommandList(commands=[_status(c) for c in get_state(request).commands.values()])


@router.get(
    "/v1/command/{id:id}", "Status of a command", response=CommandStatus, errors=(404,),
    path_params={"id": "Command id from POST /v1/command or the stream's start event."},
)
async def command_status(request: Request) -> CommandStatus:
    return _status(_get(get_state(request), request.path_params["id"]))


@router.get(
    "/v1/command/{id:id}/logs", "Output of a background command since a cursor", query=LogsQuery,
    response=CommandLogs, errors=(400, 404), path_params={"id": "Command id."},
)
async def command_logs(request: Request, query: LogsQuery) -> CommandLogs:
    """The retained output (bounded per command and across all commands: the oldest chunks are dropped first,
    and a finished command's output before a running one's; `truncated`, `dropped` and `dropped_bytes` say so)."""
    cmd = _get(get_state(request), request.path_params["id"])
    chunks = [_chunk(e) for e in list(cmd.log) if e.seq > query.cursor]
    return CommandLogs(
        id=cmd.id, running=cmd.running, chunks=chunks, next_cursor=chunks[-1].seq if chunks else query.cursor,
        dropped=cmd.dropped, dropped_bytes=cmd.dropped_bytes, truncated=cmd.dropped > 0,
    )


@router.delete(
    "/v1/command/{id:id}", "Interrupt a command (its whole process tree)", query=InterruptQuery,
    response=CommandStatus, errors=(400, 404), path_params={"id": "Command id."},
)
async def interrupt_command(request: Request, query: InterruptQuery) -> CommandStatus:
    """Sends `signal` (default TERM) to the command's process tree and SIGKILLs it after the grace period; answers
    with the final status. Interrupting a finished command is a no-op."""
    state = get_state(request)
    cmd = _get(state, request.path_params["id"])
    sig = processes.parse_signal(query.signal)
    await cmd.interrupt(sig, state.settings.kill_grace_seconds)
    try:
        await asyncio.wait_for(cmd.done.wait(), DONE_WAIT_SECONDS)
    except TimeoutError:
        pass  # killed but still draining: the status says running
    return _status(cmd)
