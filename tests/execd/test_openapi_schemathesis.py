"""execd tier: execd against its committed OpenAPI document (execd/openapi.json), property-based (schemathesis,
issue 15), on a real daemon on loopback: for valid and invalid input no 5xx, status codes, content types and bodies
as documented; every protected operation refuses a missing or a wrong token (401 in the `{code, message}` shape).

What the generated requests may do is kept harmless: the daemon's roots are this test's directories, a command line
or argv that is well-formed is replaced by `echo` (a generated string could be any program), and the proxy's port, when
valid, is a local upstream this test runs (answering 204), so nothing else on 127.0.0.1 is reached. The PTY
WebSocket is not an HTTP exchange and is left to test_pty.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
import schemathesis
from execdutil import Daemon, launch, stop
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from corral.execd import openapi

DOC = json.loads(openapi.DOCUMENT.read_text())
SKIP_PATHS = {"/v1/pty/{id}/ws"}
schema = schemathesis.openapi.from_path(openapi.DOCUMENT).exclude(path=list(SKIP_PATHS))
schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                with_security_parameters=False, allow_extra_parameters=False)
OPERATIONS = [(method.upper(), path) for path, item in DOC["paths"].items() for method, op in item.items()
              if method in ("get", "put", "post", "delete", "patch") and op.get("security") != []]


class _Upstream(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(204)
        self.end_headers()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = launch(tmp_path_factory.mktemp("execd-schemathesis"))
    yield d
    stop(d)


def harmless(case, upstream: int) -> None:
    body = case.body
    if isinstance(body, dict):
        if isinstance(body.get("command"), str):
            body["command"] = "echo schemathesis"
        argv = body.get("argv")
        if isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv):
            body["argv"] = ["echo", "schemathesis"]
    port = (case.path_parameters or {}).get("port")
    if isinstance(port, str) and port.isascii() and port.isdigit():  # the coverage phase sends ports as strings
        port = int(port)
    if isinstance(port, int) and not isinstance(port, bool) and 1 <= port <= 65535:
        case.path_parameters["port"] = upstream


# Not checked: that every schema-valid request succeeds. execd's rules span fields and the machine (exactly one of
# command or argv, a user that exists, a path that exists and stays inside the roots), which the document states in
# words; such requests get a documented 4xx, which the other checks hold to the document.
# Every other check runs on every operation: no exceptions by route (there were four, see the CHANGELOG).
EXCLUDED = [positive_data_acceptance]


@schema.parametrize()
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_execd_conforms_to_its_document(case, fuzzed: Daemon, upstream: int):
    harmless(case, upstream)
    response = case.call_and_validate(base_url=fuzzed.url, headers=fuzzed.headers, timeout=30,
                                      excluded_checks=EXCLUDED)
    assert response.status_code < 500, response.text
    if case.operation.path.startswith("/v1/proxy/"):  # the upstream's 204 or the proxy's 400 (never 404: no route)
        assert response.status_code in (204, 400, 405), response.text  # 405: a method the proxy does not serve
        if response.status_code != 204 and response.request.method != "HEAD":
            assert set(response.json()) == {"code", "message"}, response.text


def test_the_document_declares_the_token_on_every_operation_but_health():
    assert set(DOC["components"]["securitySchemes"]) == {"bearer", "accessToken"}
    open_ops = [(m, p) for p, item in DOC["paths"].items() for m, op in item.items() if op.get("security") == []]
    assert open_ops == [("get", "/v1/health")]
    assert len(OPERATIONS) > 30


@pytest.mark.parametrize("method,path", OPERATIONS)
def test_every_protected_operation_refuses_a_missing_or_wrong_token(method: str, path: str, fuzzed: Daemon):
    url = path.replace("{id}", "1").replace("{port}", str(fuzzed.port)).replace("{path}", "x")
    with httpx.Client(base_url=fuzzed.url, timeout=30) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": fuzzed.token},
                        {"X-EXECD-ACCESS-TOKEN": "wrong"}, {"Authorization": f"Basic {fuzzed.token}"}):
            r = http.request(method, url, headers=headers, json={} if method in ("POST", "PUT", "PATCH") else None)
            assert r.status_code == 401, (method, path, headers, r.status_code, r.text)
            body = r.json()
            assert set(body) == {"code", "message"} and body["message"], body
