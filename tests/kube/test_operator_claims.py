"""Claims: warm/cold under concurrency, env through execd, policies as conditions, the lifecycle."""

import asyncio
import time
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from kubeutil import (
    Sandbox,
    SandboxClaim,
    bound,
    claim,
    claim_status,
    claim_token,
    get_or_none,
    idle_ready,
    sandbox_or_none,
    status,
    template,
    wait_until,
    warm_pool,
)
from lightkube import AsyncClient, KubeConfig

pytestmark = pytest.mark.kube


def wait_ready_pool(kube, ns, name, n, timeout=120):
    wait_until(lambda: len(idle_ready(kube, ns, name)) == n, timeout, 0.5, f"{n} ready in {name}")


async def create_all(kubeconfig, ns, objs):
    """Create objects concurrently (one async client, all requests in flight at once)."""
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager="corral-tests")
    try:
        await asyncio.gather(*(client.create(o, namespace=ns) for o in objs))
    finally:
        await client.close()


def test_200_concurrent_claims_against_a_warm_pool_of_50(kube, kube_cluster, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 50), namespace=ns)
    wait_ready_pool(kube, ns, "wp", 50)
    names = [f"c{i:03d}" for i in range(200)]
    t0 = time.monotonic()
    asyncio.run(create_all(kube_cluster.kubeconfig, ns, [claim(n, "wp") for n in names]))
    burst = time.monotonic() - t0

    def all_bound():
        claims = {c.metadata.name: status(c) for c in kube.list(SandboxClaim, namespace=ns)}
        return claims if all(claims.get(n, {}).get("phase") == "Bound" for n in names) else None

    claims = wait_until(all_bound, 240, 1, "200 claims Bound")
    launch = [c["launchType"] for c in claims.values()]
    counts = {t: launch.count(t) for t in set(launch)}
    assert launch.count("Warm") == 50 and launch.count("Cold") == 150, f"{counts}; the burst took {burst:.2f}s"
    sandboxes = [c["sandbox"]["name"] for c in claims.values()]
    assert len(set(sandboxes)) == 200, "a sandbox was bound twice"
    owners = {s.metadata.name: (s.metadata.labels or {}).get("corral.dev/claim")
              for s in kube.list(Sandbox, namespace=ns)}
    for name, st in claims.items():
        assert owners[st["sandbox"]["name"]] == name
        assert st["sandbox"]["endpoint"].startswith("127.")


def test_warm_claim_env_reaches_execd(kube, operator, ns, pod_execd):
    kube.create(template("py", env_policy="Allowed"), namespace=ns)
    kube.create(warm_pool("wp", "py", 1), namespace=ns)
    wait_ready_pool(kube, ns, "wp", 1)
    (sandbox,) = idle_ready(kube, ns, "wp")
    execd = pod_execd(sandbox)
    kube.create(claim("c", "wp", env=[{"name": "GREETING", "value": "hello from the claim"}]), namespace=ns)
    st = wait_until(lambda: bound(kube, ns, "c"), 30, what="bound")
    assert st["launchType"] == "Warm" and st["sandbox"]["name"] == sandbox.metadata.name
    assert httpx.get(f"{execd.url}/v1/env", headers={"Authorization": f"Bearer {execd.token}"}).status_code == 401
    execd.token = claim_token(kube, ns, sandbox.metadata.name, "c")  # the env came with the claim's own token
    out = execd.run("echo $GREETING")
    assert out["stdout"].strip() == "hello from the claim"


def test_disallowed_env_is_a_condition_not_a_retry_storm(kube, operator, ns):
    kube.create(template("py", env_policy="Disallowed"), namespace=ns)
    kube.create(warm_pool("wp", "py", 1), namespace=ns)
    wait_ready_pool(kube, ns, "wp", 1)
    kube.create(claim("c", "wp", env=[{"name": "X", "value": "1"}]), namespace=ns)
    st = wait_until(lambda: (s := claim_status(kube, ns, "c")) and s.get("phase") == "Failed" and s, 30)
    failed = [c for c in st["conditions"] if c["type"] == "Failed"][0]
    assert failed["reason"] == "EnvVarsNotAllowed" and "envVarsInjectionPolicy" in failed["message"]
    rv = kube.get(SandboxClaim, "c", namespace=ns).metadata.resourceVersion
    time.sleep(3)
    assert kube.get(SandboxClaim, "c", namespace=ns).metadata.resourceVersion == rv, "the claim keeps changing"
    assert operator.log().count(f"claim {ns}/c Failed: EnvVarsNotAllowed") == 1, "the failure was decided once"
    assert len(idle_ready(kube, ns, "wp")) == 1, "the warm sandbox was not consumed"


def shutdown_at(seconds):
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("policy", ["Delete", "DeleteForeground", "Retain"])
def test_shutdown_policies_and_ttl(kube, operator, ns, policy):
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 1), namespace=ns)
    wait_ready_pool(kube, ns, "wp", 1)
    kube.create(claim("c", "wp", lifecycle={"shutdownTime": shutdown_at(4), "shutdownPolicy": policy,
                                            "ttlSecondsAfterFinished": 3}), namespace=ns)
    st = wait_until(lambda: bound(kube, ns, "c"), 30, what="bound")
    sandbox = st["sandbox"]["name"]
    finished = wait_until(lambda: (s := claim_status(kube, ns, "c")) and s.get("phase") == "Finished" and s, 30,
                          what="Finished at shutdownTime")
    assert [c for c in finished["conditions"] if c["type"] == "Bound"][0]["reason"] == "ShutdownTime"
    if policy == "Retain":
        kept = sandbox_or_none(kube, ns, sandbox)
        assert kept is not None and not kept.metadata.deletionTimestamp
        assert "corral.dev/claim" not in (kept.metadata.labels or {}) and not kept.metadata.ownerReferences
    else:
        wait_until(lambda: sandbox_or_none(kube, ns, sandbox) is None, 30, what="sandbox deleted")
    # ttlSecondsAfterFinished: the claim itself goes away.
    wait_until(lambda: claim_status(kube, ns, "c") is None, 30, what="claim deleted after its TTL")
    if policy == "Retain":
        time.sleep(2)
        assert sandbox_or_none(kube, ns, sandbox) is not None, "Retain: the sandbox outlives the claim"


def test_a_deleted_claims_sandbox_and_pod_are_deleted_by_the_operator(kube, operator, ns):
    """Releasing a claim (deleting it) deletes its sandbox and pod at once, by the operator itself, not when
    kube-controller-manager's garbage collector (a rate-limited client shared by every controller) gets to them:
    the operator's own Sandbox and Pod delete counters go up by one each, and both objects are gone."""
    from lightkube.resources.core_v1 import Pod

    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 1), namespace=ns)
    wait_ready_pool(kube, ns, "wp", 1)
    kube.create(claim("c", "wp"), namespace=ns)
    sandbox = wait_until(lambda: bound(kube, ns, "c"), 30, what="bound")["sandbox"]["name"]

    def deletes(kind):
        return operator.metrics().get(f'corral_api_requests_total{{resource="{kind}",verb="delete"}}', 0.0)

    before = deletes("Sandbox"), deletes("Pod")
    kube.delete(SandboxClaim, "c", namespace=ns)
    wait_until(lambda: sandbox_or_none(kube, ns, sandbox) is None, 30, what="the claim's sandbox deleted")
    wait_until(lambda: get_or_none(kube, Pod, ns, sandbox) is None, 30, what="its pod deleted")
    assert (deletes("Sandbox"), deletes("Pod")) == (before[0] + 1, before[1] + 1), \
        "the operator did not delete the released claim's sandbox and pod itself"
    wait_ready_pool(kube, ns, "wp", 1)  # and the pool refills as before


def test_claim_made_before_its_pool_and_template_binds_once_they_exist(kube, operator, ns):
    """Nothing else wakes a claim that found its pool missing before its timeout (300 s): the pool does, when it
    appears. (Also what a replica resuming from a peering pause meets: its claims stream may re-list first.)"""
    kube.create(claim("early", "later"), namespace=ns)
    pending = wait_until(lambda: (s := claim_status(kube, ns, "early")) and s.get("phase") and s, 10)
    assert pending["conditions"][0]["reason"] == "PoolNotFound"
    kube.create(warm_pool("later", "later-py", 1), namespace=ns)
    time.sleep(1)
    kube.create(template("later-py"), namespace=ns)
    st = wait_until(lambda: bound(kube, ns, "early"), 30, 0.2, "claim Bound after its pool and template appeared "
                    "(well before its 300 s timeout)", dump=operator.log)
    assert st["sandbox"]["name"]


def test_claim_times_out_when_the_pool_does_not_exist(kube, operator, ns):
    kube.create(claim("c", "missing", timeoutSeconds=3), namespace=ns)
    pending = wait_until(lambda: (s := claim_status(kube, ns, "c")) and s.get("phase") and s, 10)
    assert pending["phase"] == "Pending"
    assert pending["conditions"][0]["reason"] == "PoolNotFound"
    st = wait_until(lambda: (s := claim_status(kube, ns, "c")) and s.get("phase") == "Failed" and s, 20)
    assert [c for c in st["conditions"] if c["type"] == "Failed"][0]["reason"] == "Timeout"
