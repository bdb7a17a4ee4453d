"""docker tier: sandboxes of one template cannot reach each other (issue 15). Each template's network has
inter-container communication off, the operator (a host process here, network_mode host in the DockerStack) still
reaches every execd, and the per-sandbox disk bound is applied exactly where the storage driver allows it."""

from __future__ import annotations

import json
import secrets
import socket
import time

import httpx
import pytest

from corral.operator.docker import engine
from corral.operator.docker.desired import DEFAULT_DISK

pytestmark = pytest.mark.docker

EXECD_PORT = 44772
LISTEN_PORT = 9000      # a listener the target sandbox opens itself
CLOSED_PORT = 22        # nothing listens: an answer (RST) would still prove the packet got through

# Prints one word per target: ok (connected), refused (the target answered with RST), timeout (nothing came back).
PROBE = r"""
import json, socket, sys
out = {}
for host, port in json.loads(sys.argv[1]):
    s = socket.socket()
    s.settimeout(2.0)
    try:
        s.connect((host, port))
        out[f"{host}:{port}"] = "ok"
    except ConnectionRefusedError:
        out[f"{host}:{port}"] = "refused"
    except OSError:
        out[f"{host}:{port}"] = "timeout"
    finally:
        s.close()
print(json.dumps(out))
"""
LISTEN = f"import socket,time; s=socket.socket(); s.bind(('0.0.0.0', {LISTEN_PORT})); s.listen(8); time.sleep(3600)"


def run(http: httpx.Client, claim: str, command: str, **kw) -> dict:
    r = http.post(f"/v1/claims/{claim}/execd/v1/command", json={"command": command, **kw})
    assert r.status_code in (200, 202), r.text
    return r.json()


def probe_cmd(targets: list[tuple[str, int]]) -> list[str]:
    return ["python3", "-c", PROBE, json.dumps(targets)]


def host_connects(ip: str, port: int, deadline: float) -> bool:
    while True:
        try:
            socket.create_connection((ip, port), timeout=2).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)


def test_connection_works_on_an_ordinary_bridge(docker_client, make_operator):
    """Positive control: the same probe, between two containers of the sandbox image on an ordinary bridge network
    the test makes, connects (and a closed port answers refused): what the isolation test sees as a timeout is the
    network's doing, not the probe's."""
    op = make_operator(start=False)
    image = op.desired.template("python").image
    net = docker_client.networks.create(f"corral-ctl-{secrets.token_hex(3)}", driver="bridge",
                                        labels={engine.L_STACK: op.stack})
    made = []
    try:
        target = docker_client.containers.run(image, ["python3", "-c", LISTEN], network=net.name, detach=True,
                                              labels={engine.L_STACK: op.stack})
        made.append(target)
        target.reload()
        ip = target.attrs["NetworkSettings"]["Networks"][net.name]["IPAddress"]
        assert host_connects(ip, LISTEN_PORT, time.monotonic() + 30)  # listening
        prober = docker_client.containers.run(image, probe_cmd([(ip, LISTEN_PORT), (ip, CLOSED_PORT)]),
                                              network=net.name, detach=True, labels={engine.L_STACK: op.stack})
        made.append(prober)
        assert prober.wait(timeout=60)["StatusCode"] == 0
        out = json.loads(prober.logs(stdout=True, stderr=False).decode().strip().splitlines()[-1])
        assert out == {f"{ip}:{LISTEN_PORT}": "ok", f"{ip}:{CLOSED_PORT}": "refused"}, out
    finally:
        for c in made:
            c.remove(force=True)
        net.remove()


def test_sandbox_cannot_reach_another_sandbox(docker_client, make_operator):
    op = make_operator(warm={"python": 2})
    op.wait_idle("python", 2)
    network = op.desired.template("python").network
    assert engine.network_isolated(docker_client.networks.get(network).attrs)
    with op.http() as http:
        a = http.post("/v1/claims", json={"pool": "python", "name": "a"}).json()
        b = http.post("/v1/claims", json={"pool": "python", "name": "b"}).json()
        assert a["phase"] == b["phase"] == "Ready", (a, b)
        ips = {}
        for claim in (a, b):
            (c,) = op.containers(**{"corral.dev/sandbox": claim["sandbox"]["name"]})
            c.reload()
            ips[claim["name"]] = c.attrs["NetworkSettings"]["Networks"][network]["IPAddress"]
        run(http, "b", f"python3 -c \"{LISTEN}\"", background=True)
        # Positive control from the host side of the bridge (where the operator is): b's execd and listener answer.
        deadline = time.monotonic() + 30
        assert host_connects(ips["b"], EXECD_PORT, deadline)
        assert host_connects(ips["b"], LISTEN_PORT, deadline)
        # From sandbox a: no port of b answers, not even with a refusal.
        targets = [(ips["b"], EXECD_PORT), (ips["b"], LISTEN_PORT), (ips["b"], CLOSED_PORT)]
        r = http.post("/v1/claims/a/execd/v1/command", json={"argv": probe_cmd(targets)})
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        out = json.loads(r.json()["stdout"])
        assert set(out.values()) == {"timeout"}, f"sandbox a reached sandbox b: {out}"
        # ... and the other way round; while claims still run commands through the operator.
        r = http.post("/v1/claims/b/execd/v1/command", json={"argv": probe_cmd([(ips["a"], EXECD_PORT)])})
        assert json.loads(r.json()["stdout"]) == {f"{ips['a']}:{EXECD_PORT}": "timeout"}, r.text
        assert run(http, "a", "echo still here")["stdout"] == "still here\n"
        assert run(http, "b", "echo still here")["stdout"] == "still here\n"


def test_an_older_network_with_icc_on_is_recreated_isolated(docker_client):
    """A network left by an older Corral (ICC on, nothing attached) is replaced by an isolated one."""
    stack = f"t{secrets.token_hex(3)}"
    name = f"corral-{stack}-python"
    old = docker_client.networks.create(name, driver="bridge", labels=engine.stack_labels(stack, "network"))
    try:
        assert not engine.network_isolated(old.attrs)
        net_id = engine.ensure_network(docker_client, name, internal=False, stack=stack)
        assert net_id != old.id and engine.network_isolated(docker_client.networks.get(net_id).attrs)
        assert engine.ensure_network(docker_client, name, internal=False, stack=stack) == net_id  # idempotent
    finally:
        engine.sweep(docker_client, stack)


def test_sweep_removes_a_network_an_endpoint_still_holds(docker_client, make_operator):
    """A container the sweep does not remove itself (here: not labelled with the stack; in CI: one whose removal
    the stopped operator had in flight, 409 "already in progress") still holds an endpoint on the stack's network:
    the sweep disconnects it by force and removes the network, and leaves the container alone."""
    op = make_operator(start=False)
    image = op.desired.template("python").image
    net = docker_client.networks.create(f"corral-{op.stack}-held", driver="bridge",
                                        labels=engine.stack_labels(op.stack, "network"))
    other = docker_client.containers.run(image, ["sleep", "300"], network=net.name, detach=True)
    try:
        assert engine.sweep(docker_client, op.stack)["networks"] == 1
        assert not docker_client.networks.list(filters={"label": f"{engine.L_STACK}={op.stack}"})
        other.reload()
        assert other.status == "running" and net.name not in other.attrs["NetworkSettings"]["Networks"]
    finally:
        other.remove(force=True)


def test_disk_bound_applied_where_the_storage_driver_allows(docker_client, make_operator):
    """overlay2 over ext4 (this test bed) cannot bound a writable layer: then no storage_opt is passed (Docker would
    refuse the container). Where it can (xfs+pquota, btrfs, zfs, devicemapper), every sandbox carries the bound."""
    op = make_operator(warm={"shell": 1})
    op.wait_idle("shell", 1)
    (c,) = op.containers()
    c.reload()
    info = docker_client.info()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem")
    supported = engine.disk_quota_supported(docker_client, op.desired.template("shell").image)
    if info["Driver"] == "overlay2" and backing != "xfs":
        assert supported is False
    storage_opt = c.attrs["HostConfig"].get("StorageOpt") or {}
    assert storage_opt == ({"size": str(DEFAULT_DISK)} if supported else {}), (info["Driver"], backing, storage_opt)
