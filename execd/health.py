"""/v1/health (the only endpoint without a token), /v1/metrics (Prometheus text), /v1/env (claim env injection),
/v1/token (the operator rotates the token at each bind and release)."""

from __future__ import annotations

import time

from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.responses import Response

from . import __version__, wire
from .endpoints import Router
from .inputs import EnvMap
from .state import get_state

router = Router("system")
STARTED = time.time()


class Health(BaseModel):
    status: str = "ok"
    version: str
    uptime_seconds: float


class EnvBody(BaseModel):
    env: EnvMap = Field(description="Variables added to every later command and PTY (request env wins).")
    merge: bool = Field(False, description="PUT only: merge into the current set instead of replacing it.")


class EnvState(BaseModel):
    env: dict[str, str]


class TokenBody(BaseModel):
    token: str = Field(pattern=r"^[A-Za-z0-9._~+/=-]{16,512}$", description="The token every later request needs.")


class TokenState(BaseModel):
    rotated: bool = True


@router.get(wire.HEALTH_PATH, "Liveness and readiness (no token needed)", response=Health, public=True)
async def health(_: Request) -> Health:
    return Health(version=__version__, uptime_seconds=round(time.time() - STARTED, 3))


@router.get("/v1/metrics", "Prometheus metrics", response_media="text/plain; version=0.0.4")
async def metrics(request: Request) -> Response:
    return Response(get_state(request).metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.put(wire.ENV_PATH, "Set the env injected into every later command and PTY", body=EnvBody, response=EnvState,
            errors=(400,))
async def set_env(request: Request, body: EnvBody) -> EnvState:
    """For the operator: a claim's env reaches an already-warm sandbox without restarting it. The variables are
    merged (after execd's own env, before each request's `env`) into every command and PTY started afterwards;
    running processes are unaffected. `merge: false` replaces the whole set, so `{"env": {}}` clears it. Kept in
    memory: an execd restart forgets it."""
    state = get_state(request)
    state.env = {**state.env, **body.env} if body.merge else dict(body.env)
    return EnvState(env=state.env)


@router.get(wire.ENV_PATH, "The injected env", response=EnvState)
async def get_env(request: Request) -> EnvState:
    return EnvState(env=get_state(request).env)


@router.put(wire.TOKEN_PATH, "Replace the token (the operator, at each bind and release)", body=TokenBody,
            response=TokenState, errors=(400,))
async def rotate_token(request: Request, body: TokenBody) -> TokenState:
    """Only a caller holding the current token gets here, i.e. the operator: it gives each claim a token of its own
    when it binds the sandbox and takes it back when the claim ends, so a former claim's token stops working on a
    recycled sandbox. Requests already past authentication (a running stream, an open PTY) are not cut; every later
    one needs the new token. The supervisor keeps it, so a restarted execd still takes it (server.py)."""
    get_state(request).rotate_token(body.token)
    return TokenState()
