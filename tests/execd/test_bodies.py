"""Request bodies: the token is checked before any body byte is read (every route), JSON bodies are capped (413)
while they stream in, whatever Content-Length says, and uploads stay streamed past the cap."""

from __future__ import annotations

import json
import socket

import pytest

from corral.execd import openapi
from corral.execd.endpoints import MAX_JSON_BODY

pytestmark = pytest.mark.execd
GIB = 1 << 30
DOC = json.loads(openapi.DOCUMENT.read_text())
OPERATIONS = [(method.upper(), path) for path, item in sorted(DOC["paths"].items()) for method in sorted(item)]
WS_PATHS = ["/v1/pty/{id}/ws", "/v1/proxy/{port}/{path}"]


def concrete(path: str) -> str:
    return path.replace("{port}", "1").replace("{path}", "x").replace("{id}", "nope")


def status_of(port: int, head: str, body: bytes = b"", timeout: float = 20.0) -> int:
    """Send `head` (and `body`) on a fresh connection and return the status of the first answer, which must come
    within `timeout` seconds although the body announced in `head` may never be sent."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head.encode() + body)
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    line = data.split(b"\r\n", 1)[0].decode()
    assert line.startswith("HTTP/1.1 "), repr(data[:200])
    return int(line.split()[1])


@pytest.mark.parametrize("method,path", OPERATIONS)
def test_401_before_a_gigabyte_body_is_sent(daemon, method, path):
    """The request announces 1 GiB and sends none of it: the answer can only come this fast if nothing waits for
    the body (health, the one public route, answers 200 the same way)."""
    head = (f"{method} {concrete(path)} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {GIB}\r\n\r\n")
    expected = 200 if path == "/v1/health" else 401
    assert status_of(daemon.port, head) == expected


@pytest.mark.parametrize("path", WS_PATHS)
def test_websocket_upgrade_refused_before_anything_else(daemon, path):
    head = (f"GET {concrete(path)} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
    assert status_of(daemon.port, head) == 401


def authed_head(daemon, method: str, path: str, extra: str) -> str:
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {daemon.token}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n")


def test_declared_oversized_json_body_is_413_without_reading_it(daemon):
    head = authed_head(daemon, "POST", "/v1/command", f"Content-Length: {2 * MAX_JSON_BODY}\r\n")
    assert status_of(daemon.port, head) == 413


def test_chunked_oversized_json_body_is_413_in_the_error_shape(client):
    """No Content-Length at all (chunked): the cap is counted while the body streams in. The body is valid JSON
    that would run, so only the cap can refuse it."""
    payload = json.dumps({"command": "true", "env": {"BIG": "x" * (MAX_JSON_BODY + 10)}}).encode()

    def chunks():
        for i in range(0, len(payload), 64 * 1024):
            yield payload[i : i + 64 * 1024]

    r = client.post("/v1/command", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.json()["code"] == "too_large" and set(r.json()) == {"code", "message"}


def test_lying_small_content_length_reads_no_further(daemon):
    """A Content-Length smaller than what follows: only the declared bytes are the body (here not JSON: 400)."""
    body = b'{"command": "true", ' + b" " * (2 * MAX_JSON_BODY) + b"}"
    head = authed_head(daemon, "POST", "/v1/command", "Content-Length: 16\r\n")
    assert status_of(daemon.port, head, body) == 400


def test_bodies_under_the_cap_and_uploads_over_it_pass(client, ws_dir):
    f = ws_dir / "r.txt"
    f.write_text("old")
    big = "n" * (MAX_JSON_BODY - 1000)
    r = client.post("/v1/files/replace", json={"path": str(f), "old": "old", "new": big})
    assert r.status_code == 200 and r.json()["replacements"] == 1 and f.read_text() == big
    data = b"u" * (3 * MAX_JSON_BODY)
    r = client.post("/v1/files/upload", params={"path": str(ws_dir / "u.bin")}, content=data)
    assert r.status_code == 200 and (ws_dir / "u.bin").read_bytes() == data
