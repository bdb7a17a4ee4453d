"""Kubernetes mode, hostile-code defences around execd (issue 15): a claim's execd token dies with the claim and no pod
spec holds a token; an execd that died is never handed to a claim nor shown Ready, and its pool replaces it.

The operator runs as a process, the pods are kwok's (no kubelet), and a real execd stands in for each pod's on its
loopback IP (conftest.PodExecd), started with the idle token the pod's init container would derive. Without a kubelet
nothing probes execd: after killing one, the test plays the kubelet's part and turns the pod's Ready condition False,
as its readiness probe would (the cluster tier proves the real probe).
"""

from __future__ import annotations

import base64
import json
import time

import httpx
import pytest
from kubeutil import (
    TOKEN_SECRET,
    Sandbox,
    claim_token,
    idle_ready,
    idle_token,
    pool,
    sandbox_or_none,
    status,
    template,
    wait_until,
    warm_pool,
)
from lightkube.resources.core_v1 import Pod, Secret
from lightkube.types import PatchType

from corral.operator import tokens

pytestmark = pytest.mark.kube


def direct(execd, token: str, path: str = "/v1/env") -> int:
    """Status of a request straight to the sandbox's execd (as anyone holding `token` could make it)."""
    return httpx.get(f"{execd.url}{path}", headers={"Authorization": f"Bearer {token}"}, timeout=10).status_code


def sandbox_state(kube, ns: str, name: str) -> tuple[str | None, bool]:
    """(its claim label, Ready) as the operator last wrote them."""
    s = kube.get(Sandbox, name, namespace=ns)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status(s).get("conditions") or [])
    return (s.metadata.labels or {}).get("corral.dev/claim"), ready


def set_pod_ready(kube, ns: str, pod: str, ready: bool) -> None:
    """What the kubelet does when the readiness probe (execd's /v1/health) fails or passes again."""
    current = kube.get(Pod, pod, namespace=ns)
    conditions = [c.to_dict() for c in current.status.conditions if c.type != "Ready"]
    conditions.append({"type": "Ready", "status": "True" if ready else "False", "reason": "TestReadinessProbe"})
    kube.patch(Pod.Status, pod, {"status": {"conditions": conditions}}, namespace=ns, patch_type=PatchType.MERGE)


def test_a_claims_token_dies_with_the_claim_and_no_pod_spec_holds_one(kube, operator, api_ns, http, uid, pod_execd):
    ns = api_ns
    kube.create(template(f"py-{uid}"), namespace=ns)
    kube.create(pool(f"p-{uid}", f"py-{uid}", recycleStrategy="Noop",
                     capacity={"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 1}), namespace=ns)
    (sandbox,) = wait_until(lambda: len(s := idle_ready(kube, ns, f"p-{uid}")) == 1 and s, 60, 0.25, "one idle")
    name = sandbox.metadata.name
    pod = kube.get(Pod, name, namespace=ns)
    idle = idle_token(ns, name, pod.metadata.uid)
    execd = pod_execd(sandbox)
    assert direct(execd, idle) == 200

    # Nothing in the pod spec holds a token or the key; the key Secret is mounted into the init container alone.
    key = tokens.namespace_key(TOKEN_SECRET.encode(), ns)
    spec_text = json.dumps(pod.to_dict(), default=str)
    assert idle not in spec_text, pod.spec.initContainers[0].to_dict()
    assert key not in spec_text and "CORRAL_EXECD_TOKEN\"" not in spec_text
    secret = kube.get(Secret, tokens.key_secret(TOKEN_SECRET.encode(), ns), namespace=ns)
    assert base64.b64decode(secret.data["key"]).decode() == key
    key_volumes = {v.name for v in pod.spec.volumes if v.secret and v.secret.secretName == secret.metadata.name}
    assert key_volumes and all(m.name not in key_volumes for c in pod.spec.containers for m in c.volumeMounts or [])
    assert any(m.name in key_volumes for m in pod.spec.initContainers[0].volumeMounts)

    # Claim A: bound warm with no execd call; its first use puts the claim's own token into execd.
    r = http.post("/v1/claims", json={"pool": f"p-{uid}", "name": f"a-{uid}", "timeoutSeconds": 60})
    assert r.status_code == 201 and r.json()["sandbox"]["name"] == name, r.text
    assert direct(execd, idle) == 200, "the bind itself made an execd call"
    timings = []
    for _ in range(3):
        t0 = time.perf_counter()
        out = http.post(f"/v1/claims/a-{uid}/execd/v1/command", json={"command": "echo $((6*7))"})
        timings.append(time.perf_counter() - t0)
        assert out.status_code == 200 and out.json()["stdout"].strip() == "42", out.text
    print(f"proxied command: first use {timings[0] * 1000:.1f} ms (with the token hand-over), then "
          f"{timings[1] * 1000:.1f} / {timings[2] * 1000:.1f} ms")
    a_token = claim_token(kube, ns, name, f"a-{uid}")
    assert direct(execd, a_token) == 200 and direct(execd, idle) == 401

    # Release A: the Pool recycles the sandbox as it is (Noop); A's token is refused from then on.
    assert http.delete(f"/v1/claims/a-{uid}").status_code == 204
    wait_until(lambda: sandbox_state(kube, ns, name) == (None, True), 60, 0.25, "recycled into the pool")
    assert direct(execd, a_token) == 401, "a former claim's token still drives the recycled sandbox"
    assert direct(execd, idle) == 200

    # Claim B on the same sandbox (Retain): another token; A's stays refused.
    r = http.post("/v1/claims", json={"pool": f"p-{uid}", "name": f"b-{uid}", "shutdownPolicy": "Retain",
                                      "timeoutSeconds": 60})
    assert r.status_code == 201 and r.json()["sandbox"]["name"] == name, r.text
    out = http.post(f"/v1/claims/b-{uid}/execd/v1/command", json={"command": "echo b"})
    assert out.status_code == 200, out.text
    b_token = claim_token(kube, ns, name, f"b-{uid}")
    assert b_token != a_token and direct(execd, b_token) == 200
    assert direct(execd, a_token) == 401 and direct(execd, idle) == 401

    # B ends, its sandbox is retained (detached, kept running): B's token dies with the claim all the same.
    assert http.delete(f"/v1/claims/b-{uid}").status_code == 204
    wait_until(lambda: sandbox_state(kube, ns, name)[0] is None, 60, 0.25, "retained")
    assert sandbox_or_none(kube, ns, name) is not None
    assert direct(execd, b_token) == 401, "a retained sandbox still takes its ended claim's token"
    assert direct(execd, idle) == 200


def test_a_dead_execd_is_never_handed_out_nor_shown_ready_and_its_pool_replaces_it(kube, operator, api_ns, http,
                                                                                      uid, pod_execd):
    ns = api_ns
    kube.create(template(f"py-{uid}"), namespace=ns)
    kube.create(warm_pool(f"wp-{uid}", f"py-{uid}", 2, readinessGraceSeconds=10), namespace=ns)
    idle = wait_until(lambda: len(s := idle_ready(kube, ns, f"wp-{uid}")) == 2 and s, 60, 0.25, "two idle")
    dead, alive = pod_execd(idle[0]), pod_execd(idle[1])
    dead_name, alive_name = idle[0].metadata.name, idle[1].metadata.name

    # An idle sandbox's execd dies for good (supervisor and server); its readiness probe fails.
    dead.kill()
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{dead.url}/v1/health", timeout=2)
    set_pod_ready(kube, ns, dead_name, False)
    wait_until(lambda: sandbox_state(kube, ns, dead_name) == (None, False), 30, 0.25, "the dead one unready")
    t_unready = time.monotonic()

    # A claim gets the live one, never the dead one.
    r = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"c-{uid}", "timeoutSeconds": 60})
    assert r.status_code == 201 and r.json()["phase"] == "Ready", r.text
    assert r.json()["sandbox"]["name"] == alive_name
    out = http.post(f"/v1/claims/c-{uid}/execd/v1/command", json={"command": "echo ok"})
    assert out.status_code == 200 and out.json()["stdout"].strip() == "ok", out.text

    # The WarmPool replaces the dead idle sandbox once it has been unready for its readiness grace (10 s).
    wait_until(lambda: sandbox_or_none(kube, ns, dead_name) is None
               or bool(kube.get(Sandbox, dead_name, namespace=ns).metadata.deletionTimestamp), 60, 0.5, "replaced")
    assert time.monotonic() - t_unready >= 5, "replaced before the readiness grace"
    wait_until(lambda: len(idle_ready(kube, ns, f"wp-{uid}")) == 2, 60, 0.25, "the pool refilled")

    # The bound sandbox's execd dies: the claim is not shown Ready, and the proxy says why instead of hanging.
    alive.kill()
    set_pod_ready(kube, ns, alive_name, False)
    wait_until(lambda: http.get(f"/v1/claims/c-{uid}").json()["phase"] != "Ready", 30, 0.25, "claim not Ready")
    c = http.get(f"/v1/claims/c-{uid}").json()
    assert c["phase"] == "Pending" and "not ready" in c["message"], c
    proxied = http.post(f"/v1/claims/c-{uid}/execd/v1/command", json={"command": "echo no"})
    assert proxied.status_code == 503 and proxied.json()["code"] == "unavailable", proxied.text
    assert http.get("/v1/claims", params={"pool": f"wp-{uid}"}).json()["items"][0]["phase"] == "Pending"


def test_a_pool_replaces_an_idle_sandbox_whose_execd_died(kube, operator, api_ns, uid, pod_execd):
    """Pools replaced no idle sandbox that turned unready (WarmPools did): now both do, after the grace."""
    ns = api_ns
    kube.create(template(f"py-{uid}"), namespace=ns)
    kube.create(pool(f"p-{uid}", f"py-{uid}", readinessGraceSeconds=10,
                     capacity={"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 2}), namespace=ns)
    (sandbox,) = wait_until(lambda: len(s := idle_ready(kube, ns, f"p-{uid}")) == 1 and s, 60, 0.25, "one idle")
    pod_execd(sandbox).kill()
    set_pod_ready(kube, ns, sandbox.metadata.name, False)
    t0 = time.monotonic()
    wait_until(lambda: (s := idle_ready(kube, ns, f"p-{uid}")) and s[0].metadata.name != sandbox.metadata.name,
               60, 0.5, "a replacement")
    assert time.monotonic() - t0 >= 5, "replaced before the readiness grace"
    gone = sandbox_or_none(kube, ns, sandbox.metadata.name)
    assert gone is None or gone.metadata.deletionTimestamp
