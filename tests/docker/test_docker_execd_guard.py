"""docker tier: execd in a claimed sandbox survives being killed by the sandbox's own code, a sandbox whose execd
stays gone is reported and replaced (its claim never stays Ready; an idle one is found by the engine's health probe
and replaced before any claim), the execd token is in no environment the sandbox's code can read nor in the
container's config, and a recycled sandbox refuses its former claim's token."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from corral.operator.docker import desired as df
from corral.operator.docker import engine
from corral.operator.docker.store import Store
from corral.operator.docker.tokens import execd_token

pytestmark = pytest.mark.docker
PORT = 44772
# Finds execd's processes (supervisor and server): those whose program (argv[0]) is execd's binary.
EXECD_PIDS = ('for p in /proc/[0-9]*; do [ "$(tr "\\0" "\\n" < $p/cmdline 2>/dev/null | head -n1)" = '
              f'"{engine.EXECD_BIN}" ] && echo ${{p#/proc/}}; done')
BACK = 30.0  # deadline for execd to answer again (its supervisor waits 0.25 s; a loaded machine starts it slowly)


def run(http: httpx.Client, claim: str, command: str) -> dict:
    r = http.post(f"/v1/claims/{claim}/execd/v1/command", json={"command": command})
    assert r.status_code == 200, r.text
    return r.json()


def tokens(op, claim: str, sandbox: str) -> tuple[str, str]:
    """(the sandbox's idle token, i.e. what today's code derives from its name alone; the claim's token)."""
    store = Store(op.workdir / "state" / "corral.db")
    try:
        secret = bytes.fromhex(store.meta("token-secret", lambda: pytest.fail("no token secret")))
        return execd_token(secret, sandbox), execd_token(secret, sandbox, store.claim(claim))
    finally:
        store.close()


def execd_url(op, sandbox: str) -> str:
    c = op.containers(**{"corral.dev/sandbox": sandbox})[0]
    return f"http://{engine.address(c.attrs, f'corral-{op.stack}-shell', f'{PORT}/tcp')['ip']}:{PORT}"


def status(url: str, token: str) -> int:
    return httpx.get(f"{url}/v1/env", headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code


def test_claimed_sandbox_survives_kill_of_its_execd(make_operator):
    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    with op.http(timeout=30) as http:
        c = http.post("/v1/claims", json={"pool": "shell", "name": "victim"}).json()
        assert c["phase"] == "Ready", c
        before = run(http, "victim", "echo $PPID")["stdout"]
        try:
            r = http.post("/v1/claims/victim/execd/v1/command", json={"command": "kill -9 $PPID; sleep 5"})
            assert r.status_code >= 500, r.text  # it died answering
        except httpx.HTTPError:
            pass
        deadline = time.monotonic() + BACK
        while True:
            r = http.post("/v1/claims/victim/execd/v1/command", json={"command": "echo $PPID"})
            if r.status_code == 200:
                break
            assert time.monotonic() < deadline, f"execd did not come back: {r.status_code} {r.text}"
            time.sleep(0.2)
        assert r.json()["stdout"] != before
        again = http.get("/v1/claims/victim").json()
        assert again["phase"] == "Ready" and again["sandbox"] == c["sandbox"]


def test_sandbox_whose_execd_stays_gone_is_failed_and_replaced(make_operator):
    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    with op.http(timeout=30) as http:
        c = http.post("/v1/claims", json={"pool": "shell", "name": "gone"}).json()
        name = c["sandbox"]["name"]
        try:  # execd and its supervisor, as the sandbox's code can; the container lives on
            http.post("/v1/claims/gone/execd/v1/command", json={"command": f"kill -9 $({EXECD_PIDS})"})
        except httpx.HTTPError:
            pass
        assert op.containers(**{"corral.dev/sandbox": name})[0].status == "running"
        deadline = time.monotonic() + 90
        while True:
            claim = http.get("/v1/claims/gone").json()
            if claim["phase"] != "Ready":
                break
            assert time.monotonic() < deadline, "the claim stayed Ready with its execd gone"
            r = http.post("/v1/claims/gone/execd/v1/command", json={"command": "true"})
            assert r.status_code in (200, 409, 502), r.text
            time.sleep(0.5)
        assert claim["phase"] == "Failed" and "execd" in claim["message"], claim
        deadline = time.monotonic() + 60
        while op.containers(**{"corral.dev/sandbox": name}):
            assert time.monotonic() < deadline, "the sandbox whose execd is gone was not removed"
            time.sleep(0.5)
        op.wait_idle("shell", 1)


def test_idle_sandbox_whose_execd_is_killed_is_replaced_and_never_bound(make_operator):
    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    [dead] = op.containers(**{"corral.dev/pool": "shell"})
    assert engine.health_of(dead.attrs) in ("starting", "healthy"), dead.attrs["State"]  # the engine probes it
    # execd's supervisor and server, killed as the sandbox's own code (its user, no capabilities) could
    out = dead.exec_run(["/bin/sh", "-c", f"kill -9 $({EXECD_PIDS})"])
    assert out.exit_code == 0, out.output
    assert dead.exec_run(["/bin/sh", "-c", EXECD_PIDS]).output.strip() == b""
    killed = time.monotonic()
    # the probe fails HEALTH_RETRIES times an interval apart, then the runtime acts on the event at once
    bound = engine.HEALTH_INTERVAL * (engine.HEALTH_RETRIES + 1) + 20
    with op.http(timeout=60) as http:
        while op.containers(**{"corral.dev/sandbox": dead.name}):
            assert time.monotonic() - killed < bound, f"idle sandbox with a dead execd still there after {bound} s"
            assert http.get("/v1/claims").json()["items"] == [], "no claim was made"
            time.sleep(0.5)
        assert f"idle sandbox {dead.name}: execd is gone" in op.log(), op.log()[-3000:]
        op.wait_idle("shell", 1)  # replaced
        [fresh] = op.containers(**{"corral.dev/pool": "shell"})
        assert fresh.name != dead.name
        c = http.post("/v1/claims", json={"pool": "shell", "name": "after"}).json()
        assert c["phase"] == "Ready" and c["launchType"] == "warm" and c["sandbox"]["name"] == fresh.name, c
        assert run(http, "after", "echo ok")["stdout"] == "ok\n"


def test_token_in_no_readable_environ_nor_in_the_container_config(make_operator):
    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    with op.http(timeout=60) as http:
        c = http.post("/v1/claims", json={"pool": "shell", "name": "peek"}).json()
        sandbox = c["sandbox"]["name"]
        found = []
        for token in tokens(op, "peek", sandbox):
            half = len(token) // 2  # the scanning shell's own command line must not hold it
            out = run(http, "peek", (
                f"t={token[:half]}; t=${{t}}{token[half:]}; "
                f'for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -l -a -F "$t" $f 2>/dev/null; done; '
                f"test -e {engine.TOKEN_FILE} && echo {engine.TOKEN_FILE} still there; "
                f"for p in $({EXECD_PIDS}); do "
                f"for f in environ mem; do (exec 3</proc/$p/$f) 2>/dev/null && echo readable $p/$f; done; done; true"))
            found.append(out["stdout"])
            inspect = json.dumps(op.client.api.inspect_container(sandbox))
            assert token not in inspect
        assert "CORRAL_EXECD_TOKEN=" not in json.dumps(op.client.api.inspect_container(sandbox)["Config"]["Env"])
        assert found == ["", ""], found
        # /proc/1 (the container's init) and execd's processes are there to be checked at all
        procs = run(http, "peek", f"{EXECD_PIDS}")["stdout"].split()
        assert len(procs) == 2, procs  # the supervisor and the server: they were there to be checked


@pytest.mark.parametrize("strategy", ["Noop", "Restart"])
def test_recycled_sandbox_refuses_the_former_claims_token(make_operator, strategy):
    pool = df.pool(name="shell-one", template="shell", buffer_min=1, buffer_max=1, pool_max=1,
                    recycle_strategy=strategy)
    op = make_operator(pools=[pool])
    op.wait_idle("shell-one", 1)
    with op.http(timeout=60) as http:
        first = http.post("/v1/claims", json={"pool": "shell-one", "name": "first"}).json()
        sandbox = first["sandbox"]["name"]
        idle, token_a = tokens(op, "first", sandbox)
        url = execd_url(op, sandbox)
        assert status(url, token_a) == 200
        assert status(url, idle) == 401  # the sandbox's name alone opens nothing while it is claimed
        assert http.delete("/v1/claims/first").status_code == 204
        op.wait_idle("shell-one", 1)
        assert status(execd_url(op, sandbox), token_a) == 401
        second = http.post("/v1/claims", json={"pool": "shell-one", "name": "second"}).json()
        assert second["sandbox"]["name"] == sandbox, "poolMax 1: the same sandbox, recycled"
        _, token_b = tokens(op, "second", sandbox)
        url = execd_url(op, sandbox)
        assert [status(url, t) for t in (token_a, idle, token_b)] == [401, 401, 200]
        assert run(http, "second", "echo ok")["stdout"] == "ok\n"
