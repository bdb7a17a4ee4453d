"""unit: the SDK's pure pieces: error mapping, retry policy (on httpx.MockTransport: no network), claim waiting,
SSE and PTY frame parsing, config precedence and the config file, the CLI's cp argument parsing."""

from __future__ import annotations

import json
import os
import stat
import sys
from datetime import UTC
from pathlib import Path

import httpx
import pytest

from corral.client import _ops as ops
from corral.client import config as cfg
from corral.client.cli import _split, app
from corral.client.errors import (
    ClaimFailed,
    Conflict,
    CorralError,
    InvalidRequest,
    NotFound,
    NotReady,
    ServerError,
    TransportError,
    Unauthorized,
    Unavailable,
    error_from,
)
from corral.client.sync import Client

CLAIM = {"name": "c1", "pool": "python", "poolKind": "WarmPool", "phase": "Ready", "launchType": "warm",
         "sandbox": {"name": "sbx-1", "endpoint": "/v1/claims/c1/execd"}, "created": "2026-01-01T00:00:00Z"}


def client(handler, **kw) -> Client:
    return Client("http://api.test", "tok", transport=httpx.MockTransport(handler),
                  retry=ops.Retry(attempts=3, backoff=0.001), **kw)


def test_errors_carry_the_servers_code_and_message():
    e = error_from(404, b'{"code": "not_found", "message": "no claim named \'x\'"}', method="GET", path="/v1/claims/x")
    assert isinstance(e, NotFound) and e.code == "not_found" and e.message == "no claim named 'x'" and e.status == 404
    assert "no claim named 'x'" in str(e) and "GET /v1/claims/x" in str(e)
    assert isinstance(error_from(401, b'{"code":"unauthorized","message":"m"}'), Unauthorized)
    assert isinstance(error_from(400, b'{"code":"invalid","message":"m"}'), InvalidRequest)
    assert isinstance(error_from(503, b'{"code":"unavailable","message":"m"}'), Unavailable)
    assert isinstance(error_from(502, b'{"code":"sandbox_unreachable","message":"m"}'), Unavailable)
    failed = error_from(400, b'{"code":"claim_failed","message":"env GREETING is not allowed by template py"}')
    assert isinstance(failed, ClaimFailed) and failed.status == 400 and "GREETING" in failed.message
    assert isinstance(error_from(503, b'{"code":"claim_failed","message":"m"}'), ClaimFailed)
    assert type(error_from(500, b"boom")) is ServerError and error_from(500, b"boom").message == "boom"
    # A 409 of the claims API about the claim's phase is NotReady (still a Conflict); execd's 409s are not.
    nr = error_from(409, b'{"code":"conflict","message":"claim w is Paused, not Ready"}')
    assert isinstance(nr, NotReady) and isinstance(nr, Conflict)
    exists = error_from(409, b'{"code":"exists","message":"/a exists (pass overwrite)"}')
    assert type(exists) is Conflict and exists.code == "exists"
    assert isinstance(error_from(409, b'{"code":"not_ready","message":"claim w is Bound"}'), NotReady)
    full = error_from(409, b'{"code":"conflict","message":"pool shell is at poolMax 2"}')
    assert type(full) is Conflict


def test_retry_policy_only_repeats_what_is_safe():
    r = ops.Retry(attempts=3, backoff=0.1)
    get, post = ops.get_claim("x"), ops.run("/b", {"command": "true"})
    assert get.idempotent and not post.idempotent
    refused = httpx.ConnectError("refused")
    dropped = httpx.ReadError("reset")
    assert r.on_error(post, 1, refused) is not None          # never reached the server: safe for anything
    assert r.on_error(post, 1, dropped) is None              # may have run: never re-sent
    assert r.on_error(get, 1, dropped) is not None
    assert r.on_error(get, 3, refused) is None               # attempts exhausted
    assert r.on_status(get, 1, 503) is not None and r.on_status(get, 1, 404) is None
    assert r.on_status(post, 1, 503) is None
    assert ops.create_claim(ops.m.ClaimRequest(name="n", pool="p")).idempotent  # named create = safe retry
    delays = [r.delay(i) for i in (1, 2, 3, 4)]
    assert all(0.05 <= d <= 0.1 * 2 ** (i - 1) for i, d in zip((1, 2, 3, 4), delays, strict=True))


def test_idempotent_calls_are_retried_and_commands_are_not():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.method} {request.url.path}")
        assert request.headers["authorization"] == "Bearer tok"
        if len([s for s in seen if s.startswith("GET")]) < 3 and request.method == "GET":
            return httpx.Response(503, json={"code": "unavailable", "message": "busy"})
        if request.method == "POST":
            return httpx.Response(503, json={"code": "unavailable", "message": "execd busy"})
        return httpx.Response(200, json=CLAIM)

    with client(handler) as c:
        sbx = c.sandbox("c1")
        assert sbx.name == "c1" and sbx.claim.sandbox.name == "sbx-1"
        assert seen.count("GET /v1/claims/c1") == 3
        with pytest.raises(Unavailable) as exc:
            sbx.commands.run("true")
        assert exc.value.message == "execd busy"
        assert seen.count("POST /v1/claims/c1/execd/v1/command") == 1


def test_transport_errors_after_retries_are_typed():
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        raise httpx.ConnectError("connection refused", request=request)

    with client(handler) as c, pytest.raises(TransportError) as exc:
        c.claims()
    assert len(calls) == 3 and "refused" in exc.value.message


def test_claim_waits_for_ready_and_fails_typed():
    phases = iter(["Pending", "Pending", "Ready"])
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            bodies.append(json.loads(request.content))
            return httpx.Response(202, json={**CLAIM, "name": bodies[-1]["name"], "phase": "Pending", "sandbox": None})
        return httpx.Response(200, json={**CLAIM, "phase": next(phases)})

    with client(handler) as c:
        sbx = c.claim("python", env={"A": "b"}, ttl=60)
        assert sbx.claim.phase == "Ready"
    body = bodies[0]
    assert body["pool"] == "python" and body["env"] == {"A": "b"} and body["ttlSeconds"] == 60
    assert body["name"].startswith("c-")  # named by the client: a retried create is the same claim

    def failing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(201, json={**CLAIM, "phase": "Failed", "message": "sandbox container exited"})

    with client(failing) as c, pytest.raises(ClaimFailed) as exc:
        c.claim("python")
    assert exc.value.message == "sandbox container exited" and exc.value.claim.phase == "Failed"

    released = []

    def stuck(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            released.append(request.url.path)
            return httpx.Response(204)
        return httpx.Response(202 if request.method == "POST" else 200, json={**CLAIM, "phase": "Pending"})

    with client(stuck) as c, pytest.raises(ClaimFailed, match="not Ready within"):
        c.claim("python", name="c1", timeout=0.3)
    assert released == ["/v1/claims/c1"]  # a claim that timed out is not left behind
    with client(stuck) as c, pytest.raises(InvalidRequest):
        c.claim("python", name="Not A DNS Label")


def test_sse_parser_and_stream_events():
    sse = ops.SSE()
    lines = ["event: start", 'data: {"id": "a", "pid": 7}', "", ": comment", "id: 1", "event: stdout",
             'data: {"seq": 1, "stream": "stdout", "data": "aGk=", "encoding": "base64"}', "",
             "event: exit", 'data: {"exit_code": 3, "signal": null}', ""]
    events = [e for line in lines if (e := sse.feed(line))]
    assert [e[0] for e in events] == ["start", "stdout", "exit"]
    kind, out = ops.stream_event(*events[1])
    assert kind == "output" and out.data == b"hi" and out.stream == "stdout"
    kind, ex = ops.stream_event(*events[2])
    assert kind == "exit" and ex.exit_code == 3


def test_pty_frames():
    assert ops.stdin_frame("ls\n") == b"\x00ls\n"
    assert json.loads(ops.resize_frame(120, 40)) == {"type": "resize", "cols": 120, "rows": 40}
    assert ops.parse_frame(b"\x01abc") == ("output", b"abc")
    assert ops.parse_frame(b"\x03old") == ("output", b"old")
    kind, msg = ops.parse_frame('{"type": "exit", "exit_code": 5, "signal": null}')
    assert kind == "exit" and msg["exit_code"] == 5
    assert ops.ws_url("https://h:1/", "/v1/x") == "wss://h:1/v1/x"
    assert ops.ws_url("http://127.0.0.1:7780", "/v1/x") == "ws://127.0.0.1:7780/v1/x"


def test_command_results_decode_binary_output():
    from corral.client.models import CommandResult

    r = CommandResult.from_wire({"id": "x", "exit_code": 0, "timed_out": False, "interrupted": False,
                                 "duration_ms": 1, "stdout": "//4=", "stdout_encoding": "base64",
                                 "stderr": "é", "stderr_encoding": "utf-8", "truncated": False})
    assert r.stdout_bytes == b"\xff\xfe" and r.stderr == "é" and r.ok
    assert ops.command_body(["ls", "-l"], cwd=None, env=None, timeout=None, user=None) == {"argv": ["ls", "-l"]}
    assert ops.command_body("ls", cwd="/w", env={"A": "1"}, timeout=5, user=None, background=True) == {
        "command": "ls", "cwd": "/w", "timeout": 5, "env": {"A": "1"}, "background": True}


def test_config_precedence_and_file(tmp_path, monkeypatch):
    path = tmp_path / "corral" / "config.toml"
    monkeypatch.setenv("CORRAL_CONFIG", str(path))
    monkeypatch.delenv("CORRAL_API_URL", raising=False)
    monkeypatch.delenv("CORRAL_API_TOKEN", raising=False)
    with pytest.raises(cfg.ConfigError, match="no API token"):
        cfg.resolve()
    cfg.write_file("http://file:1/", 'se"cret\\x', path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    s = cfg.resolve()
    assert (s.url, s.token, s.source) == ("http://file:1", 'se"cret\\x', str(path))
    monkeypatch.setenv("CORRAL_API_URL", "http://env:2")
    assert cfg.resolve().url == "http://env:2" and cfg.resolve().token == 'se"cret\\x'
    monkeypatch.setenv("CORRAL_API_TOKEN", "envtok")
    assert cfg.resolve().token == "envtok"
    assert cfg.resolve("http://arg:3", "argtok") == cfg.Settings("http://arg:3", "argtok", "arguments")
    path.write_text("api_url = [")
    monkeypatch.delenv("CORRAL_API_TOKEN")
    with pytest.raises(cfg.ConfigError, match="not valid TOML"):
        cfg.resolve()


def test_config_pulumi_writes_the_file_from_stack_outputs(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    fake = tmp_path / "pulumi"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nassert sys.argv[1:] == ['stack', 'output', '--json', "
                    f"'--show-secrets', '--stack', 'local'], sys.argv\n"
                    "print(json.dumps({'mode': 'docker', 'apiUrl': 'http://127.0.0.1:7780', 'apiToken': 'T0K'}))\n")
    fake.chmod(0o755)
    path = tmp_path / "config.toml"
    monkeypatch.setenv("CORRAL_CONFIG", str(path))
    monkeypatch.delenv("CORRAL_API_URL", raising=False)
    monkeypatch.delenv("CORRAL_API_TOKEN", raising=False)
    res = CliRunner().invoke(app, ["config", "pulumi", "--stack", "local", "--pulumi", str(fake)])
    assert res.exit_code == 0, res.output
    assert cfg.read_file(path) == {"api_url": "http://127.0.0.1:7780", "api_token": "T0K"}
    shown = CliRunner().invoke(app, ["config", "show"])
    assert "http://127.0.0.1:7780" in shown.output and "T0K" not in shown.output
    with pytest.raises(cfg.ConfigError, match=r"does not export apiUrl \(or apiEndpoint\) and apiToken"):
        cfg.from_pulumi_outputs({"mode": "kubernetes", "namespace": "x"}, "dev")
    kube = {"mode": "kubernetes", "apiEndpoint": "http://corral-api.corral-system.svc:7780", "apiToken": "K"}
    assert cfg.from_pulumi_outputs(kube, "dev") == ("http://corral-api.corral-system.svc:7780", "K")
    assert cfg.from_pulumi_outputs(kube, "dev", "http://127.0.0.1:7780") == ("http://127.0.0.1:7780", "K")


def test_cp_argument_forms():
    assert _split("sbx:/workspace/a") == ("sbx", "/workspace/a")
    assert _split("sbx:") == ("sbx", ".")
    assert _split("./a:b") == (None, "./a:b")
    assert _split("/tmp/x:y") == (None, "/tmp/x:y")
    assert _split("dir/file") == (None, "dir/file")


def test_cli_errors_are_one_line_with_the_servers_message(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    monkeypatch.setenv("CORRAL_CONFIG", str(tmp_path / "none.toml"))
    monkeypatch.delenv("CORRAL_API_TOKEN", raising=False)
    res = CliRunner().invoke(app, ["ls"])
    assert res.exit_code == 1 and "no API token" in res.output
    assert isinstance(ClaimFailed("x"), CorralError) and Path(cfg.config_path()) == tmp_path / "none.toml"


def test_pools_route_lists_the_backends_pools_or_answers_501():
    from fastapi.testclient import TestClient

    from corral.operator.claimsapi import PoolStatus, create_app

    class Old:  # a backend written before list_pools existed
        pass

    class New:
        async def list_pools(self) -> list[PoolStatus]:
            return [PoolStatus(name="python", kind="WarmPool", template="python", desired=2, ready=1, idle=2,
                               allocated=3)]

    auth = {"Authorization": "Bearer t"}
    with TestClient(create_app(Old(), "t")) as http:  # type: ignore[arg-type]
        r = http.get("/v1/pools", headers=auth)
        assert r.status_code == 501 and r.json()["code"] == "not_implemented"
        assert http.get("/v1/pools").status_code == 401
    with TestClient(create_app(New(), "t")) as http:  # type: ignore[arg-type]
        r = http.get("/v1/pools", headers=auth)
        assert r.status_code == 200
        assert r.json() == {"items": [{"name": "python", "kind": "WarmPool", "template": "python", "desired": 2,
                                       "ready": 1, "idle": 2, "allocated": 3}]}
        def forward(request: httpx.Request) -> httpx.Response:
            r = http.request(request.method, request.url.path, headers=dict(request.headers))
            return httpx.Response(r.status_code, content=r.content, headers=r.headers)

        with Client("http://api.test", "t", transport=httpx.MockTransport(forward)) as c:  # the SDK parses it
            assert [(p.name, p.ready, p.allocated) for p in c.pools()] == [("python", 1, 3)]


class Leftovers:
    """A backend with one retained sandbox and one snapshot (what a Docker operator answers), recording removals;
    `kube=True` answers the snapshot routes as the Kubernetes backend does."""

    def __init__(self, kube: bool = False) -> None:
        from datetime import datetime

        from corral.operator.claimsapi import RetainedSandbox, Snapshot

        at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
        self.kube, self.removed = kube, []
        self.kept = {"kept-1": RetainedSandbox(name="kept-1", template="python", pool="python", claim="c1",
                                               retained_at=at, created=at, state="running", ready=True)}
        self.snaps = {"corral-snapshot/st:c1-1": Snapshot(claim="c1", image="corral-snapshot/st:c1-1",
                                                          id="sha256:" + "ab" * 32, created=at, size=3 << 20)}

    async def list_retained(self):
        return list(self.kept.values())

    async def delete_retained(self, name):
        from corral.operator.claimsapi import NotFound as Missing

        if self.kept.pop(name, None) is None:
            raise Missing(f"no retained sandbox named {name!r}")
        self.removed.append(name)

    def _no_snapshots(self):
        from corral.operator.claimsapi.kube_backend import NOT_SUPPORTED, NotSupported

        if self.kube:
            raise NotSupported(NOT_SUPPORTED["snapshot"])

    async def list_snapshots(self):
        self._no_snapshots()
        return list(self.snaps.values())

    async def delete_snapshot(self, ref):
        from corral.operator.claimsapi import Conflict as InUse
        from corral.operator.claimsapi import NotFound as Missing

        self._no_snapshots()
        if ref == "corral-snapshot/st:busy":
            raise InUse(f"snapshot {ref!r} is in use by corral-st-python-1")
        if self.snaps.pop(ref, None) is None:
            raise Missing(f"no snapshot {ref!r}")
        self.removed.append(ref)


@pytest.fixture
def leftovers(monkeypatch):
    """The CLI against the real claims app over `Leftovers` (the SDK's requests forwarded in process)."""
    from fastapi.testclient import TestClient

    from corral.client import cli
    from corral.operator.claimsapi import create_app

    state = {"backend": Leftovers()}

    def make(self, **kw):
        http = TestClient(create_app(state["backend"], "t"))

        def forward(request: httpx.Request) -> httpx.Response:
            r = http.request(request.method, request.url.raw_path.decode(), headers=dict(request.headers))
            return httpx.Response(r.status_code, content=r.content, headers=r.headers)

        return Client("http://api.test", "t", transport=httpx.MockTransport(forward), retry=ops.Retry(attempts=1))

    monkeypatch.setattr(cli.Ctx, "client", make)
    return state


def test_cli_lists_and_removes_retained_sandboxes(leftovers):
    from typer.testing import CliRunner

    backend = leftovers["backend"]
    res = CliRunner().invoke(app, ["retained", "ls"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    row = next(line for line in res.output.splitlines() if "kept-1" in line).split("│")
    assert [c.strip() for c in row[1:-1]][:4] == ["kept-1", "python", "python", "c1"]
    assert row[-3].strip() == "running" and row[-2].strip() == "yes"
    listed = json.loads(CliRunner().invoke(app, ["retained", "ls", "--json"]).output)
    assert listed[0]["name"] == "kept-1" and listed[0]["claim"] == "c1"
    assert listed[0]["retainedAt"] == "2026-01-02T03:04:05Z"
    res = CliRunner().invoke(app, ["retained", "rm", "kept-1", "nope"])
    assert res.exit_code == 1 and "removed kept-1" in res.output and "no retained sandbox nope" in res.output
    assert backend.removed == ["kept-1"]
    assert "kept-1" not in CliRunner().invoke(app, ["retained", "ls"]).output


def test_cli_lists_and_removes_snapshots_and_says_why_not(leftovers):
    from typer.testing import CliRunner

    backend = leftovers["backend"]
    res = CliRunner().invoke(app, ["snapshots", "ls"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    row = [c.strip() for c in next(x for x in res.output.splitlines() if "c1-1" in x).split("│")[1:-1]]
    assert row[0] == "corral-snapshot/st:c1-1" and row[1] == "c1" and row[3] == "3.0 MiB" and row[4] == "ab" * 6
    listed = json.loads(CliRunner().invoke(app, ["snapshots", "ls", "--json"]).output)
    assert listed == [{"claim": "c1", "image": "corral-snapshot/st:c1-1", "id": "sha256:" + "ab" * 32,
                       "created": "2026-01-02T03:04:05Z", "size": 3 << 20}]
    busy = CliRunner().invoke(app, ["snapshots", "rm", "corral-snapshot/st:busy"])
    assert busy.exit_code == 1 and "409 conflict" in busy.output and "in use by" in " ".join(busy.output.split())
    bad = CliRunner().invoke(app, ["snapshots", "rm", "Not A Ref"])  # refused at the edge, never reaches a backend
    assert bad.exit_code == 1 and "400 invalid" in bad.output
    res = CliRunner().invoke(app, ["snapshots", "rm", "corral-snapshot/st:c1-1", "corral-snapshot/st:gone"])
    assert res.exit_code == 1 and "removed corral-snapshot/st:c1-1" in res.output
    assert "no snapshot corral-snapshot/st:gone" in res.output
    assert backend.removed == ["corral-snapshot/st:c1-1"]  # the reference arrived whole, '/' and ':' included
    leftovers["backend"] = Leftovers(kube=True)  # Kubernetes: every snapshot route is not_supported
    for args in (["snapshots", "ls"], ["snapshots", "rm", "corral-snapshot/st:c1-1"]):
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 1 and "not_supported" in res.output and "Docker" in res.output, args
