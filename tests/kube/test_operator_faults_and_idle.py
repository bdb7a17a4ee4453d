"""The operator killed mid-burst converges exactly; with nothing changing it makes no API calls at all."""

import asyncio
import time
from collections import Counter

import pytest
from kubeutil import Sandbox, SandboxClaim, WarmPool, claim, idle_ready, status, template, wait_until, warm_pool
from lightkube.resources.core_v1 import Namespace
from test_operator_claims import create_all

pytestmark = pytest.mark.kube


def test_sigkill_during_a_100_claim_burst(kube, kube_cluster, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 30), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 30, 120, 0.5, "30 ready")
    names = [f"c{i:03d}" for i in range(100)]

    async def burst_and_kill():
        create = asyncio.create_task(create_all(kube_cluster.kubeconfig, ns, [claim(n, "wp") for n in names]))
        await asyncio.sleep(0.4)
        operator.kill()  # SIGKILL: no cleanup, in-flight writes lost mid-way
        await create

    asyncio.run(burst_and_kill())
    bound_before_restart = sum(1 for c in kube.list(SandboxClaim, namespace=ns) if status(c).get("phase") == "Bound")
    operator.start()

    def converged():
        claims = {c.metadata.name: status(c) for c in kube.list(SandboxClaim, namespace=ns)}
        return claims if len(claims) == 100 and all(c.get("phase") == "Bound" for c in claims.values()) else None

    claims = wait_until(converged, 240, 1, "every claim Bound after the restart")
    assert bound_before_restart < 100, "the kill came too late to test anything"
    used = Counter(c["sandbox"]["name"] for c in claims.values())
    assert max(used.values()) == 1, "a sandbox is bound to two claims"

    def settled():
        sandboxes = [s for s in kube.list(Sandbox, namespace=ns) if not s.metadata.deletionTimestamp]
        by_claim = Counter((s.metadata.labels or {}).get("corral.dev/claim") for s in sandboxes)
        idle = [s for s in sandboxes if "corral.dev/claim" not in (s.metadata.labels or {})]
        orphans = [s.metadata.name for s in idle if (s.metadata.labels or {}).get("corral.dev/pool") != "wp"]
        doubles = {c: n for c, n in by_claim.items() if c and n > 1}
        ok = not orphans and not doubles and len(idle) == 30 and all(by_claim.get(n) == 1 for n in names)
        return (sandboxes, by_claim) if ok else None

    sandboxes, by_claim = wait_until(settled, 120, 1, "no orphans, one sandbox per claim, 30 idle",
                                     dump=lambda: Counter((s.metadata.labels or {}).get("corral.dev/claim")
                                                          for s in kube.list(Sandbox, namespace=ns)).most_common(3))
    for name, st in claims.items():
        labels = next(s.metadata.labels for s in sandboxes if s.metadata.name == st["sandbox"]["name"])
        assert labels["corral.dev/claim"] == name


def test_idle_operator_makes_no_api_calls_and_restarts_with_500_sandboxes(kube, operator, ns):
    # Other tests' namespaces are deleted in the background; their teardown is not "idle". Wait for it.
    wait_until(lambda: not [n for n in kube.list(Namespace)
                            if n.metadata.name.startswith("t-") and n.metadata.name != ns],
               300, 2, "other test namespaces gone")
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 500), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 500, 600, 2, "500 ready")
    wait_until(lambda: status(kube.get(WarmPool, "wp", namespace=ns)).get("readyReplicas") == 500,
               60, 1, "status caught up")
    time.sleep(5)  # let the last status writes land
    before = operator.metrics()
    time.sleep(120)
    after = operator.metrics()
    calls = {k: after[k] - before.get(k, 0) for k in after
             if k.startswith("corral_api_requests_total") and after[k] != before.get(k, 0)}
    # The hot kinds' watches (operator/informer.py) are counted as they open: each is renewed when the server ends
    # it (every 600 s), so a 120 s window may catch one renewal per kind, never more (no re-list, no busy loop).
    renewals = {k: v for k, v in calls.items() if 'verb="watch"' in k}
    assert all(v <= 1 for v in renewals.values()), f"watches re-opened while idle: {renewals}"
    calls = {k: v for k, v in calls.items() if k not in renewals}
    assert calls == {}, f"API calls while idle: {calls}"
    reconciles = {k: after[k] - before.get(k, 0) for k in after
                  if k.startswith("corral_reconciles_total") and after[k] != before.get(k, 0)}
    assert reconciles == {}, f"reconciles while idle (polling?): {reconciles}"

    # A restart with 500 sandboxes and 500 pods (more objects of one kind than kopf once ran workers for: the
    # operator deadlocked filling its indices) is ready to serve a warm claim.
    operator.stop()
    operator.start()
    kube.create(claim("after-restart", "wp"), namespace=ns)

    def bound():
        st = status(kube.get(SandboxClaim, "after-restart", namespace=ns))
        return st if st.get("phase") == "Bound" else None

    assert wait_until(bound, 120, 0.5, "a claim bound after the restart")["launchType"] == "Warm"


def test_deleting_a_namespace_does_not_make_the_operator_repair_what_goes_with_it(kube, operator):
    """The namespace controller deletes the pods before (some of) their sandboxes: each such sandbox looks like one
    to repair (a GET, then a pod create the server refuses). The first refusal tells the operator the namespace is
    going; the rest of its sandboxes and pools are left alone. (Was: ~3.7 calls per sandbox during the teardown.)"""
    import uuid

    from lightkube.models.meta_v1 import ObjectMeta

    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    kube.create(template("py"), namespace=name)
    kube.create(warm_pool("wp", "py", 60), namespace=name)
    wait_until(lambda: len(idle_ready(kube, name, "wp")) == 60, 120, 0.5, "60 ready", dump=operator.log)
    time.sleep(2)
    before = operator.metrics()
    kube.delete(Namespace, name)
    wait_until(lambda: not [n for n in kube.list(Namespace) if n.metadata.name == name], 120, 1, "namespace gone")
    time.sleep(2)
    after = operator.metrics()
    calls = {k.split("{", 1)[1].rstrip("}"): after[k] - before.get(k, 0) for k in after
             if k.startswith("corral_api_requests_total") and after[k] != before.get(k, 0)}
    repairs = {'resource="Pod",verb="create"', 'resource="Sandbox",verb="get"', 'resource="Sandbox",verb="create"'}
    repairs = sum(v for k, v in calls.items() if k in repairs)
    assert repairs <= 8, calls  # the first repair (a GET and a create) and what raced it, not one or two per sandbox
