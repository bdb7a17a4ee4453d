"""The OpenAPI document of execd, built from the route declarations; committed as execd/openapi.json.

    python -m corral.execd.openapi           # rewrite execd/openapi.json
    python -m corral.execd.openapi --check   # exit 1 if the committed file differs (the drift test runs this)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from . import __version__, wire
from .endpoints import Endpoint, openapi_path, path_param_schema
from .errors import Error

DOCUMENT = Path(__file__).with_name("openapi.json")
REF = "#/components/schemas/{model}"
STATUS_TEXT = {
    200: "OK", 201: "Created", 202: "Accepted", 204: "No Content", 400: "Bad request (invalid parameters or body)",
    401: "Missing or wrong token", 403: "Forbidden (outside the allowed roots, or not permitted)", 404: "Not found",
    409: "Conflict", 413: "Too large", 416: "Range not satisfiable", 502: "The proxied port did not answer",
}
DESCRIPTION = (
    f"The daemon inside every Corral sandbox. Every endpoint but `{wire.HEALTH_PATH}` needs the sandbox token, as\n"
    f"`Authorization: Bearer <token>` or `{wire.TOKEN_HEADER}: <token>`. "
    "Every error answers `{code, message}` with a\n"
    "4xx/5xx status. Paths under /files and /directories must resolve inside the allowed roots "
    "(default: the workspace and\n"
    "/tmp); anything else is 403. Paths mirror OpenSandbox execd's (`/command`, `/files/...`, `/directories/...`, "
    "`/pty`,\n"
    "`/proxy/{port}`) under `/v1`."
)


def _models(endpoints: list[Endpoint]) -> list[tuple[type[BaseModel], Any]]:
    """Request bodies in validation mode, answers in serialization mode."""
    seen: dict[str, tuple[type[BaseModel], Any]] = {"Error": (Error, "serialization")}
    for ep in endpoints:
        if ep.body is not None:
            seen[ep.body.__name__] = (ep.body, "validation")
        for model in (ep.response, *ep.extra_responses.values(), *ep.events.values()):
            if model is not None:
                seen[model.__name__] = (model, "serialization")
    return list(seen.values())


def _parameters(ep: Endpoint) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = [
        {"name": name, "in": "path", "required": True, "description": desc, "schema": path_param_schema(ep.path, name)}
        for name, desc in ep.path_params.items()
    ]
    if ep.query is not None:
        schema = ep.query.model_json_schema()
        required = set(schema.get("required", []))
        for name, prop in schema.get("properties", {}).items():
            desc = prop.pop("description", "")
            prop.pop("title", None)
            params.append({"name": name, "in": "query", "required": name in required, "description": desc,
                           "schema": prop})
    return params


def _event_schema(events: dict[str, type[BaseModel]]) -> dict[str, Any]:
    """A text/event-stream answer: OpenAPI 3.1 has no `itemSchema` (3.2 does), so, as tools read 3.1, the schema
    describes each event: its name, its optional id and its `data`, a JSON document of the event's model."""
    by_model: dict[str, list[str]] = {}
    for name, model in events.items():
        by_model.setdefault(model.__name__, []).append(name)
    return {
        "description": "One Server-Sent Event of the stream (each `data` is one line of JSON).",
        "oneOf": [
            {
                "type": "object", "required": ["event", "data"],
                "properties": {
                    "event": {"const": names[0]} if len(names) == 1 else {"enum": names},
                    "id": {"type": "string"},
                    "data": {"type": "string", "contentMediaType": "application/json",
                             "contentSchema": {"$ref": REF.format(model=model)}},
                },
            }
            for model, names in by_model.items()
        ],
    }


def _operation(ep: Endpoint) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    ok: dict[str, Any] = {"description": STATUS_TEXT.get(ep.status, "OK")}
    if ep.websocket:
        responses["101"] = {"description": "Switching Protocols (WebSocket)"}
    elif ep.response is not None:
        ok["content"] = {"application/json": {"schema": {"$ref": REF.format(model=ep.response.__name__)}}}
        responses[str(ep.status)] = ok
    elif ep.response_media is not None:
        schema = _event_schema(ep.events) if ep.events else {"type": "string", "format": "binary"}
        ok["content"] = {ep.response_media: {"schema": schema}}
        responses[str(ep.status)] = ok
    else:
        responses["204" if ep.status == 200 else str(ep.status)] = {"description": "No Content"}
    for status, model in ep.extra_responses.items():
        responses[str(status)] = {
            "description": STATUS_TEXT.get(status, ""),
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
        }
    errors = set(ep.errors) | ({401} if not ep.public else set()) | ({413} if ep.body is not None else set())
    for status in sorted(errors):
        responses[str(status)] = {
            "description": STATUS_TEXT.get(status, ""),
            "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}},
        }
    op: dict[str, Any] = {
        "tags": [ep.tag], "summary": ep.summary, "operationId": f"{ep.handler.__name__}_{ep.method.lower()}"
        + ("_ws" if ep.websocket else "") + ("_root" if ep.path.endswith("{port:segment}") else ""),
        "parameters": _parameters(ep), "responses": responses,
    }
    if ep.description:
        op["description"] = " ".join(ep.description.split())
    if ep.body is not None:
        schema = {"$ref": REF.format(model=ep.body.__name__)}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    elif ep.request_media is not None:
        binary = {"type": "string", "format": "binary"}
        op["requestBody"] = {"required": True, "content": {ep.request_media: {"schema": binary}}}
    if ep.public:
        op["security"] = []
    return op


def build() -> dict[str, Any]:
    from .app import ROUTERS

    endpoints = [ep for router in ROUTERS for ep in router.endpoints]
    _, defs = models_json_schema(_models(endpoints), ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for ep in endpoints:
        item = paths.setdefault(openapi_path(ep.path), {})
        if ep.websocket and "get" in item:  # the same path also serves plain HTTP (the proxy)
            described = item["get"].get("description", "") + " Also accepts a WebSocket upgrade."
            item["get"]["description"] = described.strip()
            continue
        for method in (ep.method, *ep.also):
            op = _operation(ep)
            if ep.also:
                op["operationId"] += f"_{method.lower()}"
            item[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Corral execd", "version": __version__, "description": DESCRIPTION},
        "servers": [{"url": f"http://127.0.0.1:{wire.PORT}"}],
        "security": [{"bearer": []}, {"accessToken": []}],
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "accessToken": {"type": "apiKey", "in": "header", "name": wire.TOKEN_HEADER},
            },
        },
    }


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not DOCUMENT.exists() or DOCUMENT.read_text() != text:
            print(f"{DOCUMENT} is out of date: run `python -m corral.execd.openapi`", file=sys.stderr)
            return 1
        return 0
    DOCUMENT.write_text(text)
    print(f"wrote {DOCUMENT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
