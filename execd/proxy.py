"""/v1/proxy/{port}/{path}: HTTP and WebSocket to a TCP port on the sandbox's loopback.

httpx and the websockets client are imported on first use only: most sandboxes never proxy, and execd's start-up
is on the cold-start path. The execd token is stripped before forwarding, so the sandboxed app never sees it.
"""

from __future__ import annotations

import re
from collections.abc import MutableMapping
from typing import Any
from urllib.parse import quote

from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.websockets import WebSocket

from .endpoints import Router
from .errors import ExecdError, error_response
from .middleware import TOKEN_HEADER
from .wsrelay import relay

router = Router("proxy")
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
HOP = {
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"host", b"authorization", TOKEN_HEADER,
}
PARAMS = {"port": "TCP port on the sandbox's 127.0.0.1.", "path": "Path forwarded as is (query string too)."}
_client: Any = None


_PREFIX = re.compile(r"^/v1/proxy/[^/]*/?")


def _forwarded_path(scope: MutableMapping[str, Any], path: str) -> str:
    """The path as the client sent it (still percent-encoded: `%0a` stays `%0a`, never a raw control character in
    the upstream request line), minus the `/v1/proxy/{port}/` prefix."""
    raw = scope.get("raw_path")
    if raw:
        return _PREFIX.sub("", raw.decode("latin-1"), count=1)
    return quote(path, safe="/:@!$&'()*+,;=-._~")


def _port(raw: str) -> int:
    """The route takes any segment as the port, so that what is not one is a 400 in the error shape, not a 404."""
    if not re.fullmatch(r"[0-9]{1,20}", raw):
        raise ExecdError(400, f"port {raw[:40]!r} is not a number", "invalid_port")
    port = int(raw)
    if not 1 <= port <= 65535:
        raise ExecdError(400, f"port {port} is out of range", "invalid_port")
    return port


def _target(port: int, path: str, query: str, scheme: str = "http") -> str:
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in path + query):
        raise ExecdError(400, "the proxied path contains a space or control character", "invalid_path")
    return f"{scheme}://127.0.0.1:{port}/{path}" + (f"?{query}" if query else "")


def _headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in HOP]


def client() -> Any:
    global _client
    if _client is None:
        import httpx

        _client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), follow_redirects=False)
    return _client


async def close_client() -> None:
    global _client
    if _client is not None:
        await _client.aclose()
        _client = None


async def _forward(request: Request) -> StreamingResponse:
    import httpx

    port, path = _port(request.path_params["port"]), _forwarded_path(request.scope, request.path_params.get("path", ""))
    url = _target(port, path, request.scope.get("query_string", b"").decode("latin-1"))
    has_body = request.method not in ("GET", "HEAD", "OPTIONS") or "content-length" in request.headers
    try:
        upstream_req = client().build_request(
            request.method, url, headers=_headers(request.headers.raw), content=request.stream() if has_body else None
        )
    except (httpx.InvalidURL, ValueError) as exc:
        raise ExecdError(400, f"cannot forward to {url!r}: {exc}", "invalid_path") from None
    try:
        upstream = await client().send(upstream_req, stream=True)
    except httpx.ConnectError:
        raise ExecdError(502, f"nothing answers on 127.0.0.1:{port}", "bad_gateway") from None
    except httpx.HTTPError as exc:
        raise ExecdError(502, f"proxy to port {port} failed: {exc}", "bad_gateway") from None
    get_state_metrics(request).inc("execd_proxy_requests_total", kind="http")
    response = StreamingResponse(
        upstream.aiter_raw(), status_code=upstream.status_code, background=BackgroundTask(upstream.aclose)
    )
    response.raw_headers = [(k.lower(), v) for k, v in _headers(upstream.headers.raw)]  # repeated headers kept
    return response


def get_state_metrics(conn: Any) -> Any:
    return conn.app.state.execd.metrics


for _path in ("/v1/proxy/{port:segment}", "/v1/proxy/{port:segment}/{path:rest}"):
    router.route(
        "GET", _path, "Proxy HTTP to a port inside the sandbox (any method)", also=METHODS[1:], errors=(400, 502),
        path_params={k: v for k, v in PARAMS.items() if "{" + k in _path},
    )(_forward)


async def _refuse(ws: WebSocket, status: int, message: str, code: str) -> None:
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(error_response(status, message, code))
    else:
        await ws.close(code=1011)


@router.ws(
    "/v1/proxy/{port:segment}/{path:rest}", "Proxy a WebSocket to a port inside the sandbox", errors=(400, 502),
    path_params=PARAMS,
)
async def proxy_socket(ws: WebSocket) -> None:
    from websockets.asyncio.client import connect

    path = _forwarded_path(ws.scope, ws.path_params.get("path", ""))
    protocols = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    try:
        port = _port(ws.path_params["port"])
        target = _target(port, path, ws.scope.get("query_string", b"").decode("latin-1"), "ws")
    except ExecdError as exc:
        return await _refuse(ws, exc.status, exc.message, exc.code)
    try:
        upstream = await connect(target, subprotocols=protocols or None)  # type: ignore[arg-type]
    except Exception as exc:  # noqa: BLE001 - refused, handshake rejected, ...
        return await _refuse(ws, 502, f"websocket to port {port} failed: {exc}", "bad_gateway")
    get_state_metrics(ws).inc("execd_proxy_requests_total", kind="websocket")
    await ws.accept(subprotocol=upstream.subprotocol)
    await relay(ws, upstream)
