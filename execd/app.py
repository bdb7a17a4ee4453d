"""The app factory: `create_app(settings)` wires the routers, error handlers, auth and metrics together."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware

from . import commands, directories, files, health, proxy, terminals, waits
from .endpoints import Router, routes
from .errors import HANDLERS
from .metrics import new_metrics
from .middleware import AuthMiddleware, MetricsMiddleware
from .settings import Settings
from .state import State

ROUTERS: list[Router] = [
    health.router, commands.router, waits.router, files.router, directories.router, terminals.router, proxy.router
]


def create_app(settings: Settings, on_token: Callable[[str], None] | None = None) -> Starlette:
    """`on_token` is called with each token PUT /v1/token sets (the supervisor keeps it for a restart)."""
    state = State(settings=settings, metrics=new_metrics(), on_token=on_token)
    state.metrics.gauge_fn(
        "execd_commands_running", "Commands currently running.",
        lambda: sum(1 for c in state.commands.values() if c.running),
    )
    state.metrics.gauge_fn(
        "execd_pty_sessions", "PTY sessions alive.", lambda: sum(1 for s in state.ptys.values() if s.running)
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:  # leave no process behind
            for cmd in list(state.commands.values()):
                cmd.kill(reason="shutdown")
            for session in list(state.ptys.values()):
                await session.close(0.5)
            await proxy.close_client()

    table = routes(ROUTERS)
    templates = {id(r.endpoint): r.path for r in table if hasattr(r, "methods")}
    public = frozenset(ep.path for router in ROUTERS for ep in router.endpoints if ep.public)
    app = Starlette(
        routes=table,
        exception_handlers=HANDLERS,
        middleware=[
            Middleware(MetricsMiddleware, metrics=state.metrics, templates=templates),
            Middleware(AuthMiddleware, holder=state, public_paths=public),
        ],
        lifespan=lifespan,
    )
    app.state.execd = state
    return app
