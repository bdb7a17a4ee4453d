"""GET /v1/command/{id}/wait: one Server-Sent Events connection that ends with the command.

For a caller that starts a background command and wants to learn of its end without asking again and again (the
operator follows each task of a SandboxBatch this way): the connection answers at once with the command's `status`,
stays open with a comment line every `keepalive` seconds (so a dead peer or a silent proxy is noticed on both sides,
without a request), and ends with an `exit` event carrying the final status. Closing it does nothing to the command,
so a caller that restarts opens it again by the command's id and gets the `exit` at once if the command ended
meanwhile (finished background commands are kept, up to `max_finished_commands`). The output stays with
GET /v1/command/{id}/logs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import StreamingResponse

from .commands import CommandStatus, _get, _sse, _status
from .endpoints import Router
from .state import get_state

router = Router("commands")


class WaitQuery(BaseModel):
    keepalive: float = Field(15.0, ge=1, le=300, description="Seconds between keepalive comments while it runs.")


@router.get(
    "/v1/command/{id:id}/wait", "Wait for a command's end over one Server-Sent Events connection", query=WaitQuery,
    errors=(400, 404), response_media="text/event-stream", path_params={"id": "Command id."},
    events={"status": CommandStatus, "exit": CommandStatus},
)
async def wait_command(request: Request, query: WaitQuery) -> StreamingResponse:
    """Events: `status` (the command's status now), then `exit` (its final status) when it ends, then the stream
    closes; a `: keepalive` comment line every `keepalive` seconds in between. Disconnecting leaves the command
    running."""
    cmd = _get(get_state(request), request.path_params["id"])

    async def events() -> AsyncIterator[bytes]:
        yield _sse("status", _status(cmd).model_dump_json())
        while not cmd.done.is_set():
            try:
                await asyncio.wait_for(cmd.done.wait(), query.keepalive)
            except TimeoutError:
                yield b": keepalive\n\n"
        yield _sse("exit", _status(cmd).model_dump_json())

    return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-store"})
