"""The claims HTTP API (FastAPI): claims CRUD, renew, pause/resume, snapshot, and a proxy to each sandbox's execd.

    POST   /v1/claims                         create (201 Ready, 202 still Pending)
    GET    /v1/claims[?pool=]                 list
    GET    /v1/claims/{name}                  get
    DELETE /v1/claims/{name}                  end the claim (204)
    POST   /v1/claims/{name}/renew            {ttlSeconds}
    POST   /v1/claims/{name}/pause | /resume
    POST   /v1/claims/{name}/snapshot         {tag?} -> {image, id}
    GET    /v1/pools                          pools with desired/ready/idle/allocated (501 if the backend has none)
    ANY    /v1/claims/{name}/execd/{path}     proxied to the sandbox's execd (its token added; yours removed);
                                              WebSockets too (execd's PTY), same path
    GET    /v1/health, /metrics               no token
"""

from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import Depends, FastAPI, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.execd.wsrelay import relay

from .backend import BackendError, ClaimsBackend
from .models import Claim, ClaimList, ClaimRequest, Error, PoolList, RenewRequest, Snapshot, SnapshotRequest

REQUESTS = Counter("corral_claims_api_requests_total", "Claims HTTP API requests", ["route", "status"])
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "authorization", "x-execd-access-token", "content-length"}
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Error}, 401: {"model": Error}, 404: {"model": Error}, 409: {"model": Error}, 503: {"model": Error},
}


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


class Unauthorized(BackendError):
    status, code = 401, "unauthorized"


def create_app(backend: ClaimsBackend, token: str, *, proxy_timeout: float = 3600.0) -> FastAPI:
    if not token:
        raise ValueError("the claims API needs a token")
    expected = f"Bearer {token}".encode()

    def authorize(request: Request) -> None:
        got = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(got, expected):
            raise Unauthorized("missing or wrong bearer token")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.http = httpx.AsyncClient(timeout=httpx.Timeout(proxy_timeout, connect=10.0),
                                           limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))
        yield
        await app.state.http.aclose()

    app = FastAPI(title="Corral claims API", version="v1", lifespan=lifespan, responses=ERRORS)
    auth = [Depends(authorize)]

    @app.exception_handler(BackendError)
    async def _backend_error(_: Request, exc: BackendError) -> JSONResponse:
        return error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return error(400, "invalid", "; ".join(parts))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error(exc.status_code, "not_found" if exc.status_code == 404 else "http_error", str(exc.detail))

    @app.exception_handler(Exception)
    async def _crash(_: Request, exc: Exception) -> JSONResponse:
        return error(500, "internal", f"{type(exc).__name__}: {exc}")

    @app.get("/v1/health", include_in_schema=False)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/claims", response_model=Claim, status_code=201, dependencies=auth,
              responses={202: {"model": Claim, "description": "accepted, still Pending"}})
    async def create_claim(req: ClaimRequest) -> Any:
        claim = await backend.create_claim(req)
        status = 202 if claim.phase == "Pending" else 201
        REQUESTS.labels("create", str(status)).inc()
        return JSONResponse(claim.model_dump(mode="json", by_alias=True), status_code=status)

    @app.get("/v1/claims", response_model=ClaimList, dependencies=auth)
    async def list_claims(pool: str | None = None) -> ClaimList:
        return ClaimList(items=await backend.list_claims(pool))

    @app.get("/v1/claims/{name}", response_model=Claim, dependencies=auth)
    async def get_claim(name: str) -> Claim:
        return await backend.get_claim(name)

    @app.delete("/v1/claims/{name}", status_code=204, dependencies=auth)
    async def delete_claim(name: str) -> Response:
        await backend.delete_claim(name)
        return Response(status_code=204)

    @app.post("/v1/claims/{name}/renew", response_model=Claim, dependencies=auth)
    async def renew(name: str, req: RenewRequest) -> Claim:
        return await backend.renew_claim(name, req.ttl_seconds)

    @app.post("/v1/claims/{name}/pause", response_model=Claim, dependencies=auth)
    async def pause(name: str) -> Claim:
        return await backend.pause_claim(name)

    @app.post("/v1/claims/{name}/resume", response_model=Claim, dependencies=auth)
    async def resume(name: str) -> Claim:
        return await backend.resume_claim(name)

    @app.post("/v1/claims/{name}/snapshot", response_model=Snapshot, dependencies=auth)
    async def snapshot(name: str, req: SnapshotRequest | None = None) -> Snapshot:
        return await backend.snapshot_claim(name, req or SnapshotRequest())

    @app.get("/v1/pools", response_model=PoolList, dependencies=auth, responses={501: {"model": Error}})
    async def list_pools() -> PoolList:
        lister = getattr(backend, "list_pools", None)
        if lister is None:
            raise BackendError("this mode's backend cannot list pools yet", code="not_implemented", status=501)
        return PoolList(items=await lister())

    @app.api_route("/v1/claims/{name}/execd/{path:path}", dependencies=auth, include_in_schema=False,
                   methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def proxy(name: str, path: str, request: Request) -> Response:
        target = await backend.execd_target(name)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        headers.append(("authorization", f"Bearer {target.token}"))
        body = request.stream() if request.method in ("POST", "PUT", "PATCH") else None
        upstream = app.state.http.build_request(request.method, f"{target.url}/{path}", params=request.query_params,
                                                headers=headers, content=body)
        try:
            resp = await app.state.http.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            return error(502, "sandbox_unreachable", f"execd of claim {name} did not answer: {exc}")
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
        return StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, headers=out_headers,
                                 background=BackgroundTask(resp.aclose))

    @app.websocket("/v1/claims/{name}/execd/{path:path}")
    async def proxy_socket(ws: WebSocket, name: str, path: str) -> None:
        from websockets.asyncio.client import connect

        async def deny(status: int, code: str, message: str) -> None:
            if "websocket.http.response" in ws.scope.get("extensions", {}):
                await ws.send_denial_response(error(status, code, message))
            else:
                await ws.close(code=1008 if status == 401 else 1011)

        if not hmac.compare_digest(ws.headers.get("authorization", "").encode(), expected):
            return await deny(401, "unauthorized", "missing or wrong bearer token")
        try:
            target = await backend.execd_target(name)
        except BackendError as exc:
            return await deny(exc.status, exc.code, exc.message)
        url = target.url.replace("http://", "ws://", 1) + "/" + path + (f"?{ws.url.query}" if ws.url.query else "")
        protocols = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
        try:
            upstream = await connect(url, additional_headers={"Authorization": f"Bearer {target.token}"},
                                     subprotocols=protocols or None, max_size=None)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001 - refused, handshake rejected (e.g. 409 from execd), ...
            status = getattr(getattr(exc, "response", None), "status_code", 502)
            return await deny(status if 400 <= status < 600 else 502, "sandbox_websocket", str(exc))
        await ws.accept(subprotocol=upstream.subprotocol)
        await relay(ws, upstream)

    return app
