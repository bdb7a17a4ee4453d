"""The claims HTTP API of the Kubernetes operator: uvicorn in kopf's own event loop, started by the operator's startup
handler when a token is set and stopped by its cleanup handler (operator/handlers.py calls `start`, `stop` and, on
every SandboxClaim watch event, `claim_event`; on every SandboxBatch one, `batch_event`). SIGTERM/SIGINT stay kopf's:
uvicorn installs no signal handlers.

Settings (env): CORRAL_API_TOKEN or CORRAL_API_TOKEN_FILE (unset: no API), CORRAL_API_HOST (0.0.0.0),
CORRAL_API_PORT (7780), CORRAL_API_NAMESPACE (`default`): the one namespace whose claims it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from .kube_backend import KubeBackend

log = logging.getLogger("corral.operator.claimsapi")


class ApiSettings(BaseModel):
    """The claims API of the Kubernetes operator, from CORRAL_API_* environment variables."""

    token: str = Field(default="", description="Bearer token (CORRAL_API_TOKEN or the file CORRAL_API_TOKEN_FILE); "
                                               "empty: the API is off.")
    host: str = Field(default="0.0.0.0", description="Listen address.")
    port: int = Field(default=7780, ge=1, le=65535, description="Listen port.")
    namespace: str = Field(default="default", description="The namespace whose claims the API serves.")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ApiSettings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {k: env[v] for k, v in (("host", "CORRAL_API_HOST"), ("port", "CORRAL_API_PORT"),
                                                          ("namespace", "CORRAL_API_NAMESPACE")) if env.get(v)}
        if env.get("CORRAL_API_TOKEN_FILE"):
            values["token"] = Path(env["CORRAL_API_TOKEN_FILE"]).read_text().strip()
        elif env.get("CORRAL_API_TOKEN"):
            values["token"] = env["CORRAL_API_TOKEN"].strip()
        return cls.model_validate(values)


class _Server:
    def __init__(self, backend: KubeBackend, settings: ApiSettings) -> None:
        import uvicorn

        from .app import create_app

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # SIGTERM/SIGINT stay kopf's
                yield

        self.backend, self.settings = backend, settings
        app = create_app(backend, settings.token)
        if getattr(backend.ctx, "shards", None) is not None:  # sharded: innermost, after the edge's token check
            from starlette.middleware import Middleware

            from .routing import ShardRouter

            app.user_middleware.append(Middleware(ShardRouter, backend=backend))
        config = uvicorn.Config(app, log_level="warning", lifespan="on",
                                access_log=False, timeout_keep_alive=30, timeout_graceful_shutdown=5, backlog=2048)
        self.server = Server(config)
        self.task: asyncio.Task | None = None

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.settings.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.settings.host, self.settings.port))  # fails here, loudly, if the port is taken
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(True)
        self.task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]))
        while not self.server.started:  # uvicorn's own startup: a few loop turns
            if self.task.done():
                self.task.result()
                raise RuntimeError("the claims API server stopped while starting")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self.task is None:
            return
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), 10)
        except (TimeoutError, Exception):  # noqa: BLE001 - stopping anyway
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task


SERVER: dict[str, _Server] = {}


async def start(context: Any) -> None:
    """kopf startup: serve the claims API if a token is configured (CORRAL_API_TOKEN / CORRAL_API_TOKEN_FILE)."""
    settings = ApiSettings.from_env()
    if not settings.token:
        log.info("claims API off (set CORRAL_API_TOKEN or CORRAL_API_TOKEN_FILE to serve it)")
        return
    backend = KubeBackend(context, settings.namespace)
    server = _Server(backend, settings)
    try:
        await server.start()
    except OSError as exc:  # a taken port or a bad address: fatal, not retried
        import kopf

        raise kopf.PermanentError(f"the claims API cannot listen on {settings.host}:{settings.port}: {exc}") from exc
    SERVER["api"] = server
    log.info("claims API on %s:%d for namespace %s", settings.host, settings.port, settings.namespace)


async def stop() -> None:
    server = SERVER.pop("api", None)
    if server is not None:
        await server.stop()


def claim_event(namespace: str, name: str) -> None:
    """A SandboxClaim watch event (after kopf updated its indices): wake whoever waits on that claim."""
    server = SERVER.get("api")
    if server is not None:
        server.backend.claim_event(namespace, name)


def batch_event(namespace: str, name: str) -> None:
    """A SandboxBatch watch event (after kopf updated its indices): wake whoever follows that batch."""
    server = SERVER.get("api")
    if server is not None:
        server.backend.batch_event(namespace, name)
