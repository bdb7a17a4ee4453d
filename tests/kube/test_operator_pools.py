"""Pool: capacity bounds while claims come and go, the three recycle strategies, lost sandboxes."""

import re
import threading
import time

import pytest
from kubeutil import (
    Pool,
    Sandbox,
    SandboxClaim,
    bound,
    claim,
    claim_status,
    get_or_none,
    pool,
    sandbox_or_none,
    status,
    template,
    wait_until,
)
from lightkube.resources.core_v1 import Pod

pytestmark = pytest.mark.kube


def members(kube, ns, name):
    return [s for s in kube.list(Sandbox, namespace=ns, labels={"corral.dev/pool": name})]


def ready(s):
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status(s).get("conditions") or [])


def idle(kube, ns, name):
    return [s for s in members(kube, ns, name)
            if "corral.dev/claim" not in (s.metadata.labels or {}) and not s.metadata.deletionTimestamp]


class TotalSampler:
    """Samples the pool's total (all members, including terminating) while a test runs."""

    def __init__(self, kube, ns, name):
        self.max_total = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(kube, ns, name), daemon=True)
        self._t.start()

    def _run(self, kube, ns, name):
        while not self._stop.is_set():
            now = members(kube, ns, name)
            if len(now) > self.max_total:
                self.max_total = len(now)
                self.at_max = [(s.metadata.name, (s.metadata.labels or {}).get("corral.dev/claim"),
                                bool(s.metadata.deletionTimestamp)) for s in now]
            time.sleep(0.1)

    def stop(self):
        self._stop.set()
        self._t.join(5)


def test_buffer_and_total_bounds_while_claims_come_and_go(kube, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(pool("p", "py", capacity={"bufferMin": 2, "bufferMax": 3, "poolMin": 0, "poolMax": 6},
                     recycleStrategy="Delete"), namespace=ns)
    wait_until(lambda: len([s for s in idle(kube, ns, "p") if ready(s)]) == 2, 60, what="buffer of 2")
    sampler = TotalSampler(kube, ns, "p")
    try:
        for i in range(5):
            kube.create(claim(f"c{i}", "p", kind="Pool"), namespace=ns)
        # poolMax 6 bounds allocated + idle: 5 allocated leave room for 1 idle, below bufferMin, never above.
        wait_until(lambda: all(bound(kube, ns, f"c{i}") for i in range(5)), 60, what="5 bound")
        wait_until(lambda: len(members(kube, ns, "p")) == 6, 30, what="total at poolMax")
        time.sleep(2)
        assert len(members(kube, ns, "p")) == 6
        p = status(kube.get(Pool, "p", namespace=ns))
        assert p["allocated"] == 5 and p["total"] == 6
        for i in range(5):
            kube.delete(SandboxClaim, f"c{i}", namespace=ns)
        # Released sandboxes are deleted (recycleStrategy Delete) and the buffer settles back into [2, 3].
        wait_until(lambda: 2 <= len([s for s in idle(kube, ns, "p") if ready(s)]) <= 3
                   and not any("corral.dev/claim" in (s.metadata.labels or {}) for s in members(kube, ns, "p")),
                   60, what="buffer back in bounds")
    finally:
        sampler.stop()
    assert sampler.max_total <= 6, f"pool total reached {sampler.max_total} > poolMax 6: {sampler.at_max}"
    deletes = [int(n) for n in re.findall(rf"pool {ns}/p: deleting (\d+) idle", operator.log())]
    assert all(n <= 1 for n in deletes), f"maxUnavailable 1 exceeded: {deletes}"


def claim_one(kube, ns, pool_name):
    kube.create(claim("c", pool_name, kind="Pool"), namespace=ns)
    st = wait_until(lambda: bound(kube, ns, "c"), 30, what="bound")
    return st["sandbox"]["name"]


@pytest.mark.parametrize("strategy", ["Delete", "Restart", "Noop"])
def test_recycle_strategies(kube, operator, ns, strategy):
    kube.create(template("py"), namespace=ns)
    # bufferMax 2: the returned sandbox fits in the buffer (with bufferMax 1 the pool would trim it at once,
    # not-ready first, which a restarting sandbox is).
    kube.create(pool("p", "py", capacity={"bufferMin": 1, "bufferMax": 2, "poolMin": 0, "poolMax": 5},
                     recycleStrategy=strategy), namespace=ns)
    wait_until(lambda: len([s for s in idle(kube, ns, "p") if ready(s)]) == 1, 60, what="buffer of 1")
    name = claim_one(kube, ns, "p")
    pod_uid = kube.get(Pod, name, namespace=ns).metadata.uid
    wait_until(lambda: len([s for s in idle(kube, ns, "p") if ready(s)]) == 1, 60, what="buffer refilled")
    kube.delete(SandboxClaim, "c", namespace=ns)

    def sandbox():
        return sandbox_or_none(kube, ns, name)

    if strategy == "Delete":
        wait_until(lambda: sandbox() is None, 30, what="released sandbox deleted")
        return
    back = wait_until(lambda: (s := sandbox()) and "corral.dev/claim" not in (s.metadata.labels or {}) and ready(s)
                      and s, 30, what="sandbox back in the pool")
    assert not back.metadata.deletionTimestamp
    if strategy == "Restart":
        # Released, the sandbox can still look Ready on its old pod for a moment (the pod's deletion not yet seen).
        wait_until(lambda: (p := _pod(kube, ns, name)) and p.metadata.uid != pod_uid, 30,
                   what="Restart gives the sandbox a fresh pod")
        wait_until(lambda: (s := sandbox()) and ready(s), 30, what="ready again on the fresh pod")
    else:
        new_uid = wait_until(lambda: (p := _pod(kube, ns, name)) and p.metadata.uid, 30)
        assert new_uid == pod_uid, "Noop keeps the pod as it is"
    time.sleep(1)
    assert len(idle(kube, ns, "p")) == 2, "the returned sandbox and the refill stay (bufferMax 2)"


def _pod(kube, ns, name):
    return get_or_none(kube, Pod, ns, name)


def test_allocated_pod_deleted_is_replaced_and_lost_sandbox_fails_the_claim(kube, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(pool("p", "py", capacity={"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 5}), namespace=ns)
    wait_until(lambda: len([s for s in idle(kube, ns, "p") if ready(s)]) == 1, 60, what="buffer of 1")
    name = claim_one(kube, ns, "p")
    old = kube.get(Pod, name, namespace=ns).metadata.uid
    kube.delete(Pod, name, namespace=ns)
    t0 = time.monotonic()
    wait_until(lambda: (p := _pod(kube, ns, name)) and p.metadata.uid != old
               and ready(kube.get(Sandbox, name, namespace=ns)),
               30, what="replacement pod")
    assert time.monotonic() - t0 < 15
    assert bound(kube, ns, "c")["sandbox"]["name"] == name

    kube.delete(Sandbox, name, namespace=ns)
    st = wait_until(lambda: (s := claim_status(kube, ns, "c")) and s.get("phase") == "Failed" and s, 30,
                    what="claim Failed")
    failed = [c for c in st["conditions"] if c["type"] == "Failed"][0]
    assert failed["reason"] == "SandboxLost" and name in failed["message"]
