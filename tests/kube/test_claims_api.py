"""The claims HTTP API served by the Kubernetes operator process: the same API the SDK uses against Docker.

Every call goes through the operator's HTTP API (bearer token) on loopback; the cluster is only read to check what
the API did. The API serves one namespace (`operator.api_namespace`); each test uses its own pool names in it.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from kubeutil import Sandbox, SandboxClaim, idle_ready, pool, sandbox_or_none, status, template, wait_until, warm_pool
from lightkube import ApiError

pytestmark = pytest.mark.kube


def wait_ready_pool(kube, ns, name, n, timeout=60):
    return wait_until(lambda: len(s := idle_ready(kube, ns, name)) == n and s, timeout, 0.25, f"{n} ready in {name}")


def is_error(resp: httpx.Response, status: int, code: str) -> dict:
    assert resp.status_code == status, f"{resp.status_code} {resp.text}"
    body = resp.json()
    assert set(body) == {"code", "message"} and body["code"] == code and body["message"], body
    return body


def test_warm_claim_runs_commands_and_a_pty_through_the_proxy(kube, operator, api_ns, http, uid, pod_execd):
    kube.create(template(f"py-{uid}", env_policy="Allowed"), namespace=api_ns)
    kube.create(warm_pool(f"wp-{uid}", f"py-{uid}", 1), namespace=api_ns)
    (sandbox,) = wait_ready_pool(kube, api_ns, f"wp-{uid}", 1)
    pod_execd(sandbox)  # the real execd, on the kwok pod's loopback IP with the token the operator derives

    r = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"warm-{uid}", "env": {"GREETING": "hi there"},
                                      "timeoutSeconds": 60})
    assert r.status_code == 201, r.text
    c = r.json()
    assert c["phase"] == "Ready" and c["launchType"] == "warm" and c["poolKind"] == "WarmPool"
    assert c["sandbox"] == {"name": sandbox.metadata.name, "endpoint": f"/v1/claims/warm-{uid}/execd"}
    assert c["readyAt"] and c["expiresAt"] is None

    # The claim is a SandboxClaim in the API's namespace, bound by the operator.
    st = status(kube.get(SandboxClaim, f"warm-{uid}", namespace=api_ns))
    assert st["phase"] == "Bound" and st["sandbox"]["name"] == sandbox.metadata.name

    # A command through the proxy reaches that execd (and sees the env the claim injected into the warm sandbox).
    out = http.post(f"/v1/claims/warm-{uid}/execd/v1/command", json={"command": "echo $GREETING; echo $((6*7))"})
    assert out.status_code == 200, out.text
    assert out.json()["stdout"].split() == ["hi", "there", "42"]

    # Creating the same name again is a safe retry: the same claim, the same sandbox.
    again = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"warm-{uid}"})
    assert again.status_code == 201 and again.json()["sandbox"]["name"] == sandbox.metadata.name
    assert [x["name"] for x in http.get("/v1/claims", params={"pool": f"wp-{uid}"}).json()["items"]] == [f"warm-{uid}"]
    assert http.get(f"/v1/claims/warm-{uid}").json()["phase"] == "Ready"

    # A PTY over the WebSocket proxy: the token is required, then a shell round trip.
    pty = http.post(f"/v1/claims/warm-{uid}/execd/v1/pty", json={"command": "sh", "cols": 80, "rows": 24})
    assert pty.status_code in (200, 201), pty.text
    ws_url = f"ws://127.0.0.1:{operator.api_port}/v1/claims/warm-{uid}/execd/v1/pty/{pty.json()['id']}/ws"
    assert b"hi-42" in asyncio.run(pty_round_trip(ws_url, operator.api_token))

    # DELETE (policy Delete): the claim is gone at once and its warm sandbox is deleted; the pool refills.
    assert http.delete(f"/v1/claims/warm-{uid}").status_code == 204
    is_error(http.get(f"/v1/claims/warm-{uid}"), 404, "not_found")
    wait_until(lambda: sandbox_or_none(kube, api_ns, sandbox.metadata.name) is None, 30, what="sandbox deleted")
    wait_ready_pool(kube, api_ns, f"wp-{uid}", 1)
    is_error(http.get(f"/v1/claims/warm-{uid}/execd/v1/health"), 404, "not_found")


async def pty_round_trip(ws_url: str, token: str) -> bytes:
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    try:
        await connect(ws_url, additional_headers={"Authorization": "Bearer wrong"}, open_timeout=30)
        raise AssertionError("a WebSocket with a wrong token was accepted")
    except InvalidStatus as exc:
        assert exc.response.status_code == 401
    async with connect(ws_url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=30) as ws:
        await ws.send(b"\x00echo hi-$((40+2))\n")
        seen = b""
        deadline = time.monotonic() + 30
        while b"hi-42" not in seen:
            assert time.monotonic() < deadline, seen
            frame = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(frame, bytes) and frame[:1] in (b"\x01", b"\x03"):
                seen += frame[1:]
    return seen


def test_cold_claim_renew_and_an_unreachable_execd(kube, operator, api_ns, http, uid):
    kube.create(template(f"py-{uid}"), namespace=api_ns)
    kube.create(warm_pool(f"wp-{uid}", f"py-{uid}", 0), namespace=api_ns)
    r = http.post("/v1/claims", json={"pool": f"wp-{uid}", "ttlSeconds": 600, "timeoutSeconds": 60})
    assert r.status_code == 201, r.text
    c = r.json()
    assert c["phase"] == "Ready" and c["launchType"] == "cold" and c["name"].startswith("claim-")
    sandbox = kube.get(Sandbox, c["sandbox"]["name"], namespace=api_ns)
    assert (sandbox.metadata.labels or {})["corral.dev/claim"] == c["name"]
    expires = datetime.fromisoformat(c["expiresAt"])
    assert timedelta(seconds=590) < expires - datetime.now(UTC) <= timedelta(seconds=601)  # rounded up to the second

    # renew moves the lease (spec.lifecycle.shutdownTime, which the operator acts on).
    renewed = http.post(f"/v1/claims/{c['name']}/renew", json={"ttlSeconds": 7200})
    assert renewed.status_code == 200, renewed.text
    moved = datetime.fromisoformat(renewed.json()["expiresAt"])
    assert moved - expires > timedelta(seconds=6000)
    spec = kube.get(SandboxClaim, c["name"], namespace=api_ns).spec
    assert datetime.fromisoformat(spec["lifecycle"]["shutdownTime"].replace("Z", "+00:00")) == moved
    is_error(http.post(f"/v1/claims/{c['name']}/renew", json={"ttlSeconds": 0}), 400, "invalid")

    # Nothing answers on the sandbox's execd port (no execd was started for it): a clear 502, not a hang or a 500.
    is_error(http.get(f"/v1/claims/{c['name']}/execd/v1/health"), 502, "sandbox_unreachable")

    # pause/resume/snapshot keep the Docker meaning (memory kept, image commit): not offered on Kubernetes.
    for op in ("pause", "resume", "snapshot"):
        body = is_error(http.post(f"/v1/claims/{c['name']}/{op}"), 400, "not_supported")
        assert "Docker" in body["message"]
    assert kube.get(Sandbox, c["sandbox"]["name"], namespace=api_ns).spec.get("operatingMode", "Running") == "Running"

    assert http.delete(f"/v1/claims/{c['name']}").status_code == 204
    wait_until(lambda: sandbox_or_none(kube, api_ns, c["sandbox"]["name"]) is None, 30, what="cold sandbox deleted")
    is_error(http.delete(f"/v1/claims/{c['name']}"), 404, "not_found")


def test_user_errors_are_4xx_in_the_one_error_shape(kube, operator, api_ns, http, uid):
    # A pool that does not exist: 404 before anything is created.
    body = is_error(http.post("/v1/claims", json={"pool": f"missing-{uid}", "name": f"m-{uid}"}), 404, "not_found")
    assert f"missing-{uid}" in body["message"]
    with pytest.raises(ApiError):
        kube.get(SandboxClaim, f"m-{uid}", namespace=api_ns)
    # A pool whose template does not exist.
    kube.create(warm_pool(f"orphan-{uid}", f"nope-{uid}", 1), namespace=api_ns)
    body = is_error(http.post("/v1/claims", json={"pool": f"orphan-{uid}"}), 404, "not_found")
    assert f"nope-{uid}" in body["message"]
    # Env the template does not allow: the operator fails the claim; the API answers with its condition's message.
    kube.create(template(f"strict-{uid}", env_policy="Disallowed"), namespace=api_ns)
    kube.create(warm_pool(f"wp-{uid}", f"strict-{uid}", 1), namespace=api_ns)
    wait_ready_pool(kube, api_ns, f"wp-{uid}", 1)
    r = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"env-{uid}", "env": {"X": "1"}})
    body = is_error(r, 400, "claim_failed")
    assert "EnvVarsNotAllowed" in body["message"] and "envVarsInjectionPolicy" in body["message"]
    assert http.get(f"/v1/claims/env-{uid}").json()["phase"] == "Failed"
    assert len(idle_ready(kube, api_ns, f"wp-{uid}")) == 1, "the warm sandbox was not consumed"
    # Validation and unknown claims.
    is_error(http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": "Not_A_Name"}), 400, "invalid")
    is_error(http.post("/v1/claims", json={"name": "x"}), 400, "invalid")
    is_error(http.get("/v1/claims/does-not-exist"), 404, "not_found")
    is_error(http.post("/v1/claims/does-not-exist/renew", json={"ttlSeconds": 60}), 404, "not_found")


def test_the_token_is_required(operator, api_ns):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": operator.api_token}):
        for method, path in (("GET", "/v1/claims"), ("POST", "/v1/claims"), ("GET", "/v1/pools"),
                             ("GET", "/v1/claims/x/execd/v1/health")):
            r = httpx.request(method, operator.api_url + path, headers=headers, json={"pool": "x"}, timeout=30)
            is_error(r, 401, "unauthorized")
    assert httpx.get(operator.api_url + "/v1/health", timeout=30).status_code == 200


def test_pool_claims_are_recycled_and_retain_keeps_the_sandbox(kube, operator, api_ns, http, uid):
    kube.create(template(f"py-{uid}"), namespace=api_ns)
    kube.create(pool(f"p-{uid}", f"py-{uid}", capacity={"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 1},
                     recycleStrategy="Noop"), namespace=api_ns)
    (member,) = wait_ready_pool(kube, api_ns, f"p-{uid}", 1)
    pools = {p["name"]: p for p in http.get("/v1/pools").json()["items"]}
    assert pools[f"p-{uid}"] == {"name": f"p-{uid}", "kind": "Pool", "template": f"py-{uid}", "desired": 1,
                                 "ready": 1, "idle": 1, "allocated": 0}

    first = http.post("/v1/claims", json={"pool": f"p-{uid}", "name": f"a-{uid}"})
    assert first.status_code == 201, first.text
    assert first.json()["poolKind"] == "Pool" and first.json()["sandbox"]["name"] == member.metadata.name
    assert {p["name"]: p for p in http.get("/v1/pools").json()["items"]}[f"p-{uid}"]["allocated"] == 1

    # Ending the claim recycles its sandbox into the Pool (Noop): the next claim gets the same one, warm.
    assert http.delete(f"/v1/claims/a-{uid}").status_code == 204
    is_error(http.get(f"/v1/claims/a-{uid}"), 404, "not_found")
    wait_ready_pool(kube, api_ns, f"p-{uid}", 1)
    second = http.post("/v1/claims", json={"pool": f"p-{uid}", "name": f"b-{uid}"})
    assert second.status_code == 201, second.text
    assert second.json()["sandbox"]["name"] == member.metadata.name and second.json()["launchType"] == "warm"

    # Retain: DELETE ends the claim but keeps the sandbox, detached from the claim and the pool.
    kube.create(warm_pool(f"wp-{uid}", f"py-{uid}", 1), namespace=api_ns)
    wait_ready_pool(kube, api_ns, f"wp-{uid}", 1)
    r = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"keep-{uid}", "shutdownPolicy": "Retain"})
    assert r.status_code == 201 and r.json()["shutdownPolicy"] == "Retain", r.text
    kept = r.json()["sandbox"]["name"]
    assert http.delete(f"/v1/claims/keep-{uid}").status_code == 204
    is_error(http.get(f"/v1/claims/keep-{uid}"), 404, "not_found")
    s = sandbox_or_none(kube, api_ns, kept)
    assert s is not None and not s.metadata.deletionTimestamp
    assert "corral.dev/claim" not in (s.metadata.labels or {}) and not s.metadata.ownerReferences
    time.sleep(2)
    assert sandbox_or_none(kube, api_ns, kept) is not None, "Retain: the sandbox outlives the claim"


def test_retained_sandboxes_are_listed_and_deleted_through_the_api(kube, operator, api_ns, http, uid):
    """A Retain claim ended through the API leaves its Sandbox marked retained (label, and the claim, pool and time as
    annotations): GET /v1/retained lists it from the operator's index, DELETE removes that Sandbox and nothing else
    (a pool's sandbox is a 404 here). Snapshots are Docker-only: their routes answer not_supported."""
    kube.create(template(f"py-{uid}"), namespace=api_ns)
    kube.create(warm_pool(f"wp-{uid}", f"py-{uid}", 1), namespace=api_ns)
    wait_ready_pool(kube, api_ns, f"wp-{uid}", 1)
    r = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"keep-{uid}", "shutdownPolicy": "Retain"})
    assert r.status_code == 201, r.text
    kept = r.json()["sandbox"]["name"]

    def retained() -> dict[str, dict]:
        listed = http.get("/v1/retained")
        assert listed.status_code == 200, listed.text
        return {x["name"]: x for x in listed.json()["items"]}

    assert kept not in retained()  # claimed: not retained
    assert http.delete(f"/v1/claims/keep-{uid}").status_code == 204
    entry = wait_until(lambda: retained().get(kept), 30, 0.25, f"{kept} listed as retained")
    assert (entry["claim"], entry["pool"], entry["template"]) == (f"keep-{uid}", f"wp-{uid}", f"py-{uid}")
    assert entry["retainedAt"] and entry["created"] and entry["state"] and entry["ready"] is True, entry
    meta = sandbox_or_none(kube, api_ns, kept).metadata
    assert meta.labels["corral.dev/retained"] == "true" \
        and meta.annotations["corral.dev/retained-from"] == f"keep-{uid}"

    (member,) = wait_ready_pool(kube, api_ns, f"wp-{uid}", 1)  # the refill: a pool's sandbox, never listed here
    assert member.metadata.name not in retained()
    is_error(http.delete(f"/v1/retained/{member.metadata.name}"), 404, "not_found")
    is_error(http.delete(f"/v1/retained/no-such-{uid}"), 404, "not_found")
    is_error(http.delete("/v1/retained/Not_A_Name"), 400, "invalid")
    for method, path in (("GET", "/v1/snapshots"), ("DELETE", f"/v1/snapshots/corral-snapshot/x:{uid}")):
        assert "Docker" in is_error(http.request(method, path), 400, "not_supported")["message"]

    assert http.delete(f"/v1/retained/{kept}").status_code == 204
    wait_until(lambda: sandbox_or_none(kube, api_ns, kept) is None, 30, 0.25, f"{kept} deleted")
    assert kept not in retained()
    is_error(http.delete(f"/v1/retained/{kept}"), 404, "not_found")
    assert sandbox_or_none(kube, api_ns, member.metadata.name) is not None


def test_a_pending_claim_is_waited_for_on_watch_events_not_by_polling(kube, operator, api_ns, http, uid):
    stuck = template(f"stuck-{uid}")
    stuck.spec["podTemplate"]["spec"]["nodeSelector"] = {"corral.dev/test-no-such-node": "true"}  # never scheduled
    kube.create(stuck, namespace=api_ns)
    kube.create(warm_pool(f"wp-{uid}", f"stuck-{uid}", 0), namespace=api_ns)

    def claim_reads():
        return sum(v for k, v in operator.metrics().items() if k.startswith("corral_api_requests_total")
                   and 'resource="SandboxClaim"' in k and ('verb="get"' in k or 'verb="list"' in k))

    http.get("/v1/claims")  # the API's cache is warm
    before = claim_reads()
    r = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"wait-{uid}", "timeoutSeconds": 3})
    assert r.status_code == 202, r.text
    assert r.json()["phase"] == "Pending" and r.json()["sandbox"] is None
    assert claim_reads() == before, "the API read the claim from the API server instead of the operator's cache"
    # Its sandbox exists (a cold start) but is not ready; the proxy says so instead of trying.
    is_error(http.get(f"/v1/claims/wait-{uid}/execd/v1/health"), 409, "conflict")
    assert http.delete(f"/v1/claims/wait-{uid}").status_code == 204
    is_error(http.get(f"/v1/claims/wait-{uid}"), 404, "not_found")


def test_timeout_zero_answers_202_at_once_and_the_claim_binds(kube, operator, api_ns, http, uid):
    kube.create(template(f"py-{uid}"), namespace=api_ns)
    kube.create(warm_pool(f"wp-{uid}", f"py-{uid}", 1), namespace=api_ns)
    wait_ready_pool(kube, api_ns, f"wp-{uid}", 1)
    r = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"now-{uid}", "timeoutSeconds": 0})
    assert r.status_code == 202 and r.json()["phase"] == "Pending", r.text
    wait_until(lambda: http.get(f"/v1/claims/now-{uid}").json()["phase"] == "Ready", 30, what="bound")
    # A retry with a wait returns the bound claim.
    again = http.post("/v1/claims", json={"pool": f"wp-{uid}", "name": f"now-{uid}"})
    assert again.status_code == 201 and again.json()["launchType"] == "warm"
    # The same name for another pool is a conflict, not a second claim.
    is_error(http.post("/v1/claims", json={"pool": f"orphan-{uid}", "name": f"now-{uid}"}), 404, "not_found")
    kube.create(warm_pool(f"other-{uid}", f"py-{uid}", 0), namespace=api_ns)
    is_error(http.post("/v1/claims", json={"pool": f"other-{uid}", "name": f"now-{uid}"}), 409, "conflict")


def test_the_sdk_works_against_the_kubernetes_operator(kube, operator, api_ns, uid, pod_execd):
    from corral.client import Client, CorralError, NotFound

    kube.create(template(f"py-{uid}"), namespace=api_ns)
    kube.create(warm_pool(f"wp-{uid}", f"py-{uid}", 1), namespace=api_ns)
    (sandbox,) = wait_ready_pool(kube, api_ns, f"wp-{uid}", 1)
    pod_execd(sandbox)
    with Client(url=operator.api_url, token=operator.api_token) as client:
        assert any(p.name == f"wp-{uid}" and p.kind == "WarmPool" for p in client.pools())
        with client.claim(f"wp-{uid}", ttl=300) as sbx:
            assert sbx.claim.launch_type == "warm" and sbx.claim.sandbox.name == sandbox.metadata.name
            result = sbx.commands.run("echo from-the-sdk; exit 3")
            assert result.stdout.strip() == "from-the-sdk" and result.exit_code == 3
            before = sbx.claim.expires_at
            assert sbx.renew(3600).expires_at > before
            name = sbx.name
        # Leaving the block released the claim: it is gone, and so is its warm sandbox (policy Delete).
        with pytest.raises(NotFound):
            client.sandbox(name)
        wait_until(lambda: sandbox_or_none(kube, api_ns, sandbox.metadata.name) is None, 30, what="sandbox deleted")
        with pytest.raises(NotFound):
            client.claim(f"missing-{uid}")
        with pytest.raises(CorralError) as failed:  # env the template does not allow: the claim's Failed condition
            client.claim(f"wp-{uid}", env={"X": "1"})
        assert failed.value.code == "claim_failed" and "envVarsInjectionPolicy" in failed.value.message
