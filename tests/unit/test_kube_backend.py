"""The Kubernetes claims backend's pure parts: settings from the environment, SandboxClaim -> API claim, errors."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from corral.api.wire import ClaimRequest
from corral.operator.cache import Cache
from corral.operator.claimsapi.backend import NotFound, Unavailable
from corral.operator.claimsapi.kube_backend import KubeBackend, NotSupported
from corral.operator.claimsapi.kube_server import ApiSettings
from corral.operator.leadership import Leadership


def backend(claims=None):
    cache = Cache()
    cache._idx = {"claims_idx": {("ns", c["metadata"]["name"]): [c] for c in claims or []}}
    cache.bound_at = 1.0
    return KubeBackend(SimpleNamespace(cache=cache, leadership=Leadership()), "ns")


def claim_body(phase=None, **status):
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u1", "creationTimestamp": "2026-01-02T03:04:05Z"},
            "spec": {"poolRef": {"kind": "Pool", "name": "p"},
                     "lifecycle": {"shutdownTime": "2026-01-02T04:00:00Z", "shutdownPolicy": "Retain"}},
            "status": {"phase": phase, **status} if phase else {}}


def test_settings_from_env(tmp_path):
    assert ApiSettings.from_env({}).token == ""
    s = ApiSettings.from_env({"CORRAL_API_TOKEN": " t ", "CORRAL_API_HOST": "127.0.0.1", "CORRAL_API_PORT": "9",
                              "CORRAL_API_NAMESPACE": "sbx"})
    assert (s.token, s.host, s.port, s.namespace) == ("t", "127.0.0.1", 9, "sbx")
    (tmp_path / "tok").write_text("from-file\n")
    s = ApiSettings.from_env({"CORRAL_API_TOKEN": "env", "CORRAL_API_TOKEN_FILE": str(tmp_path / "tok")})
    assert s.token == "from-file" and s.port == 7780 and s.host == "0.0.0.0" and s.namespace == "default"
    with pytest.raises(ValueError):
        ApiSettings.from_env({"CORRAL_API_PORT": "0"})


def test_claim_mapping():
    b = backend()
    pending = b.to_api(claim_body("Pending", conditions=[{"type": "Bound", "status": "False", "reason": "PoolExhausted",
                                                          "message": "Pool p is at poolMax (1); waiting"}]))
    assert pending.phase == "Pending" and pending.sandbox is None and "poolMax" in pending.message
    assert pending.pool_kind == "Pool" and pending.shutdown_policy == "Retain"
    assert pending.expires_at.isoformat() == "2026-01-02T04:00:00+00:00"
    bound = b.to_api(claim_body("Bound", launchType="Warm", boundTime="2026-01-02T03:04:06Z",
                                sandbox={"name": "s1", "podIPs": ["127.18.0.5"], "endpoint": "127.18.0.5:44772"}))
    assert bound.phase == "Ready" and bound.launch_type == "warm" and bound.message is None
    assert bound.sandbox.name == "s1" and bound.sandbox.endpoint == "/v1/claims/c/execd"  # never the pod IP
    assert b.to_api(claim_body("Finished")).phase == "Expired"
    assert b.to_api(claim_body()).phase == "Pending"


def test_a_bound_claim_whose_sandbox_turned_not_ready_is_not_shown_ready():
    """execd stayed gone: the pod's readiness probe (execd's health) fails, the Sandbox's Ready condition follows,
    and the API must not answer Ready for its claim."""
    b = backend()
    sbx = {"metadata": {"name": "s1", "namespace": "ns", "uid": "su", "labels": {}},
           "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "PodRunning",
                                      "message": "containers with unready status: [sandbox]"}]}}
    b.ctx.cache._idx["sandboxes_idx"] = {("ns", "s1"): [sbx]}
    body = claim_body("Bound", boundTime="2026-01-02T03:04:06Z", sandbox={"name": "s1", "podIPs": ["127.18.0.5"]})
    c = b.to_api(body)
    assert c.phase == "Pending" and "s1 is not ready" in c.message and "unready" in c.message
    sbx["status"]["conditions"][0]["status"] = "True"
    assert b.to_api(body).phase == "Ready"


def test_failed_claims_become_typed_errors():
    b = backend()
    user = b._failed(claim_body("Failed", conditions=[{"type": "Failed", "status": "True",
                                                        "reason": "EnvVarsNotAllowed", "message": "no env"}]))
    assert (user.status, user.code) == (400, "claim_failed") and "EnvVarsNotAllowed" in user.message
    timeout = b._failed(claim_body("Failed", conditions=[{"type": "Failed", "status": "True", "reason": "Timeout",
                                                           "message": "no sandbox within 300s"}]))
    assert timeout.status == 503 and "no sandbox within 300s" in timeout.message


def test_docker_only_operations_are_refused_clearly():
    b = backend([claim_body("Bound")])
    for call in (b.pause_claim("c"), b.resume_claim("c"), b.snapshot_claim("c", None)):
        with pytest.raises(NotSupported) as err:
            asyncio.run(call)
        assert err.value.status == 400 and err.value.code == "not_supported" and "Docker" in err.value.message
    with pytest.raises(NotSupported):
        asyncio.run(b.create_claim(ClaimRequest(pool="p", snapshot="img:tag")))
    for call in (b.list_snapshots(), b.delete_snapshot("corral-snapshot/x:1")):  # every snapshot route alike
        with pytest.raises(NotSupported) as err:
            asyncio.run(call)
        assert err.value.code == "not_supported" and "Docker" in err.value.message


def sandbox_body(name, labels, annotations=None, owners=(), phase="Running", ready=True):
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "labels": labels,
                         "annotations": annotations or {}, "ownerReferences": list(owners),
                         "creationTimestamp": "2026-01-02T03:00:00Z"},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_retained_sandboxes_are_the_marked_ones_and_only_those_are_deleted():
    """The operator's Retain path marks the sandbox (builders.retain_patch); the API lists those (and unmarked ones
    retained before the mark existed: operator-made, no owner, pool or claim) and deletes nothing else."""
    from corral.operator.builders import is_retained, retain_patch

    patch = retain_patch("c1", "python", "2026-01-02T04:00:00Z")
    meta = patch["metadata"]
    assert meta["ownerReferences"] == [] and meta["labels"]["corral.dev/retained"] == "true"
    assert meta["labels"]["corral.dev/claim"] is None and meta["labels"]["corral.dev/pool"] is None
    managed = {"app.kubernetes.io/managed-by": "corral-operator", "corral.dev/template": "python"}
    marked = sandbox_body("kept", {**managed, **meta["labels"]}, meta["annotations"])
    legacy = sandbox_body("old", managed, phase="Pending", ready=False)
    member = sandbox_body("idle", {**managed, "corral.dev/pool": "python"}, owners=[{"uid": "wp"}])
    bound = sandbox_body("bound", {**managed, "corral.dev/claim": "c2"}, owners=[{"uid": "c2"}])
    foreign = sandbox_body("mine", {"corral.dev/template": "python"})  # made by hand, not by the operator
    assert [is_retained(b) for b in (marked, legacy, member, bound, foreign)] == [True, True, False, False, False]

    deleted = []

    async def delete(kind, name, ns, *, uid=None, **_):
        deleted.append((kind, name, ns, uid))

    b = backend()
    b.ctx.kube = SimpleNamespace(delete=delete)
    b.ctx.cache._idx["sandboxes_idx"] = {("ns", x["metadata"]["name"]): [x]
                                         for x in (marked, legacy, member, bound, foreign)}
    listed = asyncio.run(b.list_retained())
    assert [(r.name, r.claim, r.pool, r.template, r.state, r.ready) for r in listed] == [
        ("old", None, None, "python", "Pending", False), ("kept", "c1", "python", "python", "Running", True)]
    assert listed[1].retained_at.isoformat() == "2026-01-02T04:00:00+00:00"
    for name in ("idle", "bound", "mine"):
        with pytest.raises(NotFound):
            asyncio.run(b.delete_retained(name))
    asyncio.run(b.delete_retained("kept"))
    assert deleted == [("Sandbox", "kept", "ns", "u-kept")]


def test_manifest_keeps_the_claim_alive_longer_than_the_wait():
    m = backend()._manifest("c", "WarmPool", ClaimRequest(pool="wp", env={"A": "1"}, ttl_seconds=60,
                                                          timeout_seconds=5))
    spec = m["spec"]
    assert spec["poolRef"] == {"kind": "WarmPool", "name": "wp"} and spec["env"] == [{"name": "A", "value": "1"}]
    assert spec["timeoutSeconds"] == 300 and spec["lifecycle"]["shutdownPolicy"] == "Delete"
    assert spec["lifecycle"]["shutdownTime"].endswith("Z") and m["metadata"]["namespace"] == "ns"


def test_a_standby_replica_refuses_with_503_and_says_why():
    b = backend([claim_body("Bound")])
    b.ctx.leadership.active, b.ctx.leadership.peering = False, "corral"
    for call in (b.get_claim("c"), b.list_claims(), b.create_claim(ClaimRequest(pool="p")), b.delete_claim("c"),
                 b.list_pools(), b.execd_target("c"), b.list_retained(), b.delete_retained("s")):
        with pytest.raises(Unavailable) as err:
            asyncio.run(call)
        assert err.value.status == 503 and "standby" in err.value.message and "'corral'" in err.value.message
    b.ctx.leadership.active = True
    assert asyncio.run(b.get_claim("c")).phase == "Ready"
