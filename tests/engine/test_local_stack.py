"""engine tier: `pulumi up --stack local` with the real Pulumi CLI on the real Docker Engine starts the operator
container and the warm pools; a claim through the API runs a command; a pools change reloads the operator;
`pulumi destroy` leaves no container, network or volume of the stack behind.

The test's stack is `local-test`: the local stack's file under a name of its own and a free port, so a user's own
`local` stack (the README's first command leaves it running) is neither touched nor in the way."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]  # not `from conftest import`: several conftest.py shadow each other

pytestmark = pytest.mark.engine
STACK = "local-test"
LABEL = f"corral.dev/stack={STACK}"


def leftovers(docker_client) -> dict[str, list[str]]:
    return {
        "containers": [c.name for c in docker_client.containers.list(all=True, filters={"label": LABEL})],
        "networks": [n.name for n in docker_client.networks.list(filters={"label": LABEL})],
        "volumes": [v.name for v in docker_client.volumes.list(filters={"label": LABEL})],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def idle_ready(url: str, pool: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    m = re.search(rf'corral_pool_sandboxes{{namespace="[^"]*",pool="{pool}",state="ready"}} ([0-9.e+]+)', text)
    return float(m.group(1)) if m else 0.0


def test_local_stack_up_claim_and_destroy(pulumi_cli, docker_client, project, tmp_path):
    from corral.operator.docker.image import ensure_image

    ensure_image()  # what scripts/setup.sh did; a cache hit normally
    assert not any(leftovers(docker_client).values()), f"stack {STACK} already has Docker objects: " \
                                                      f"{leftovers(docker_client)}"
    port = free_port()
    (project / "stacks" / f"Pulumi.{STACK}.yaml").write_text((project / "stacks" / "Pulumi.local.yaml").read_text())
    env = {"CORRAL_CACHE": str(tmp_path / "cache")}  # the pools file goes under here
    run = lambda *a, **kw: pulumi_cli.run(*a, cwd=project, env=env, **kw)  # noqa: E731
    run("stack", "init", STACK, "--non-interactive")
    run("config", "set", "--path", "corral:docker.apiPort", str(port), "--stack", STACK)
    try:
        t0 = time.monotonic()
        run("up", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview")
        up_seconds = time.monotonic() - t0
        out = json.loads(run("stack", "output", "--stack", STACK, "--json", "--show-secrets").stdout)
        url, token = out["apiUrl"], out["apiToken"]
        assert url == f"http://127.0.0.1:{port}" and out["operatorImage"].startswith("corral/operator:")
        (operator,) = docker_client.containers.list(filters={"label": [LABEL, "corral.dev/role=operator"]})
        mounts = {m["Destination"] for m in operator.attrs["Mounts"]}
        assert {"/var/run/docker.sock", "/var/lib/corral", "/etc/corral"} <= mounts

        # The warm pool of the local stack (python, 2 replicas) fills.
        deadline = time.monotonic() + 300
        while idle_ready(url, "python") < 2:
            assert time.monotonic() < deadline, operator.logs(tail=50).decode()
            time.sleep(0.25)
        ready_seconds = time.monotonic() - t0

        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
            assert httpx.get(url + "/v1/claims", timeout=10).status_code == 401
            claim = http.post("/v1/claims", json={"pool": "python", "name": "hello"})
            assert claim.status_code == 201, claim.text
            assert claim.json()["launchType"] == "warm"
            r = http.post("/v1/claims/hello/execd/v1/command", json={"command": "python3 -c 'print(6*7)'"})
            assert r.status_code == 200 and r.json()["stdout"] == "42\n", r.text

        # Nothing drifts: a second preview proposes no change.
        run("preview", "--stack", STACK, "--non-interactive", "--expect-no-changes")
        print(f"\npulumi up: {up_seconds:.1f} s; warm pool of 2 ready {ready_seconds:.1f} s after the up started")

        run("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview")
        assert not any(leftovers(docker_client).values()), leftovers(docker_client)
    finally:
        run("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview", check=False)
        run("stack", "rm", STACK, "--yes", "--force", "--non-interactive", check=False)
