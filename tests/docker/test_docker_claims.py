"""docker tier: the Docker runtime's claims on a real engine: warm and cold claims, env injection, the proxy,
hardening, auth and the error shape, pause/resume, snapshot, TTL and renew, release by pool policy."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from corral.operator.docker import desired as df

pytestmark = pytest.mark.docker


def run(http: httpx.Client, claim: str, command: str, **kw) -> dict:
    r = http.post(f"/v1/claims/{claim}/execd/v1/command", json={"command": command, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_warm_then_cold_claim_runs_commands_with_env(make_operator):
    op = make_operator(warm={"python": 1})
    op.wait_idle("python", 1)
    with op.http() as http:
        r = http.post("/v1/claims", json={"pool": "python", "name": "first", "env": {"GREETING": "hi"}})
        assert r.status_code == 201, r.text
        first = r.json()
        assert first["phase"] == "Ready" and first["launchType"] == "warm"
        out = run(http, "first", "echo $GREETING from $(python3 -c 'import sys; print(sys.version_info[0])'); id -u")
        assert out["stdout"] == "hi from 3\n1000\n"
        # The pool is empty now (its replacement may still be starting): a second claim is cold or warm, never
        # the same sandbox.
        second = http.post("/v1/claims", json={"pool": "python", "env": {"GREETING": "yo"}}).json()
        assert second["phase"] == "Ready" and second["sandbox"]["name"] != first["sandbox"]["name"]
        assert run(http, second["name"], "echo $GREETING")["stdout"] == "yo\n"
        # The API lists both, a retry of the same name returns the same claim.
        names = {c["name"] for c in http.get("/v1/claims").json()["items"]}
        assert {"first", second["name"]} <= names
        again = http.post("/v1/claims", json={"pool": "python", "name": "first"})
        assert again.status_code == 201 and again.json()["sandbox"] == first["sandbox"]
        # Release of a WarmPool claim deletes its container; the pool stays at 1 idle.
        assert http.delete("/v1/claims/first").status_code == 204
        assert not op.containers(**{"corral.dev/sandbox": first["sandbox"]["name"]})
        assert http.get("/v1/claims/first").status_code == 404
        op.wait_idle("python", 1)


def test_auth_and_error_shape(make_operator):
    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    anon = httpx.Client(base_url=op.url, timeout=30)
    for method, path in [("POST", "/v1/claims"), ("GET", "/v1/claims"), ("GET", "/v1/claims/x"),
                         ("DELETE", "/v1/claims/x"), ("POST", "/v1/claims/x/pause"),
                         ("POST", "/v1/claims/x/execd/v1/command")]:
        r = anon.request(method, path, json={})
        assert r.status_code == 401, (method, path, r.text)
        assert set(r.json()) == {"code", "message"} and r.json()["code"] == "unauthorized"
    bad = anon.get("/v1/claims", headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401
    with op.http() as http:
        for r, status, code in [
            (http.get("/v1/claims/nope"), 404, "not_found"),
            (http.post("/v1/claims", json={"pool": "nope"}), 404, "not_found"),
            (http.post("/v1/claims", json={"pool": "shell", "bogus": 1}), 400, "invalid"),
            (http.post("/v1/claims", json={"pool": "shell", "env": {"A": "b"}}), 400, "invalid"),  # Disallowed
        ]:
            assert r.status_code == status and r.json()["code"] == code, r.text
            assert set(r.json()) == {"code", "message"}


def test_sandbox_container_is_hardened(make_operator):
    op = make_operator(warm={"python": 1, "shell": 1}, internal=("shell",))
    op.wait_idle("python", 1)
    op.wait_idle("shell", 1)
    for c in op.containers():
        c.reload()
        hc, cfg = c.attrs["HostConfig"], c.attrs["Config"]
        assert hc["CapDrop"] == ["ALL"] and not hc.get("CapAdd"), c.name
        assert "no-new-privileges" in hc["SecurityOpt"]
        assert hc["PidsLimit"] and hc["PidsLimit"] > 0
        assert hc["Memory"] > 0 and hc["MemorySwap"] == hc["Memory"]
        assert hc["NanoCpus"] > 0
        assert hc["Init"] is True
        assert not hc["Privileged"]
        assert cfg["User"] and not cfg["User"].startswith("0")
        for binding in (hc.get("PortBindings") or {}).values():
            assert all(b["HostIp"] == "127.0.0.1" for b in binding), binding
        for binding in (c.attrs["NetworkSettings"]["Ports"] or {}).values():
            assert all(b["HostIp"] == "127.0.0.1" for b in binding or []), binding
        mounts = {m["Destination"]: m for m in c.attrs["Mounts"]}
        assert mounts["/opt/corral/execd"]["RW"] is False
        # The token is no part of the container's config: execd gets it as a file it deletes once read.
        assert not [e for e in cfg["Env"] if e.startswith("CORRAL_EXECD_TOKEN=")]
        assert "CORRAL_EXECD_TOKEN_FILE=/.corral-execd/token" in cfg["Env"]
    with op.http() as http:
        shell = http.post("/v1/claims", json={"pool": "shell"}).json()
        out = run(http, shell["name"], "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; id -u; "
                                       "env | grep -c CORRAL_EXECD || true; ls -ld /workspace")
        assert "CapEff:\t0000000000000000" in out["stdout"] and "NoNewPrivs:\t1" in out["stdout"]
        lines = out["stdout"].splitlines()
        assert lines[2] == "1000" and lines[3] == "0"
        # The shell template's network is internal: no route out, and no port published at all.
        assert not [p for p in op.containers(**{"corral.dev/pool": "shell"})[0].attrs["NetworkSettings"]["Ports"]
                    .values() if p]
        # The sandbox cannot write the execd bundle.
        assert run(http, shell["name"], "touch /opt/corral/execd/x")["exit_code"] != 0


def test_pause_keeps_memory_and_snapshot_starts_a_new_sandbox_with_the_file(make_operator):
    op = make_operator(warm={"python": 1})
    op.wait_idle("python", 1)
    with op.http() as http:
        c = http.post("/v1/claims", json={"pool": "python", "name": "worker"}).json()
        assert c["phase"] == "Ready"
        counter = ("import time, os\ni = 0\nwhile True:\n    i += 1\n"
                   "    open('/tmp/count.tmp', 'w').write(f'{os.getpid()} {i}'); os.replace('/tmp/count.tmp', "
                   "'/tmp/count')\n    time.sleep(0.05)\n")
        up = http.post("/v1/claims/worker/execd/v1/files/upload", params={"path": "/tmp/counter.py"},
                       content=counter.encode())
        assert up.status_code == 200, up.text
        bg = http.post("/v1/claims/worker/execd/v1/command", json={"argv": ["python3", "/tmp/counter.py"],
                                                                   "background": True})
        assert bg.status_code == 202, bg.text

        def read() -> tuple[int, int]:
            deadline = time.monotonic() + 30
            while True:
                out = run(http, "worker", "cat /tmp/count 2>/dev/null || true")["stdout"].split()
                if len(out) == 2:
                    return int(out[0]), int(out[1])
                assert time.monotonic() < deadline
                time.sleep(0.1)

        pid, before = read()
        while before < 5:
            pid, before = read()
        assert http.post("/v1/claims/worker/pause").json()["phase"] == "Paused"
        frozen = op.client.api.inspect_container(c["sandbox"]["name"])["State"]
        assert frozen["Paused"] is True
        # While paused the sandbox's execd is frozen too: the proxy does not reach it (the claim is not Ready).
        assert http.post("/v1/claims/worker/execd/v1/command", json={"command": "true"}).status_code == 409
        time.sleep(1.0)
        assert http.post("/v1/claims/worker/resume").json()["phase"] == "Ready"
        pid_after, after = read()
        assert pid_after == pid and after >= before  # the same process, its counter continued (not restarted)
        deadline = time.monotonic() + 30
        while read()[1] <= after:
            assert time.monotonic() < deadline
            time.sleep(0.1)

        run(http, "worker", "echo snapshot-content > /workspace/note.txt && mkdir -p /home/x && echo 2 > /tmp/t2")
        snap = http.post("/v1/claims/worker/snapshot", json={"tag": "worker-1"})
        assert snap.status_code == 200, snap.text
        image = snap.json()["image"]
        assert image == f"corral-snapshot/{op.stack}:worker-1"
        cfg = op.client.images.get(image).attrs["Config"]
        assert [e for e in cfg["Env"] if e.startswith("CORRAL_EXECD_TOKEN=")] == ["CORRAL_EXECD_TOKEN="]  # blanked
        restored = http.post("/v1/claims", json={"pool": "python", "snapshot": image, "name": "restored"}).json()
        assert restored["phase"] == "Ready" and restored["launchType"] == "cold", restored
        assert run(http, "restored", "cat /workspace/note.txt")["stdout"] == "snapshot-content\n"
        assert http.post("/v1/claims", json={"pool": "python", "snapshot": "nope:1"}).status_code == 400
        # A pool can start from the snapshot too: a template whose image is the snapshot, added to the pools file
        # (the operator reloads it on SIGHUP, as DockerStack makes it do).
        desired = op.desired.model_copy(deep=True)
        desired.templates.append(desired.template("python").model_copy(update={"name": "fromsnap", "image": image}))
        desired.warm_pools.append(df.warm_pool(name="fromsnap", template="fromsnap", replicas=1))
        op.reload(desired)
        op.wait_idle("fromsnap", 1)
        pooled = http.post("/v1/claims", json={"pool": "fromsnap"}).json()
        assert pooled["launchType"] == "warm"
        assert run(http, pooled["name"], "cat /workspace/note.txt")["stdout"] == "snapshot-content\n"


def test_ttl_expiry_and_renew(make_operator):
    op = make_operator(warm={"shell": 2})
    op.wait_idle("shell", 2)
    with op.http() as http:
        short = http.post("/v1/claims", json={"pool": "shell", "ttlSeconds": 2}).json()
        kept = http.post("/v1/claims", json={"pool": "shell", "ttlSeconds": 2}).json()
        renewed = http.post(f"/v1/claims/{kept['name']}/renew", json={"ttlSeconds": 600}).json()
        assert renewed["expiresAt"] > kept["expiresAt"]
        deadline = time.monotonic() + 60
        while op.containers(**{"corral.dev/sandbox": short["sandbox"]["name"]}):
            assert time.monotonic() < deadline, "expired claim's container still exists"
            time.sleep(0.2)
        gone = http.get(f"/v1/claims/{short['name']}").json()
        assert gone["phase"] == "Expired" and gone["sandbox"] is None
        assert http.post(f"/v1/claims/{short['name']}/execd/v1/command", json={"command": "true"}).status_code == 409
        assert http.get(f"/v1/claims/{kept['name']}").json()["phase"] == "Ready"
        assert op.containers(**{"corral.dev/sandbox": kept["sandbox"]["name"]})


def test_pool_recycles_by_strategy_and_respects_pool_max(make_operator):
    pools = [df.pool(name="shell-noop", template="shell", buffer_min=1, buffer_max=1, pool_max=2,
                      recycle_strategy="Noop"),
             df.pool(name="shell-restart", template="shell", buffer_min=1, buffer_max=1, pool_max=3,
                      recycle_strategy="Restart"),
             df.pool(name="shell-delete", template="shell", buffer_min=1, buffer_max=1, pool_max=3)]
    op = make_operator(pools=pools)
    for p in pools:
        op.wait_idle(p.metadata.name, 1)
    with op.http() as http:
        for pool, same in [("shell-noop", True), ("shell-restart", True), ("shell-delete", False)]:
            c = http.post("/v1/claims", json={"pool": pool}).json()
            assert c["launchType"] == "warm", c
            name = c["sandbox"]["name"]
            run(http, c["name"], "sleep 1000 >/dev/null 2>&1 &", background=False)
            assert http.delete(f"/v1/claims/{c['name']}").status_code == 204
            assert bool(op.containers(**{"corral.dev/sandbox": name})) is same, pool
            op.wait_idle(pool, 1)  # a recycled sandbox is idle again; bufferMax 1 trims the surplus
        # Restart recycling gave a fresh process tree: the sleeper is gone.
        again = http.post("/v1/claims", json={"pool": "shell-restart"}).json()
        assert "sleep 1000" not in run(http, again["name"], "ps -eo args || true")["stdout"]
        # poolMax 2: two claims fit, a third is refused with a conflict.
        a = http.post("/v1/claims", json={"pool": "shell-noop"})
        op.wait_idle("shell-noop", 1)  # the buffer refills: total 2 = poolMax
        b = http.post("/v1/claims", json={"pool": "shell-noop"})
        assert a.status_code == 201 and b.status_code == 201
        full = http.post("/v1/claims", json={"pool": "shell-noop"})
        assert full.status_code == 409 and full.json()["code"] == "conflict"


async def test_pty_over_the_claims_api_websocket(make_operator):
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    async with httpx.AsyncClient(base_url=op.url, headers=op.headers, timeout=60) as http:
        c = (await http.post("/v1/claims", json={"pool": "shell", "name": "term"})).json()
        assert c["phase"] == "Ready"
        pty = await http.post("/v1/claims/term/execd/v1/pty", json={"command": "sh", "cols": 80, "rows": 24})
        assert pty.status_code in (200, 201), pty.text
        ws_url = f"ws://127.0.0.1:{op.port}/v1/claims/term/execd/v1/pty/{pty.json()['id']}/ws"
        try:
            await connect(ws_url, open_timeout=30)
            raise AssertionError("a WebSocket without the token was accepted")
        except InvalidStatus as exc:
            assert exc.response.status_code in (401, 403)
        async with connect(ws_url, additional_headers=op.headers, open_timeout=30) as ws:
            await ws.send(b"\x00echo hi-$((40+2))\n")
            seen = b""
            deadline = time.monotonic() + 30
            while b"hi-42" not in seen:
                assert time.monotonic() < deadline, seen
                frame = await asyncio.wait_for(ws.recv(), 30)
                if isinstance(frame, bytes) and frame[:1] in (b"\x01", b"\x03"):
                    seen += frame[1:]
