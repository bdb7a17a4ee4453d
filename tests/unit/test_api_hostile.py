"""unit: the claims API facing hostile or careless clients (issue 15), on the real app with fake backends.

Authentication happens before any byte of a body is read (checked on the ASGI receive channel and on a real
uvicorn server's peak RSS), JSON bodies are capped while they stream (413), curl's form content type is taken as
JSON, every input is validated before a backend sees it, and what a backend raises for bad input is a 4xx in the
one error shape. The Kubernetes mode's server (kube_server) serves the same app: the last tests go through it."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from hostile_http import peak_rss, post
from starlette.testclient import TestClient, WebSocketDenialResponse

from corral.api.claim import SandboxClaimSpec
from corral.api.common import EXECD_ENV_PREFIX
from corral.operator.claimsapi import (
    Claim,
    ClaimRequest,
    ExecdTarget,
    NotFound,
    Snapshot,
    create_app,
)
from corral.operator.claimsapi.app import MAX_JSON_BODY

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# Exactly what `curl -s -H "Authorization: Bearer $TOKEN" -X POST localhost:7780/v1/claims -d '{...}'` sends.
CURL = {"Host": "localhost:7780", "User-Agent": "curl/8.5.0", "Accept": "*/*", **AUTH,
        "Content-Type": "application/x-www-form-urlencoded"}


class FakeBackend:
    """Records every call; a claim is Ready at once. `fail` makes every call raise that exception."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail = fail

    def _record(self, what: str, arg: Any) -> None:
        self.calls.append((what, arg))
        if self.fail is not None:
            raise self.fail

    def _claim(self, name: str, pool: str = "python") -> Claim:
        return Claim(name=name, pool=pool, pool_kind="WarmPool", phase="Ready", created=datetime.now(UTC))

    async def create_claim(self, req: ClaimRequest) -> Claim:
        self._record("create", req)
        return self._claim(req.name or "claim-1", req.pool)

    async def get_claim(self, name: str) -> Claim:
        self._record("get", name)
        return self._claim(name)

    async def list_claims(self, pool: str | None = None) -> list[Claim]:
        self._record("list", pool)
        return []

    async def delete_claim(self, name: str) -> None:
        self._record("delete", name)

    async def renew_claim(self, name: str, ttl_seconds: int) -> Claim:
        self._record("renew", ttl_seconds)
        return self._claim(name)

    async def pause_claim(self, name: str) -> Claim:
        self._record("pause", name)
        return self._claim(name)

    async def resume_claim(self, name: str) -> Claim:
        self._record("resume", name)
        return self._claim(name)

    async def snapshot_claim(self, name: str, req: Any) -> Snapshot:
        self._record("snapshot", req)
        return Snapshot(claim=name, image="corral-snapshot/s:t", id="sha256:0")

    async def execd_target(self, name: str) -> ExecdTarget:
        self._record("execd_target", name)
        return ExecdTarget(url="http://execd.test:44772", token="execd-token")


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"code", "message"} and body["message"], body
    if code is not None:
        assert body["code"] == code, body
    return body


# --- authentication before the body, and the body cap, on the ASGI channel ----------------------------------------
def call_asgi(app: Any, method: str, path: str, headers: dict[str, str], chunks: int, chunk: bytes = b"x" * (1 << 20),
              ) -> tuple[int, dict[str, Any], int]:
    """Send `chunks` chunks of body through the app's receive channel; returns (status, body, receive calls)."""
    calls = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls <= chunks:
            return {"type": "http.request", "body": chunk, "more_body": calls < chunks}
        await asyncio.sleep(3600)  # a client that stopped sending: a correct app never gets here
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 7780)}
    loop = asyncio.new_event_loop()  # not asyncio.run: that unsets the main thread's loop, which Pulumi's tests use
    try:
        loop.run_until_complete(asyncio.wait_for(app(scope, receive, send), 30))
    finally:
        loop.close()
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body), calls


@pytest.mark.parametrize("path", ["/v1/claims", "/v1/claims/c1/renew", "/v1/claims/c1/execd/files/upload"])
@pytest.mark.parametrize("auth", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "t0ken"}])
def test_an_unauthenticated_body_is_refused_before_a_byte_of_it_is_read(path, auth):
    backend = FakeBackend()
    status, body, calls = call_asgi(create_app(backend, TOKEN), "POST", path,
                                    {"content-type": "application/json", **auth}, chunks=32)
    assert (status, body["code"]) == (401, "unauthorized") and set(body) == {"code", "message"}
    assert calls == 0, f"the app read {calls} MiB of an unauthenticated body"
    assert backend.calls == []


def test_json_bodies_are_capped_while_they_stream_whatever_content_length_says():
    app = create_app(FakeBackend(), TOKEN)
    # Declared too large: refused before the first byte.
    status, body, calls = call_asgi(app, "POST", "/v1/claims", {**AUTH, "content-length": str(200 << 20)}, chunks=200)
    assert (status, body["code"], calls) == (413, "too_large", 0)
    # No Content-Length (chunked) or a lying one: counted as it arrives, stopped right after the cap.
    for headers in ({**AUTH}, {**AUTH, "content-length": "20"}):
        status, body, calls = call_asgi(app, "POST", "/v1/claims", headers, chunks=200)
        assert (status, body["code"]) == (413, "too_large") and str(MAX_JSON_BODY) in body["message"]
        assert calls <= MAX_JSON_BODY // (1 << 20) + 1


def test_an_authenticated_oversized_json_body_gets_413_in_the_error_shape():
    backend = FakeBackend()
    big = {"pool": "python", "env": {"A": "x" * (MAX_JSON_BODY + 10)}}
    with TestClient(create_app(backend, TOKEN)) as http:
        r = http.post("/v1/claims", json=big, headers=AUTH)
        assert_error(r, 413, "too_large")
        assert r.headers["connection"] == "close"
        # Just under the cap is read (and then judged on its content: this env value is too long).
        r = http.post("/v1/claims", json={"pool": "python", "env": {"A": "x" * (MAX_JSON_BODY - 100)}}, headers=AUTH)
        assert "larger than" not in assert_error(r, 400, "invalid")["message"]
    assert backend.calls == []


def test_the_execd_proxy_streams_large_uploads_through_uncapped_and_authenticates():
    backend, seen = FakeBackend(), {}

    async def execd(request: httpx.Request) -> httpx.Response:
        seen["bytes"] = len(await request.aread())
        seen["auth"] = request.headers.get("authorization")
        return httpx.Response(200, headers={"content-type": "application/json"},
                              stream=httpx.ByteStream(b'{"ok": true}'))  # a stream, as a real upstream sends

    app = create_app(backend, TOKEN)
    upload = os.urandom(3 * MAX_JSON_BODY)
    with TestClient(app) as http:
        app.state.http = httpx.AsyncClient(transport=httpx.MockTransport(execd))
        r = http.put("/v1/claims/c1/execd/files/upload?path=/workspace/blob", content=upload,
                     headers={**AUTH, "Content-Type": "application/octet-stream"})
        assert r.status_code == 200 and seen == {"bytes": len(upload), "auth": "Bearer execd-token"}
        assert_error(http.put("/v1/claims/c1/execd/files/upload", content=b"x"), 401, "unauthorized")
        with pytest.raises(WebSocketDenialResponse) as denied:
            with http.websocket_connect("/v1/claims/c1/execd/pty"):
                pass
        assert_error(denied.value, 401, "unauthorized")
    assert backend.calls == [("execd_target", "c1")]



def test_the_execd_proxy_leaves_date_and_server_to_the_api_servers_own():
    """The API's server (uvicorn) writes Date and Server on every answer: execd's passed through made two of each
    (seen on the kind cluster: `date` twice, which strict clients refuse)."""
    async def execd(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"date": "Mon, 01 Jan 2024 00:00:00 GMT", "server": "uvicorn",
                                            "content-type": "application/json", "x-execd": "1"},
                              stream=httpx.ByteStream(b"{}"))  # a stream, as a real upstream sends

    app = create_app(FakeBackend(), TOKEN)
    with TestClient(app) as http:  # (the test client writes no Date or Server of its own)
        app.state.http = httpx.AsyncClient(transport=httpx.MockTransport(execd))
        r = http.post("/v1/claims/c1/execd/v1/command", json={"command": "true"}, headers=AUTH)
    assert r.status_code == 200 and r.headers["x-execd"] == "1", r.headers
    assert "date" not in r.headers and "server" not in r.headers, r.headers

def test_only_health_metrics_and_docs_answer_without_a_token():
    with TestClient(create_app(FakeBackend(), TOKEN)) as http:
        assert http.get("/v1/health").status_code == 200 and http.get("/metrics").status_code == 200
        assert http.get("/openapi.json").json()["info"]["title"] == "Corral claims API"
        for method, path in [("GET", "/v1/claims"), ("GET", "/v1/claims/c1"), ("DELETE", "/v1/claims/c1"),
                             ("POST", "/v1/claims/c1/pause"), ("GET", "/v1/pools"), ("GET", "/v1/nowhere"),
                             ("GET", "/v1/claims/c1/execd/files")]:
            assert_error(http.request(method, path), 401, "unauthorized")


SERVER = """
import socket, sys, uvicorn
from corral.operator.claimsapi import create_app
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
print(sock.getsockname()[1], flush=True)
uvicorn.Server(uvicorn.Config(create_app(object(), sys.argv[1]), log_level="warning")).run(sockets=[sock])
"""


def test_a_200_mb_unauthenticated_post_leaves_a_real_servers_memory_flat():
    proc = subprocess.Popen([sys.executable, "-c", SERVER, TOKEN], stdout=subprocess.PIPE, text=True)
    try:
        port = int(proc.stdout.readline())
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/v1/health").status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.05)
        before = peak_rss(proc.pid)
        size, chunk = 200 << 20, b"x" * (1 << 20)
        status, body, _ = post(f"http://127.0.0.1:{port}/v1/claims",
                               {"Content-Type": "application/json", "Content-Length": str(size)},
                               (chunk for _ in range(size // len(chunk))), chunked=False)
        grown = peak_rss(proc.pid) - before
        assert grown < 32 << 20, f"the server's peak RSS grew by {grown >> 20} MiB for an unauthenticated body"
        assert status == 401, body[:200]
        assert b'"code":"unauthorized"' in body
    finally:
        proc.terminate()
        proc.wait(10)


# --- curl's content type -----------------------------------------------------------------------------------------
def test_the_readmes_curl_line_works_as_written():
    backend = FakeBackend()
    with TestClient(create_app(backend, TOKEN), base_url="http://localhost:7780") as http:
        r = http.post("/v1/claims", content=b'{"pool": "python"}', headers=CURL)
        assert r.status_code == 201 and r.json()["pool"] == "python", r.text
        r = http.post("/v1/claims/c1/renew", content=b'{"ttlSeconds": 600}', headers=CURL)
        assert r.status_code == 200 and backend.calls[-1] == ("renew", 600)
        # No Content-Type at all, or a wrong one: still JSON.
        r = http.post("/v1/claims", content=b'{"pool": "python"}', headers=AUTH)
        assert r.status_code == 201
        r = http.post("/v1/claims", content=b'{"pool": "python"}', headers={**AUTH, "Content-Type": "text/plain"})
        assert r.status_code == 201
        # A body that is not JSON (curl -d pool=python) is a clear 400.
        message = assert_error(http.post("/v1/claims", content=b"pool=python", headers=CURL), 400, "invalid")["message"]
        assert "not JSON" in message
        assert_error(http.post("/v1/claims", content=b"", headers=CURL), 400, "invalid")
        assert_error(http.post("/v1/claims", content=b"\xff\xfe", headers=CURL), 400, "invalid")
    assert [c[0] for c in backend.calls] == ["create", "renew", "create", "create"]


def test_the_readmes_second_curl_line_reaches_execd_byte_for_byte():
    seen = {}

    async def execd(request: httpx.Request) -> httpx.Response:
        seen.update(path=request.url.path, body=await request.aread(), type=request.headers.get("content-type"))
        return httpx.Response(200, stream=httpx.ByteStream(b'{"exitCode": 0}'))

    app = create_app(FakeBackend(), TOKEN)
    body = b'{"command": "python3 -c \\"print(6*7)\\""}'
    with TestClient(app, base_url="http://localhost:7780") as http:
        app.state.http = httpx.AsyncClient(transport=httpx.MockTransport(execd))
        r = http.post("/v1/claims/c1/execd/v1/command", content=body, headers=CURL)
        assert r.status_code == 200
    # The proxy leaves the body and its content type alone: execd reads JSON from the bytes itself.
    assert seen == {"path": "/v1/command", "body": body, "type": "application/x-www-form-urlencoded"}


# --- validation at the edge --------------------------------------------------------------------------------------
BAD_ENVS = [
    {"": "x"}, {"A=B": "x"}, {"A\x00B": "x"}, {"1A": "x"}, {"A B": "x"}, {"A": "x\x00y"},
    {"CORRAL_EXECD_ROOTS": "/"}, {"CORRAL_EXECD_TOKEN": "mine"}, {"corral_execd_host": "0.0.0.0"},
    {"A" * 257: "x"}, {"A": "x" * 32769}, {f"V{i}": "" for i in range(257)},
    {f"V{i}": "x" * 30000 for i in range(5)},  # each value fits, the env as a whole does not
]


@pytest.mark.parametrize("env", BAD_ENVS, ids=range(len(BAD_ENVS)))
def test_a_bad_claim_env_is_refused_at_create_before_the_backend(env):
    backend = FakeBackend()
    with TestClient(create_app(backend, TOKEN)) as http:
        assert_error(http.post("/v1/claims", json={"pool": "python", "env": env}, headers=AUTH), 400, "invalid")
    assert backend.calls == []


def test_good_claim_env_passes():
    backend = FakeBackend()
    env = {"GREETING": "hello", "-odd.name_1": "", "MULTI": "line\nline", "CORRAL_SANDBOX_NOTE": "not execd's"}
    with TestClient(create_app(backend, TOKEN)) as http:
        assert http.post("/v1/claims", json={"pool": "python", "env": env}, headers=AUTH).status_code == 201
    assert backend.calls[0][1].env == env


def test_the_reserved_prefix_is_execds():
    from corral.execd.settings import ENV_PREFIX

    assert EXECD_ENV_PREFIX == ENV_PREFIX


def test_the_resource_model_refuses_the_same_env_for_claims_made_with_kubectl():
    from pydantic import ValidationError

    for env in ([{"name": "CORRAL_EXECD_ROOTS", "value": "/"}], [{"name": "A", "value": "\x00"}],
                [{"name": "A=B", "value": ""}], [{"name": "", "value": ""}]):
        with pytest.raises(ValidationError):
            SandboxClaimSpec.model_validate({"poolRef": {"name": "p"}, "env": env})
    from corral.api.crd import crd_files

    schema = next(v for k, v in crd_files().items() if "sandboxclaims" in k)
    assert "!self.matches('^(?i:CORRAL_EXECD_)')" in schema.replace("''", "'") and "^[^\\x00]*$" in schema


@pytest.mark.parametrize("ttl", [True, False, "60", 60.5, 0, -1, 30 * 86400 + 1, 10 ** 30, None])
def test_renew_takes_a_strict_bounded_integer(ttl):
    backend = FakeBackend()
    with TestClient(create_app(backend, TOKEN)) as http:
        assert_error(http.post("/v1/claims/c1/renew", json={"ttlSeconds": ttl}, headers=AUTH), 400, "invalid")
        r = http.post("/v1/claims/c1/renew", json={"ttlSeconds": 60}, headers=AUTH)
        assert r.status_code == 200
    assert backend.calls == [("renew", 60)]


@pytest.mark.parametrize("body", [
    {"pool": "python", "ttlSeconds": True}, {"pool": "python", "timeoutSeconds": True},
    {"pool": "python", "timeoutSeconds": "1e309"}, {"pool": "a/../b"}, {"pool": "x" * 254}, {"pool": "py\x00"},
    {"pool": ""}, {"pool": "python", "name": "n" * 64}, {"pool": "python", "name": "a\x00"},
    {"pool": "python", "snapshot": "BAD REF"}, {"pool": "python", "snapshot": "img:\u0663"},
    {"pool": "python", "snapshot": "img@sha256:zz"}, {"pool": "python", "snapshot": "i" * 600},
    [], "python", None,
])
def test_malformed_create_bodies_are_400_before_the_backend(body):
    backend = FakeBackend()
    with TestClient(create_app(backend, TOKEN)) as http:
        assert_error(http.post("/v1/claims", json=body, headers=AUTH), 400, "invalid")
        assert_error(http.post("/v1/claims/c1/snapshot", json={"tag": "a:b\x00"}, headers=AUTH), 400, "invalid")
    assert backend.calls == []


@pytest.mark.parametrize("path", [
    "/v1/claims/" + "n" * 254, "/v1/claims/a%00b", "/v1/claims/a%0ab", "/v1/claims/Upper", "/v1/claims/-x",
    "/v1/claims/a%00b/renew", "/v1/claims/" + "n" * 300 + "/execd/files", "/v1/claims/c1/execd/files%00x",
    "/v1/claims/c1/execd/a%01b", "/v1/claims?pool=" + "p" * 300, "/v1/claims?pool=a%00",
])
def test_bad_names_and_paths_are_400_and_never_reach_the_backend(path):
    backend = FakeBackend()
    with TestClient(create_app(backend, TOKEN)) as http:
        method = "POST" if path.endswith("renew") else "GET"
        assert_error(http.request(method, path, json={"ttlSeconds": 60}, headers=AUTH), 400, "invalid")
        # A line break in a proxied path matches no route (Starlette's path parameters stop at one).
        assert_error(http.get("/v1/claims/c1/execd/a%0d%0aInjected:%20yes", headers=AUTH), 404, "not_found")
    assert backend.calls == []


def test_a_websocket_with_a_bad_name_or_path_is_denied_before_the_backend():
    backend = FakeBackend()
    with TestClient(create_app(backend, TOKEN)) as http:
        for path in ("/v1/claims/" + "n" * 300 + "/execd/pty", "/v1/claims/c1/execd/pty%00"):
            with pytest.raises(WebSocketDenialResponse) as denied:
                with http.websocket_connect(path, headers=AUTH):
                    pass
            assert_error(denied.value, 400, "invalid")
    assert backend.calls == []


class DockerLikeError(Exception):  # docker.errors.APIError's shape: a status_code and the engine's text
    status_code = 400


@pytest.mark.parametrize("exc, status", [
    (OSError(errno.ENAMETOOLONG, "File name too long"), 400), (OSError(errno.EINVAL, "Invalid argument"), 400),
    (ValueError("embedded null byte"), 400), (UnicodeEncodeError("ascii", "é", 0, 1, "no"), 400),
    (httpx.InvalidURL("Invalid non-printable ASCII character in URL"), 400),
    (DockerLikeError('invalid reference format: repository name (library/X) must be lowercase'), 400),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), 503),
])
def test_what_a_backend_raises_for_bad_input_is_a_4xx_in_the_error_shape(exc, status):
    with TestClient(create_app(FakeBackend(fail=exc), TOKEN), raise_server_exceptions=False) as http:
        for r in (http.post("/v1/claims", json={"pool": "python"}, headers=AUTH),
                  http.get("/v1/claims/c1", headers=AUTH), http.get("/v1/claims/c1/execd/files", headers=AUTH)):
            body = assert_error(r, status)
            assert "lowercase" not in body["message"]  # the engine's own text stays in the log


def test_an_unexpected_error_is_a_500_that_names_no_internals():
    with TestClient(create_app(FakeBackend(fail=RuntimeError("secret /var/lib/corral detail")), TOKEN),
                    raise_server_exceptions=False) as http:
        body = assert_error(http.get("/v1/claims/c1", headers=AUTH), 500, "internal")
        assert "RuntimeError" in body["message"] and "secret" not in body["message"]
    with TestClient(create_app(FakeBackend(fail=NotFound("no claim named 'c1'")), TOKEN)) as http:
        assert_error(http.get("/v1/claims/c1", headers=AUTH), 404, "not_found")


# --- the Kubernetes mode's server serves the same guarded app ----------------------------------------------------
def kube_server_app() -> tuple[Any, list[dict[str, Any]]]:
    from corral.operator.cache import Cache
    from corral.operator.claimsapi.kube_backend import KubeBackend
    from corral.operator.claimsapi.kube_server import ApiSettings, _Server
    from corral.operator.leadership import Leadership

    created: list[dict[str, Any]] = []

    async def create(manifest: dict[str, Any]) -> dict[str, Any]:
        created.append(manifest)
        meta = {**manifest["metadata"], "uid": "u1", "creationTimestamp": "2026-01-02T03:04:05Z"}
        return {**manifest, "metadata": meta}

    cache = Cache()
    cache._idx = {"warmpools_idx": {("ns", "python"): [{"metadata": {"name": "python"},
                                                         "spec": {"templateRef": {"name": "python"}}}]},
                  "templates_idx": {("ns", "python"): [{"metadata": {"name": "python"}, "spec": {}}]}}
    cache.bound_at = 1.0
    ctx = SimpleNamespace(cache=cache, leadership=Leadership(), kube=SimpleNamespace(create=create))
    server = _Server(KubeBackend(ctx, "ns"), ApiSettings(token=TOKEN, host="127.0.0.1", port=7780, namespace="ns"))
    return server.server.config.app, created


def test_kubernetes_mode_authenticates_before_the_body_and_caps_it():
    app, created = kube_server_app()
    status, body, calls = call_asgi(app, "POST", "/v1/claims", {"content-type": "application/json"}, chunks=32)
    assert (status, body["code"], calls) == (401, "unauthorized", 0)
    status, body, calls = call_asgi(app, "POST", "/v1/claims", AUTH, chunks=32)
    assert (status, body["code"]) == (413, "too_large") and calls <= 2
    assert created == []


def test_kubernetes_mode_takes_curls_body_and_refuses_bad_env_before_creating_a_claim():
    app, created = kube_server_app()
    with TestClient(app, base_url="http://localhost:7780") as http:
        r = http.post("/v1/claims", content=b'{"pool": "python", "timeoutSeconds": 0}', headers=CURL)
        assert r.status_code == 202 and r.json()["phase"] == "Pending", r.text
        for env in ({"CORRAL_EXECD_ROOTS": "/"}, {"A=B": "x"}, {"A": "\x00"}):
            r = http.post("/v1/claims", json={"pool": "python", "env": env, "timeoutSeconds": 0}, headers=AUTH)
            assert_error(r, 400, "invalid")
        assert_error(http.post("/v1/claims/c/renew", json={"ttlSeconds": True}, headers=AUTH), 400, "invalid")
        assert_error(http.get("/v1/claims/a%00b", headers=AUTH), 400, "invalid")
    assert len(created) == 1 and created[0]["spec"]["poolRef"] == {"kind": "WarmPool", "name": "python"}
