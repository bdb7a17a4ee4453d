"""The claims HTTP API (FastAPI): claims CRUD, renew, pause/resume, snapshot, and a proxy to each sandbox's execd.

    POST   /v1/claims                         create (201 Ready, 202 still Pending)
    GET    /v1/claims[?pool=]                 list
    GET    /v1/claims/{name}                  get
    DELETE /v1/claims/{name}                  end the claim (204)
    POST   /v1/claims/{name}/renew            {ttlSeconds}
    POST   /v1/claims/{name}/pause | /resume
    POST   /v1/claims/{name}/snapshot         {tag?} -> {image, id}
    GET    /v1/pools                          pools with desired/ready/idle/allocated (501 if the backend has none)
    GET    /v1/retained                       sandboxes kept after their claim ended (shutdownPolicy Retain)
    DELETE /v1/retained/{name}                delete one (204; 404 for any sandbox that is not retained)
    GET    /v1/snapshots                      snapshot images (Kubernetes: 400 not_supported, as every snapshot route)
    DELETE /v1/snapshots/{ref}                remove one by reference or image ID (204; 409 while a sandbox uses it)
    POST   /v1/batches                        a batch: N sandboxes of a pool, one task in each (201, at once)
    GET    /v1/batches[?pool=]                list (results without output)
    GET    /v1/batches/{name}                 get, one result per index with the tail of each ended task's output
    GET    /v1/batches/{name}/events          NDJSON: a line per ended task as it ends, progress, end (events.py)
    DELETE /v1/batches/{name}                 delete it, its running tasks and sandboxes (204)
    ANY    /v1/claims/{name}/execd/{path}     proxied to the sandbox's execd (its token added; yours removed);
                                              WebSockets too (execd's PTY), same path
    GET    /v1/health, /metrics               no token

The edge (`Edge`, an ASGI middleware around everything): the token is checked from the request headers before
any route runs or any byte of the body is read, for every path but health, metrics and the API docs (HTTP and
WebSocket alike: 401 `unauthorized`). The JSON routes read at most MAX_JSON_BODY bytes, counted as the body
streams in, whatever Content-Length says (413 `too_large`), and take their body as JSON whatever Content-Type
says (curl -d sends a form type). The execd proxy streams its body through unread and uncapped: uploads are
legitimate there, and execd bounds them itself. Every path and query value is validated before a backend sees it.
"""

from __future__ import annotations

import hmac
import logging
import re
from contextlib import asynccontextmanager
from typing import Annotated, Any

import httpx
from fastapi import FastAPI, Path, Query, Request, WebSocket
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest
from pydantic import ValidationError
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.api.common import DNS_LABEL, DNS_SUBDOMAIN
from corral.api.wire import (
    API_HEALTH_PATH,
    BATCH_NAME_MAX,
    IMAGE_REF,
    NAME_MAX,
    Batch,
    BatchEvent,
    BatchList,
    BatchRequest,
    Claim,
    ClaimList,
    ClaimRequest,
    Error,
    PoolList,
    RenewRequest,
    RetainedSandboxList,
    Snapshot,
    SnapshotList,
    SnapshotRequest,
)
from corral.execd.wire import TOKEN_HEADER
from corral.execd.wsrelay import relay

from .backend import BackendError, ClaimsBackend
from .events import ndjson

log = logging.getLogger("corral.operator.claimsapi")

REQUESTS = Counter("corral_claims_api_requests_total", "Claims HTTP API requests", ["route", "status"])
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade", "host", "authorization", TOKEN_HEADER.lower(), "content-length"}
SERVED_HERE = {"date", "server"}  # response headers the API's own server writes: execd's would make two of each
ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Error}, 401: {"model": Error}, 404: {"model": Error}, 409: {"model": Error}, 413: {"model": Error},
    503: {"model": Error},
}
CODES = {400: "invalid", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
         409: "conflict", 413: "too_large", 501: "not_implemented", 503: "unavailable"}

MAX_JSON_BODY = 1 << 20  # bytes: the largest body a JSON route (create, renew, snapshot, ...) reads
OPEN_PATHS = frozenset({API_HEALTH_PATH, "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
PROXY_PATH = re.compile(r"^/v1/claims/[^/]+/execd(/|$)")  # streamed through to execd, body untouched
NO_CONTROL = r"^[^\x00-\x1f\x7f]*$"

# Path and query values: checked before a backend sees them (400 `invalid`, never a backend's surprise).
ClaimName = Annotated[str, Path(min_length=1, max_length=NAME_MAX, pattern=DNS_SUBDOMAIN)]
PoolName = Annotated[str | None, Query(min_length=1, max_length=NAME_MAX, pattern=DNS_SUBDOMAIN)]
ProxiedPath = Annotated[str, Path(max_length=4096, pattern=NO_CONTROL)]
SandboxName = ClaimName
BatchName = Annotated[str, Path(min_length=1, max_length=BATCH_NAME_MAX, pattern=DNS_LABEL)]
NDJSON = "application/x-ndjson"


class NDJSONResponse(StreamingResponse):
    media_type = NDJSON
SnapshotRef = Annotated[str, Path(min_length=1, max_length=512, pattern=IMAGE_REF,
                                  description="The snapshot's image reference (as listed) or image ID.")]


def error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=status)


class Unauthorized(BackendError):
    status, code = 401, "unauthorized"


class BodyTooLarge(StarletteHTTPException):
    """Raised from the body stream of a JSON route past MAX_JSON_BODY. An HTTPException, so FastAPI's body reading
    lets it through to the handlers (it turns any other exception there into a 400)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes", headers={"connection": "close"})


class Edge:
    """The first thing every request meets (pure ASGI, outside FastAPI's routing and body parsing):

    - authentication from the headers alone, before anything reads the body: 401 `unauthorized` without reading it
      (uvicorn stops reading the socket while nobody consumes the body, so an unauthenticated upload costs at most
      its flow-control buffer); WebSockets get a 401 denial response (or a close, 1008, without that extension);
    - on the JSON routes, a body cap enforced as the body streams (a larger Content-Length is refused before the
      first byte; a missing or lying one is caught by counting), and the body taken as JSON whatever the
      Content-Type says;
    - the execd proxy (/v1/claims/{name}/execd/...) passes through untouched after authentication.
    """

    def __init__(self, app: ASGIApp, *, expected: bytes, max_body: int = MAX_JSON_BODY,
                 open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app, self.expected, self.max_body, self.open_paths = app, expected, max_body, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path: str = scope["path"]
        if path not in self.open_paths:
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(got, self.expected):
                return await self._refuse(scope, send, 401, "unauthorized", "missing or wrong bearer token")
        if scope["type"] == "websocket" or PROXY_PATH.match(path):
            return await self.app(scope, receive, send)
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await self._refuse(scope, send, 413, "too_large",
                                      f"the request body is larger than {self.max_body} bytes")
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        seen, started = 0, False

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge(self.max_body)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, capped, watched)
        except BodyTooLarge as exc:  # read outside FastAPI's handlers (none today): answer it here
            if started:
                raise
            await self._refuse(scope, send, 413, "too_large", str(exc.detail))

    @staticmethod
    async def _refuse(scope: Scope, send: Send, status: int, code: str, message: str) -> None:
        response = error(status, code, message)
        if scope["type"] == "http":  # the body stays unread: the connection closes after the answer
            response.headers["connection"] = "close"
            return await response(scope, _no_body, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status,
                        "headers": response.raw_headers})
            await send({"type": "websocket.http.response.body", "body": response.body})
        else:
            await send({"type": "websocket.close", "code": 1008})


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


def socket_problem(name: str, path: str) -> str | None:
    """The WebSocket route's own check of its path values (the HTTP routes' ClaimName and ProxiedPath)."""
    if not (len(name) <= NAME_MAX and re.fullmatch(DNS_SUBDOMAIN, name)):
        return f"{name[:64]!r} is not a claim name"
    if len(path) > 4096 or not re.fullmatch(NO_CONTROL, path):
        return "the proxied path contains control characters or is too long"
    return None


def unexpected(request: Request, exc: Exception) -> JSONResponse:
    """An exception no backend turned into a BackendError. Bad input that slipped past the edge shows up as a
    ValueError (UnicodeError, "embedded null byte", ...), an invalid URL, an OS error other than a connection's, or
    a client error of whatever the backend called (Docker's and Kubernetes' 4xx): those answer 4xx. Everything
    else is a 500 whose message names the exception type only (the details go to the log, never to the client:
    Docker's and the Kubernetes API's error texts stay inside)."""
    what = f"{request.method} {request.url.path}"
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(exc, "status", None), "code", None)  # lightkube's ApiError
    if isinstance(exc, (ValueError, httpx.InvalidURL)) and not isinstance(exc, ValidationError):
        log.info("%s: invalid input: %s", what, exc)
        return error(400, "invalid", f"invalid input: {exc}")
    if isinstance(exc, (ConnectionError, TimeoutError)):
        log.warning("%s: %s", what, exc)
        return error(503, "unavailable", f"a service the API depends on did not answer ({type(exc).__name__})")
    if isinstance(exc, OSError):
        log.info("%s: %s", what, exc)
        return error(400, "invalid", f"the request could not be carried out: {exc.strerror or type(exc).__name__}")
    if isinstance(status, int) and 400 <= status < 500 and status != 429:
        log.info("%s: refused downstream: %s", what, exc)
        code = CODES.get(status, "invalid")
        return error(status if status in CODES else 400, code,
                     f"the request was refused by the {type(exc).__module__.split('.')[0]} backend ({status})")
    log.error("%s: unexpected error", what, exc_info=exc)
    return error(500, "internal", f"internal error ({type(exc).__name__}); see the operator's log")


def allowed_methods(app: FastAPI, scope: Scope) -> str:
    """Every method some route serves at this path: the Allow header of a 405."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in app.router.routes:
        if getattr(route, "methods", None) and route.matches({**scope, "type": "http"})[0] != Match.NONE:
            methods |= set(route.methods)  # type: ignore[attr-defined]
    return ", ".join(sorted(methods))


def openapi_with_security(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document plus what the Edge enforces: every documented route needs the bearer token (health,
    metrics and the docs are not in the document)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=app.title, version=app.version, routes=app.routes, description=DESCRIPTION)
        doc.setdefault("components", {})["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer", "description": "The API token (CORRAL_API_TOKEN)."}}
        doc["security"] = [{"bearer": []}]
        # The events stream's line (no response_model: a stream of them, NDJSON), with what it refers to
        line = BatchEvent.model_json_schema(by_alias=True, mode="serialization",
                                            ref_template="#/components/schemas/{model}")
        schemas = doc["components"].setdefault("schemas", {})
        for model, schema in line.pop("$defs", {}).items():
            schemas.setdefault(model, schema)
        schemas["BatchEvent"] = line
        # FastAPI documents every answer of a route with its response class's media type (and a string schema of
        # its own for a stream): the events route's errors are JSON, its 200 is NDJSON lines of BatchEvent
        for status, answer in doc["paths"].get("/v1/batches/{name}/events", {}).get("get", {}).get("responses",
                                                                                              {}).items():
            ref = "BatchEvent" if status == "200" else "Error"
            answer["content"] = {NDJSON if status == "200" else "application/json": {
                "schema": {"$ref": f"#/components/schemas/{ref}"}}}
        app.openapi_schema = doc
    return app.openapi_schema


DESCRIPTION = """The claims API of Corral's operator (Docker and Kubernetes modes alike). Every route here needs
`Authorization: Bearer <token>`, checked before any body is read (401 `unauthorized`); JSON bodies are capped at
1 MiB (413 `too_large`); every error is `{code, message}`. Not listed: `""" + API_HEALTH_PATH + """` and `/metrics` \
(no token), and
`/v1/claims/{name}/execd/{path}`, a streaming proxy to the sandbox's execd (its own document: execd/openapi.json)."""


def create_app(backend: ClaimsBackend, token: str, *, proxy_timeout: float = 3600.0,
               max_body: int = MAX_JSON_BODY) -> FastAPI:
    if not token:
        raise ValueError("the claims API needs a token")
    expected = f"Bearer {token}".encode()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.http = httpx.AsyncClient(timeout=httpx.Timeout(proxy_timeout, connect=10.0),
                                           limits=httpx.Limits(max_connections=512, max_keepalive_connections=128))
        yield
        await app.state.http.aclose()

    app = FastAPI(title="Corral claims API", version="v1", lifespan=lifespan, responses=ERRORS)
    app.openapi = lambda: openapi_with_security(app)  # type: ignore[method-assign]
    app.add_middleware(Edge, expected=expected, max_body=max_body)  # outside routing: before any body is read

    @app.exception_handler(BackendError)
    async def _backend_error(_: Request, exc: BackendError) -> JSONResponse:
        return error(exc.status, exc.code, exc.message)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for e in exc.errors():
            if e.get("type") == "json_invalid":
                parts.append(f"the body is not JSON ({(e.get('ctx') or {}).get('error', e['msg'])}); send a JSON "
                             "object")
            else:
                parts.append(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}")
        return error(400, "invalid", "; ".join(parts))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        response = error(exc.status_code, CODES.get(exc.status_code, "http_error"), str(exc.detail))
        response.headers.update(exc.headers or {})
        if exc.status_code == 405:  # Starlette names the first matching route's methods only (POST for /v1/claims)
            response.headers["allow"] = allowed_methods(app, request.scope)
        return response

    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected(request, exc)

    # Bad input that reached a backend anyway: answered inside the app (4xx, see `unexpected`); anything else
    # reaches the last handler (Starlette's server-error middleware, which also logs it).
    for kind in (ValueError, OSError, httpx.InvalidURL, Exception):
        app.add_exception_handler(kind, _unexpected)

    @app.get(API_HEALTH_PATH, include_in_schema=False)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/claims", response_model=Claim, status_code=201,
              responses={202: {"model": Claim, "description": "accepted, still Pending"}})
    async def create_claim(req: ClaimRequest) -> Any:
        claim = await backend.create_claim(req)
        status = 202 if claim.phase == "Pending" else 201
        REQUESTS.labels("create", str(status)).inc()
        return JSONResponse(claim.model_dump(mode="json", by_alias=True), status_code=status)

    @app.get("/v1/claims", response_model=ClaimList)
    async def list_claims(pool: PoolName = None) -> ClaimList:
        return ClaimList(items=await backend.list_claims(pool))

    @app.get("/v1/claims/{name}", response_model=Claim)
    async def get_claim(name: ClaimName) -> Claim:
        return await backend.get_claim(name)

    @app.delete("/v1/claims/{name}", status_code=204)
    async def delete_claim(name: ClaimName) -> Response:
        await backend.delete_claim(name)
        return Response(status_code=204)

    @app.post("/v1/claims/{name}/renew", response_model=Claim)
    async def renew(name: ClaimName, req: RenewRequest) -> Claim:
        return await backend.renew_claim(name, req.ttl_seconds)

    @app.post("/v1/claims/{name}/pause", response_model=Claim)
    async def pause(name: ClaimName) -> Claim:
        return await backend.pause_claim(name)

    @app.post("/v1/claims/{name}/resume", response_model=Claim)
    async def resume(name: ClaimName) -> Claim:
        return await backend.resume_claim(name)

    @app.post("/v1/claims/{name}/snapshot", response_model=Snapshot)
    async def snapshot(name: ClaimName, req: SnapshotRequest | None = None) -> Snapshot:
        return await backend.snapshot_claim(name, req or SnapshotRequest())

    @app.get("/v1/pools", response_model=PoolList, responses={501: {"model": Error}})
    async def list_pools() -> PoolList:
        lister = getattr(backend, "list_pools", None)
        if lister is None:
            raise BackendError("this mode's backend cannot list pools yet", code="not_implemented", status=501)
        return PoolList(items=await lister())

    def optional(method: str) -> Any:
        """A backend method added after the first protocol (see backend.py): 501 where a backend lacks it."""
        found = getattr(backend, method, None)
        if found is None:
            raise BackendError(f"this mode's backend has no {method} yet", code="not_implemented", status=501)
        return found

    @app.get("/v1/retained", response_model=RetainedSandboxList, responses={501: {"model": Error}})
    async def list_retained() -> RetainedSandboxList:
        return RetainedSandboxList(items=await optional("list_retained")())

    @app.delete("/v1/retained/{name}", status_code=204, responses={501: {"model": Error}})
    async def delete_retained(name: SandboxName) -> Response:
        await optional("delete_retained")(name)
        return Response(status_code=204)

    @app.get("/v1/snapshots", response_model=SnapshotList, responses={501: {"model": Error}})
    async def list_snapshots() -> SnapshotList:
        return SnapshotList(items=await optional("list_snapshots")())

    @app.delete("/v1/snapshots/{ref:path}", status_code=204, responses={501: {"model": Error}})
    async def delete_snapshot(ref: SnapshotRef) -> Response:
        await optional("delete_snapshot")(ref)
        return Response(status_code=204)

    @app.post("/v1/batches", response_model=Batch, status_code=201, responses={501: {"model": Error}})
    async def create_batch(req: BatchRequest) -> Batch:
        return await optional("create_batch")(req)

    @app.get("/v1/batches", response_model=BatchList, responses={501: {"model": Error}})
    async def list_batches(pool: PoolName = None) -> BatchList:
        return BatchList(items=await optional("list_batches")(pool))

    @app.get("/v1/batches/{name}", response_model=Batch, responses={501: {"model": Error}})
    async def get_batch(name: BatchName) -> Batch:
        return await optional("get_batch")(name)

    @app.delete("/v1/batches/{name}", status_code=204, responses={501: {"model": Error}})
    async def delete_batch(name: BatchName) -> Response:
        await optional("delete_batch")(name)
        return Response(status_code=204)

    @app.get("/v1/batches/{name}/events", response_class=NDJSONResponse, responses={
        200: {"description": "One BatchEvent (JSON) per line: `task` as each index ends (those ended before the "
                             "stream opened first), `progress` as the counts change, `end` once the batch is "
                             "finished; then the response ends.",
              "content": {NDJSON: {"schema": {"$ref": "#/components/schemas/BatchEvent"}}}},
        501: {"model": Error}})
    async def batch_events(name: BatchName) -> NDJSONResponse:
        states = optional("watch_batch")(name)
        try:
            first = await anext(states)  # NotFound here is a 404, before any line
        except StopAsyncIteration:
            raise BackendError(f"batch {name} could not be read", code="unavailable", status=503) from None
        return NDJSONResponse(ndjson(first, states), headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    @app.api_route("/v1/claims/{name}/execd/{path:path}", include_in_schema=False,
                   methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
    async def proxy(name: ClaimName, path: ProxiedPath, request: Request) -> Response:
        target = await backend.execd_target(name)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        headers.append(("authorization", f"Bearer {target.token}"))
        body = request.stream() if request.method in ("POST", "PUT", "PATCH") else None
        upstream = app.state.http.build_request(request.method, f"{target.url}/{path}", params=request.query_params,
                                                headers=headers, content=body)
        try:
            resp = await app.state.http.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            if isinstance(exc, httpx.ConnectError) and (unreachable := getattr(backend, "execd_unreachable", None)):
                unreachable(name)  # the backend checks, and replaces a sandbox whose execd stays gone
            return error(502, "sandbox_unreachable", f"execd of claim {name} did not answer: {exc}")
        out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP | SERVED_HERE}
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

        if not hmac.compare_digest(ws.headers.get("authorization", "").encode(), expected):  # Edge did; kept
            return await deny(401, "unauthorized", "missing or wrong bearer token")
        if problem := socket_problem(name, path):
            return await deny(400, "invalid", problem)
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
