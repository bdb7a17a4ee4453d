"""A claim waiting on a Pool at poolMax: it waits (PoolExhausted) without starving the operator, and binds as soon
as a sandbox is released. (It used to livelock: the claim re-queued its pool and the pool every pending claim, with
no I/O in between, so the event loop never ran again - no watch events, no health answers, SIGTERM ignored.)"""

import time

import httpx
import pytest
from kubeutil import SandboxClaim, bound, claim, claim_status, pool, template, wait_until, warm_pool

pytestmark = pytest.mark.kube


def test_claim_waits_for_an_exhausted_pool_without_starving_the_operator(kube, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(pool("p", "py", capacity={"bufferMin": 0, "bufferMax": 1, "poolMin": 0, "poolMax": 1},
                     recycleStrategy="Delete"), namespace=ns)
    kube.create(claim("first", "p", kind="Pool"), namespace=ns)
    first = wait_until(lambda: bound(kube, ns, "first"), 60, what="first claim Bound", dump=operator.log)
    kube.create(claim("second", "p", kind="Pool", timeoutSeconds=300), namespace=ns)

    def exhausted():
        st = claim_status(kube, ns, "second") or {}
        return any(c.get("reason") == "PoolExhausted" for c in st.get("conditions") or [])

    wait_until(exhausted, 30, what="second claim waiting with PoolExhausted", dump=operator.log)
    # The operator stays responsive while the claim waits: its health endpoint answers and other work goes on.
    writes_before = operator.api_calls({"patch", "create", "delete"})
    for _ in range(3):
        assert httpx.get(f"http://127.0.0.1:{operator.health_port}/healthz", timeout=5).status_code == 200
        time.sleep(0.5)
    kube.create(warm_pool("wp", "py", 1), namespace=ns)
    kube.create(claim("other", "wp"), namespace=ns)
    wait_until(lambda: bound(kube, ns, "other"), 60, what="an unrelated warm-pool claim Bound", dump=operator.log)
    assert (claim_status(kube, ns, "second") or {}).get("phase") == "Pending"
    assert operator.api_calls({"patch", "create", "delete"}) - writes_before < 20  # no write storm while waiting
    # Releasing the first claim frees the pool: the waiting claim binds.
    kube.delete(SandboxClaim, "first", namespace=ns)
    second = wait_until(lambda: bound(kube, ns, "second"), 60, what="second claim Bound after release",
                        dump=operator.log)
    assert second["sandbox"]["name"] != first["sandbox"]["name"]  # recycleStrategy Delete: a fresh one
