"""Cross-cutting API rules: the token on every endpoint but health, the error shape, OpenAPI drift, metrics, proxy."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.sync.server import serve

from corral.execd import openapi

pytestmark = pytest.mark.execd
DOC = json.loads(openapi.DOCUMENT.read_text())
OPERATIONS = [
    (method.upper(), path) for path, item in sorted(DOC["paths"].items()) for method in sorted(item)
]


def concrete(path: str) -> str:
    return path.replace("{port}", "1").replace("{path}", "x").replace("{id}", "nope")


def test_openapi_document_is_current():
    """Fails when a route changes without `python -m corral.execd.openapi` being rerun."""
    proc = subprocess.run([sys.executable, "-m", "corral.execd.openapi", "--check"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_every_route_is_documented_with_the_error_shape():
    assert len(OPERATIONS) > 20
    for method, path in OPERATIONS:
        op = DOC["paths"][path][method.lower()]
        if path != "/v1/health":
            assert op["responses"]["401"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error"), path
    assert DOC["components"]["schemas"]["Error"]["required"] == ["code", "message"]


@pytest.mark.parametrize("method,path", OPERATIONS)
@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_401_without_the_token(daemon, method, path, token):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.request(method, daemon.url + concrete(path), headers=headers, timeout=30)
    if path == "/v1/health":
        assert r.status_code == 200
        return
    assert r.status_code == 401, (method, path, r.status_code)
    if method != "HEAD":
        assert r.json()["code"] == "unauthorized" and set(r.json()) == {"code", "message"}


def test_websockets_need_the_token(daemon, client):
    sid = client.post("/v1/pty", json={"command": "sleep 30"}).json()["id"]
    try:
        for path in (f"/v1/pty/{sid}/ws", "/v1/proxy/1/x"):
            with pytest.raises(InvalidStatus) as err:
                connect(f"ws://127.0.0.1:{daemon.port}{path}", open_timeout=30).__enter__()
            assert err.value.response.status_code == 401
    finally:
        client.delete(f"/v1/pty/{sid}")


def test_access_token_header_works_too(daemon):
    r = httpx.get(daemon.url + "/v1/env", headers={"X-EXECD-ACCESS-TOKEN": daemon.token}, timeout=30)
    assert r.status_code == 200


def test_unknown_route_and_method_use_the_error_shape(client):
    r = client.get("/v1/nope")
    assert r.status_code == 404 and set(r.json()) == {"code", "message"}
    r = client.patch("/v1/files/info")
    assert r.status_code == 405 and r.json()["code"] == "method_not_allowed"
    r = client.post("/v1/command", content=b"{not json")
    assert r.status_code == 400 and set(r.json()) == {"code", "message"}


def test_health_and_metrics(client, daemon):
    assert httpx.get(daemon.url + "/v1/health", timeout=30).json()["status"] == "ok"
    client.post("/v1/command", json={"command": "true"})
    text = client.get("/v1/metrics").text
    assert 'execd_commands_total{mode="run"}' in text
    assert 'execd_http_requests_total{method="POST",route="/v1/command",status="200"}' in text
    assert "execd_http_request_duration_seconds_bucket" in text


class _Echo(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        payload = json.dumps({
            "method": self.command, "path": self.path, "body": body.decode(),
            "headers": {k.lower(): v for k, v in self.headers.items()},
        }).encode()
        self.send_response(201)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def http_upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_http_proxy(client, http_upstream):
    r = client.post(f"/v1/proxy/{http_upstream}/some/where?q=1&r=2", content=b"payload", headers={"X-Custom": "yes"})
    assert r.status_code == 201
    seen = r.json()
    assert (seen["method"], seen["path"], seen["body"]) == ("POST", "/some/where?q=1&r=2", "payload")
    assert seen["headers"]["x-custom"] == "yes"
    assert "authorization" not in seen["headers"] and "x-execd-access-token" not in seen["headers"]
    assert client.get(f"/v1/proxy/{http_upstream}").json()["path"] == "/"


def test_http_proxy_refuses_a_port_that_is_not_one_and_forwards_a_newline(client, http_upstream):
    for port in ("abc", "0", "65536", "-1", "1.5", "", "%D9%A3"):  # the last: an Arabic-Indic digit
        r = client.get(f"/v1/proxy/{port}/x")
        assert (r.status_code, r.json()["code"]) == (400, "invalid_port"), (port, r.text)
    r = client.get(f"/v1/proxy/{http_upstream}/a%0Ab")  # once no route (404); the upstream sees it still encoded
    assert r.status_code == 201 and r.json()["path"] == "/a%0Ab"


def test_command_routes_take_only_command_ids(client):
    r = client.get("/v1/command/stream")  # not a command id: the stream's 405, naming the one method it serves
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.headers
    assert client.put("/v1/env", json={"env": {}, "merge": 0}).status_code == 400  # strict JSON types
    assert client.post("/v1/command", json={"command": "true", "timeout": "5"}).status_code == 400


def test_http_proxy_to_a_closed_port_is_502(client):
    import socket

    with socket.socket() as s:  # a port nobody listens on (several conftest.py exist: none is imported by name)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = client.get(f"/v1/proxy/{port}/x")
    assert r.status_code == 502 and r.json()["code"] == "bad_gateway"


def test_websocket_proxy(daemon):
    def echo(ws) -> None:
        for message in ws:
            ws.send(message)

    with serve(echo, "127.0.0.1", 0) as server:
        port = server.socket.getsockname()[1]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with connect(f"ws://127.0.0.1:{daemon.port}/v1/proxy/{port}/echo", additional_headers=daemon.headers,
                         open_timeout=30) as ws:
                ws.send("hello")
                assert ws.recv(timeout=30) == "hello"
                ws.send(b"\x00\xff")
                assert ws.recv(timeout=30) == b"\x00\xff"
        finally:
            server.shutdown()


def test_daemon_refuses_to_start_without_a_token(tmp_path: Path):
    env = {"PATH": "/usr/bin:/bin", "CORRAL_EXECD_PORT": "0"}
    proc = subprocess.run([sys.executable, "-m", "corral.execd"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "CORRAL_EXECD_TOKEN" in proc.stderr


def test_token_file(tmp_path: Path):
    from corral.execd.settings import Settings

    (tmp_path / "tok").write_text("from-file\n")
    s = Settings.from_env({"CORRAL_EXECD_TOKEN_FILE": str(tmp_path / "tok"), "CORRAL_EXECD_ROOTS": "/a:/b"})
    assert s.token == "from-file" and [str(r) for r in s.roots] == ["/a", "/b"]
    assert s.port == 44772
