"""WarmPool: exact convergence through the scale subresource, slow start, template changes, stuck sandboxes."""

import re
import threading
import time

import pytest
from kubeutil import (
    Sandbox,
    SandboxClaim,
    SandboxTemplate,
    WarmPool,
    claim,
    idle_ready,
    status,
    template,
    wait_until,
    warm_pool,
)
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

pytestmark = pytest.mark.kube


class PodCounter:
    """Counts pod ADDED/DELETED watch events in a namespace (every create the operator makes is seen once)."""

    def __init__(self, kube, ns):
        self.added: set[str] = set()
        self.deleted: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(kube, ns), daemon=True)
        self._thread.start()
        time.sleep(0.5)

    def _run(self, kube, ns):
        try:
            for event, pod in kube.watch(Pod, namespace=ns):
                if self._stop.is_set():
                    return
                if event == "ADDED":
                    self.added.add(pod.metadata.uid)
                elif event == "DELETED":
                    self.deleted.add(pod.metadata.uid)
        except Exception:  # noqa: BLE001 - the stream ends when the test's namespace goes; counts are already in
            if not self._stop.is_set():
                raise

    def stop(self):
        self._stop.set()


def live(kube, ns, pool_name):
    """The pool's unclaimed sandboxes that are not being deleted."""
    return [s for s in kube.list(Sandbox, namespace=ns, labels={"corral.dev/pool": pool_name})
            if not s.metadata.deletionTimestamp and "corral.dev/claim" not in (s.metadata.labels or {})]


def scale(kube, ns, name, replicas):
    kube.patch(WarmPool.Scale, name, {"spec": {"replicas": replicas}}, namespace=ns, patch_type=PatchType.MERGE)


def converged(kube, ns, name, n):
    wp = kube.get(WarmPool, name, namespace=ns)
    st = status(wp)
    return (len(idle_ready(kube, ns, name)) == n and len(live(kube, ns, name)) == n
            and st.get("readyReplicas") == n and st.get("replicas") == n)


def test_scale_0_50_10_0_without_over_creation(kube, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 0), namespace=ns)
    pods = PodCounter(kube, ns)
    try:
        scale(kube, ns, "wp", 50)
        wait_until(lambda: converged(kube, ns, "wp", 50), 180, 0.5, "50 ready")
        time.sleep(2)
        assert len(pods.added) == 50, f"{len(pods.added)} pods created for 50 replicas"
        assert converged(kube, ns, "wp", 50)
        scale(kube, ns, "wp", 10)
        wait_until(lambda: converged(kube, ns, "wp", 10), 120, 0.5, "10 ready")
        scale(kube, ns, "wp", 0)
        wait_until(lambda: converged(kube, ns, "wp", 0), 120, 0.5, "0")
        time.sleep(1)
        assert len(pods.added) == 50, "scaling down must not create anything"
        wp = kube.get(WarmPool, "wp", namespace=ns)
        assert status(wp)["selector"] == "corral.dev/pool=wp,corral.dev/pool-kind=WarmPool"
    finally:
        pods.stop()
    batches = [int(b) for b in re.findall(rf"warmpool {ns}/wp: create batch of (\d+)", operator.log())]
    assert batches[0] == 1, batches
    assert sum(batches) == 50 and batches[:4] == [1, 2, 4, 8], batches


def hashes(kube, ns, name):
    return {(s.metadata.labels or {}).get("corral.dev/blueprint-hash") for s in idle_ready(kube, ns, name)}


def template_hash(kube, ns, name, old=None):
    return wait_until(lambda: (h := status(kube.get(SandboxTemplate, name, namespace=ns)).get("blueprintHash"))
                      and h != old and h, 30, what="template hash")


def test_template_change_recreate(kube, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 3, updateStrategy={"type": "Recreate"}), namespace=ns)
    wait_until(lambda: converged(kube, ns, "wp", 3), 60, what="3 ready")
    old = template_hash(kube, ns, "py")
    old_names = {s.metadata.name for s in live(kube, ns, "wp")}
    kube.patch(SandboxTemplate, "py", {"spec": {"podTemplate": {"spec": {"containers": [
        {"name": "sandbox", "image": "corral/python:bookworm", "command": ["sleep", "infinity"],
         "resources": {"limits": {"memory": "256Mi"}}}]}}}}, namespace=ns, patch_type=PatchType.MERGE)
    new = template_hash(kube, ns, "py", old)
    wait_until(lambda: converged(kube, ns, "wp", 3) and hashes(kube, ns, "wp") == {new}, 60, what="recreated")
    assert not old_names & {s.metadata.name for s in live(kube, ns, "wp")}


def test_template_change_on_replenish(kube, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 3), namespace=ns)
    wait_until(lambda: converged(kube, ns, "wp", 3), 60, what="3 ready")
    old = template_hash(kube, ns, "py")
    kube.patch(SandboxTemplate, "py", {"spec": {"podTemplate": {"spec": {"containers": [
        {"name": "sandbox", "image": "corral/python:bookworm", "command": ["sleep", "infinity"],
         "resources": {"limits": {"memory": "256Mi"}}}]}}}}, namespace=ns, patch_type=PatchType.MERGE)
    new = template_hash(kube, ns, "py", old)
    time.sleep(2)
    assert hashes(kube, ns, "wp") == {old}, "OnReplenish keeps stale idle sandboxes"
    assert status(kube.get(WarmPool, "wp", namespace=ns)).get("updatedReplicas") == 0
    kube.create(claim("c1", "wp"), namespace=ns)
    bound = wait_until(lambda: status(kube.get(SandboxClaim, "c1", namespace=ns)).get("phase") == "Bound"
                       and status(kube.get(SandboxClaim, "c1", namespace=ns)), 30, what="bound")
    taken = kube.get(Sandbox, bound["sandbox"]["name"], namespace=ns)
    assert taken.metadata.labels["corral.dev/blueprint-hash"] == old  # stale ones are claimed first
    wait_until(lambda: converged(kube, ns, "wp", 3) and hashes(kube, ns, "wp") == {old, new}, 60, what="replenished",
               dump=lambda: (old, new, [(s.metadata.name, s.metadata.labels, status(s).get("phase"))
                                        for s in kube.list(Sandbox, namespace=ns)],
                             status(kube.get(WarmPool, "wp", namespace=ns))))
    assert status(kube.get(WarmPool, "wp", namespace=ns)).get("updatedReplicas") == 1


def test_stuck_unready_sandbox_is_replaced_after_the_grace(kube, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", 1, readinessGraceSeconds=10), namespace=ns)
    (first,) = wait_until(lambda: converged(kube, ns, "wp", 1) and live(kube, ns, "wp"), 60, what="1 ready")
    pod = kube.get(Pod, first.metadata.name, namespace=ns)
    conditions = [c.to_dict() for c in pod.status.conditions if c.type != "Ready"]
    conditions.append({"type": "Ready", "status": "False", "reason": "TestUnready"})
    kube.patch(Pod.Status, first.metadata.name, {"status": {"conditions": conditions}}, namespace=ns,
               patch_type=PatchType.MERGE)
    t0 = time.monotonic()
    wait_until(lambda: all(s.metadata.name != first.metadata.name for s in live(kube, ns, "wp"))
               and converged(kube, ns, "wp", 1), 60, 0.5, what="replacement")
    assert time.monotonic() - t0 >= 5, "replaced before the readiness grace"
