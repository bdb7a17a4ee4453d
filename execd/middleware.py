"""ASGI middleware: token authentication on everything but health, and request metrics."""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from . import wire
from .metrics import Metrics

Scope = dict[str, Any]
TOKEN_HEADER = wire.TOKEN_HEADER.lower().encode()  # as ASGI gives header names: lower case bytes


def presented_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip()
        if name == TOKEN_HEADER:
            return value.strip()
    return None


class AuthMiddleware:
    """Answer 401 `{code, message}` unless the request carries the sandbox token (constant-time compare). The token
    is read from `holder.token` on every request: PUT /v1/token replaces it there."""

    def __init__(self, app: Any, holder: Any, public_paths: frozenset[str]) -> None:
        self.app = app
        self.holder = holder
        self.public = public_paths

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.public:
            return await self.app(scope, receive, send)
        given = presented_token(scope.get("headers", []))
        if given is not None and hmac.compare_digest(given, self.holder.token):
            return await self.app(scope, receive, send)
        body = json.dumps({"code": "unauthorized", "message": "missing or wrong execd token"}).encode()
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        headers.append((b"content-length", str(len(body)).encode()))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 401, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif "websocket.http.response" in scope.get("extensions", {}):
            await receive()  # websocket.connect
            await send({"type": "websocket.http.response.start", "status": 401, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await receive()
            await send({"type": "websocket.close", "code": 4401, "reason": "unauthorized"})


class MetricsMiddleware:
    """Count and time HTTP requests by route template (never by raw path, which would explode cardinality)."""

    def __init__(self, app: Any, metrics: Metrics, templates: dict[int, str]) -> None:
        self.app = app
        self.metrics = metrics
        self.templates = templates

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500
        t0 = time.perf_counter()

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = self.templates.get(id(scope.get("endpoint")), "unmatched")
            self.metrics.inc("execd_http_requests_total", route=route, method=scope["method"], status=str(status))
            self.metrics.observe("execd_http_request_duration_seconds", time.perf_counter() - t0, route=route)
