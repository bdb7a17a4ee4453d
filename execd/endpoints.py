"""A small typed-route layer over Starlette: one declaration gives the route, its validation and its OpenAPI entry.

FastAPI would do the same, but it adds ~0.3 s of imports to execd's cold start; this is the part of it execd needs.
A handler is `async def h(request, *, query=None, body=None)`, `query` and `body` being the validated pydantic models
declared on the route; it returns a pydantic model (sent as JSON with the route's status) or a Starlette Response.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, WebSocketRoute

from .errors import ExecdError

Handler = Callable[..., Awaitable[Any]]
MAX_JSON_BODY = 1 << 20  # JSON request bodies are buffered whole to validate them: this is the most one may be
ID_PATTERN = "[0-9a-f]{16}"  # command and PTY session ids (new_id); the command routes match nothing else


def new_id() -> str:
    return os.urandom(8).hex()


class _Text(Convertor[str]):
    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class _Id(_Text):
    """`{id:id}`: an id as new_id() makes them, so `/v1/command/stream` is never taken for a command id (a 405 on it
    would name GET and DELETE, which only serve ids)."""

    regex = ID_PATTERN


class _Segment(_Text):
    """`{port:segment}`: any one path segment, even empty; the handler refuses what is not a port with 400 (Starlette's
    `int` would make `/v1/proxy/x/...` a 404: no route)."""

    regex = "[^/]*"


class _Rest(_Text):
    """`{path:rest}`: the rest of the path, newlines included (Starlette's `path` is `.*`: a `%0A` made no route
    match); the proxy forwards the path still percent-encoded, so nothing raw reaches the upstream request line."""

    regex = "(?s:.*)"


register_url_convertor("id", _Id())
register_url_convertor("segment", _Segment())
register_url_convertor("rest", _Rest())
# What the document says each path parameter is, by convertor (`{name}` with no convertor: any string but `/`).
PATH_PARAM_SCHEMAS: dict[str, dict[str, Any]] = {
    "id": {"type": "string", "pattern": f"^{ID_PATTERN}$"},
    "segment": {"type": "integer", "minimum": 1, "maximum": 65535},
    "rest": {"type": "string"},
}


async def read_json_body(request: Request, limit: int = MAX_JSON_BODY) -> bytes:
    """The request body, refused with 413 as soon as it is known to exceed `limit`: at once from a declared
    Content-Length, else while it streams in (chunked, or a Content-Length the server would not enforce), so at
    most `limit` bytes plus one network chunk are ever held."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise ExecdError(413, f"request body of {declared} bytes is over the {limit}-byte limit", "too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ExecdError(413, f"request body is over the {limit}-byte limit", "too_large")
    return bytes(body)


@dataclass
class Endpoint:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    errors: tuple[int, ...] = ()
    request_media: str | None = None  # a raw (streamed) request body of this media type
    response_media: str | None = None  # a raw (streamed) response of this media type
    events: dict[str, type[BaseModel]] = field(default_factory=dict)  # text/event-stream: event name -> its data
    path_params: dict[str, str] = field(default_factory=dict)  # name -> description
    extra_responses: dict[int, type[BaseModel]] = field(default_factory=dict)  # other 2xx answers
    websocket: bool = False
    also: tuple[str, ...] = ()  # more HTTP methods served by the same handler (the proxy)
    public: bool = False  # no token needed (health only)
    description: str = ""


class Router:
    """Collects the endpoints of one concern; `routes()` turns them into Starlette routes."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.endpoints: list[Endpoint] = []

    def route(self, method: str, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            self.endpoints.append(
                Endpoint(method, path, fn, summary, self.tag, description=(fn.__doc__ or "").strip(), **kw)
            )
            return fn

        return register

    def get(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("GET", path, summary, **kw)

    def post(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("POST", path, summary, **kw)

    def put(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("PUT", path, summary, **kw)

    def delete(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("DELETE", path, summary, **kw)

    def ws(self, path: str, summary: str, **kw: Any) -> Callable[[Handler], Handler]:
        return self.route("GET", path, summary, websocket=True, **kw)


def _query_values(request: Request, model: type[BaseModel]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        key = info.alias or name
        many = request.query_params.getlist(key)
        if not many:
            continue
        origin = getattr(info.annotation, "__origin__", None)
        values[key] = many if origin is list else many[-1]
    return values


def _http_route(ep: Endpoint) -> Route:
    async def endpoint(request: Request) -> Response:
        kwargs: dict[str, Any] = {}
        try:
            if ep.query is not None:
                kwargs["query"] = ep.query.model_validate(_query_values(request, ep.query))
            if ep.body is not None:
                raw = await read_json_body(request)
                if not raw:
                    raise ExecdError(400, "a JSON request body is required")
                # strict: JSON types as the document declares them (`"merge": 0` is not a boolean, `"1"` no number)
                kwargs["body"] = ep.body.model_validate_json(raw, strict=True)
        except ValidationError as exc:
            from .errors import _validation_message

            raise ExecdError(400, _validation_message(exc)) from None
        result = await ep.handler(request, **kwargs)
        if isinstance(result, Response):
            return result
        if result is None:
            return Response(status_code=ep.status if ep.status != 200 else 204)
        return Response(result.model_dump_json(), status_code=ep.status, media_type="application/json")

    return Route(ep.path, endpoint, methods=[ep.method, *ep.also], name=f"{ep.method} {ep.path}")


def routes(routers: list[Router]) -> list[Route | WebSocketRoute]:
    out: list[Route | WebSocketRoute] = []
    for router in routers:
        for ep in router.endpoints:
            out.append(WebSocketRoute(ep.path, ep.handler) if ep.websocket else _http_route(ep))
    return out


def openapi_path(path: str) -> str:
    """The route's `{port:segment}` / `{path:rest}` become OpenAPI's `{port}` / `{path}`."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", path)


def path_param_schema(path: str, name: str) -> dict[str, Any]:
    """The schema of path parameter `name` in route `path`, from its convertor."""
    found = re.search(r"\{" + name + r"(?::(\w+))?\}", path)
    convertor = found.group(1) if found else None
    return dict(PATH_PARAM_SCHEMAS.get(convertor or "", {"type": "string"}))
