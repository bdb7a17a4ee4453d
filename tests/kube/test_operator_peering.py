"""Two operator replicas with kopf peering: exactly one acts, the other stands by; when the active one dies (SIGKILL,
no goodbye), the standby takes over within the peering lifetime, keeps the claims the other bound, and serves new
ones. (kopf pauses every replica when two share a priority, so `python -m corral.operator` gives each a random one.)
The claims API follows: only the active replica's pod carries corral.dev/claims-api=active (what the chart's API
Service selects), and a standby answers 503 instead of serving from its paused view."""

import re
import time

import httpx
import pytest
import yaml
from kubeutil import apply_crd, bound, claim, claim_status, idle_ready, template, wait_until, warm_pool
from lightkube.generic_resource import create_global_resource
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from corral.components.controller_values import CHART_DIR

pytestmark = pytest.mark.kube

ClusterKopfPeering = create_global_resource("kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings")
LIFETIME = 10


@pytest.fixture
def peering(kube):
    crd = yaml.safe_load((CHART_DIR / "crds" / "clusterkopfpeerings.kopf.dev.yaml").read_text())
    apply_crd(kube, crd)  # removed at the end of the session (corral_crds), never mid-session
    kube.create(ClusterKopfPeering.from_dict({"metadata": {"name": "corral-peering-test"}}))
    yield "corral-peering-test"
    kube.delete(ClusterKopfPeering, "corral-peering-test")


def auth(op) -> dict[str, str]:
    return {"Authorization": f"Bearer {op.api_token}"}


def api_pods(kube, ns: str) -> list[str]:
    return sorted(p.metadata.name for p in kube.list(Pod, namespace=ns, labels={"corral.dev/claims-api": "active"}))


def assert_standby_refuses(op) -> None:
    """A standby's indices are paused: it refuses at once (503 with the one error shape), never a 202 after a wait."""
    t0 = time.monotonic()
    for method, path, body in (("POST", "/v1/claims", {"pool": "wp"}), ("GET", "/v1/claims", None)):
        resp = httpx.request(method, f"{op.api_url}{path}", json=body, headers=auth(op), timeout=10)
        assert resp.status_code == 503, resp.text
        assert resp.json()["code"] == "unavailable" and "standby" in resp.json()["message"], resp.text
    assert time.monotonic() - t0 < 5


def binds(op) -> float:
    return sum(v for k, v in op.metrics().items() if k.startswith("corral_claim_latency_seconds_count"))


def test_one_of_two_peered_replicas_acts_and_the_other_takes_over(kube, kube_cluster, operator, peering, ns,
                                                                  tmp_path):
    operator.stop()  # the session's standalone operator steps aside
    replicas = []
    try:
        for i in range(2):
            op = type(operator)(kube_cluster.kubeconfig, tmp_path / f"r{i}")
            op.log_dir.mkdir()
            # The first replica acts alone, pauses when the higher second one appears, and resumes when that one
            # dies: the path where a replica's indices are stale on resume. (Replicas started with identical flags
            # draw distinct random priorities: tests/unit/test_operator_main.py.)
            op.mode = [f"--peering={peering}", f"--priority={i + 1}"]
            # each replica "runs in" a pod of its own (kwok runs it), as under the chart: it labels that pod
            kube.create(Pod(metadata=ObjectMeta(name=f"operator-{i}"), spec=PodSpec(
                containers=[Container(name="operator", image="corral/controller:test")])), namespace=ns)
            op.env = {"CORRAL_PEERING_LIFETIME": str(LIFETIME), "CORRAL_POD_NAME": f"operator-{i}",
                      "CORRAL_NAMESPACE": ns, "CORRAL_API_NAMESPACE": ns}
            op.start()
            replicas.append(op)

        def acting(op) -> bool:
            """kopf starts paused and logs when it resumes or pauses in favour of a peer; a replica that started
            below a live peer never resumes (and never says so)."""
            log = op.log()
            return log.rfind("Resuming operations after the pause") > log.rfind("Pausing operations in favour of")

        def roles():
            paused = [op for op in replicas if not acting(op)]
            return (paused, [op for op in replicas if op not in paused]) if len(paused) == 1 else None

        def settled_roles():
            """Roles that hold for 3 s: the second replica's keepalive reaches the first within that time (the first
            may have been acting alone until then)."""
            first = roles()
            time.sleep(3)
            return first if first is not None and roles() == first else None

        standby_list, active_list = wait_until(settled_roles, 60, 0.5, "exactly one replica acting",
                                               dump=lambda: "\n----\n".join(op.log()[-2000:] for op in replicas))
        (standby,), (active,) = standby_list, active_list
        assert "Possibly conflicting operators" not in standby.log() + active.log()
        serving = {op: f"operator-{replicas.index(op)}" for op in replicas}
        wait_until(lambda: api_pods(kube, ns) == [serving[active]], 20, 0.25, "only the active replica's pod labelled")
        assert_standby_refuses(standby)
        assert httpx.get(f"{active.api_url}/v1/claims", headers=auth(active), timeout=10).status_code == 200
        # Who binds a claim observes its latency: count bound claims per replica. (Write counters would not do: a
        # replica that acted alone before its peer appeared may still finish work it had queued by then.)
        before = {id(op): binds(op) for op in replicas}

        kube.create(template("py"), namespace=ns)
        kube.create(warm_pool("wp", "py", 2), namespace=ns)
        wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 2, 60, 0.25, "two ready", dump=active.log)
        kube.create(claim("a", "wp"), namespace=ns)
        assert wait_until(lambda: bound(kube, ns, "a"), 60, 0.25, "claim a Bound", dump=active.log)
        # only the active replica bound it
        wait_until(lambda: binds(active) == before[id(active)] + 1, 10, 0.25, "the active replica's bind counted")
        assert binds(standby) == before[id(standby)]

        active.kill()  # no goodbye: the standby waits for the keepalive to expire, then resumes
        t0 = time.monotonic()
        kube.create(claim("b", "wp"), namespace=ns)
        st = wait_until(lambda: bound(kube, ns, "b"), LIFETIME * 4 + 60, 0.25, "claim b Bound by the standby",
                        dump=standby.log)
        a = bound(kube, ns, "a")
        assert a is not None, f"claim a lost on takeover: {claim_status(kube, ns, 'a')}"
        assert st["sandbox"]["name"] != a["sandbox"]["name"]
        wait_until(lambda: binds(standby) == before[id(standby)] + 1, 10, 0.25, "the standby (now acting) bound b")
        assert "Resuming operations after the pause" in standby.log()
        # the claims API moved too: the survivor labels its pod and serves (the killed one could not unlabel its
        # pod; in a cluster that pod is not ready, or gone, so no Service routes to it)
        wait_until(lambda: serving[standby] in api_pods(kube, ns), 10, 0.25, "the survivor's pod labelled")
        resp = httpx.get(f"{standby.api_url}/v1/claims/b", headers=auth(standby), timeout=10)
        assert resp.status_code == 200 and resp.json()["phase"] == "Ready", resp.text
        print(f"takeover after SIGKILL: claim b Bound {time.monotonic() - t0:.1f}s later (lifetime {LIFETIME}s)")
    finally:
        for op in replicas:
            op.stop()
        operator.start()


def test_a_resuming_replica_does_not_count_what_was_deleted_while_it_stood_by(kube, kube_cluster, operator, peering,
                                                                            ns, tmp_path):
    """kopf never tells a paused replica about deletions it missed (no DELETED event, and its re-list on resume does
    not drop what is gone), so a WarmPool scaled down while this replica stood by would still count the deleted
    sandbox after a takeover and stay one short when scaled up again. Corral checks the indices against the server on
    resume (corral.operator.resync)."""
    from kubeutil import Sandbox, WarmPool
    from lightkube.types import PatchType

    def live() -> list[str]:
        return sorted(s.metadata.name for s in kube.list(Sandbox, namespace=ns, labels={"corral.dev/pool": "wp"})
                      if not s.metadata.deletionTimestamp)

    def scale(n: int) -> None:
        kube.patch(WarmPool.Scale, "wp", {"spec": {"replicas": n}}, namespace=ns, patch_type=PatchType.MERGE)

    operator.stop()
    first = type(operator)(kube_cluster.kubeconfig, tmp_path / "r0")
    second = type(operator)(kube_cluster.kubeconfig, tmp_path / "r1")
    try:
        for op in (first, second):
            op.log_dir.mkdir()
            op.env = {"CORRAL_PEERING_LIFETIME": str(LIFETIME)}
        first.mode, second.mode = [f"--peering={peering}", "--priority=1"], [f"--peering={peering}", "--priority=2"]
        first.start()  # alone: it acts, and its indices see the pool's two sandboxes
        kube.create(template("py"), namespace=ns)
        kube.create(warm_pool("wp", "py", 2), namespace=ns)
        wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 2, 60, 0.25, "two ready", dump=first.log)
        second.start()
        wait_until(lambda: "Pausing operations in favour of" in first.log(), 30, 0.25, "the first replica paused")
        scale(1)  # the second replica deletes one sandbox; the paused first one never hears of it
        wait_until(lambda: len(live()) == 1, 30, 0.25, "scaled down to one", dump=second.log)
        time.sleep(1)
        second.kill()
        wait_until(lambda: "Resuming operations after the pause" in first.log().rsplit("Pausing operations", 1)[-1],
                   LIFETIME * 4, 0.25, "the first replica resumed")
        wait_until(lambda: "resume: indices checked against the server" in first.log(), 30, 0.25,
                   "the resumed replica checked its indices", dump=first.log)
        hidden = re.search(r"\((\d+) objects deleted during the pause hidden\)", first.log())
        assert hidden and int(hidden.group(1)) >= 1, first.log()[-3000:]  # the sandbox (and its pod, once GC'd)
        scale(2)
        wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 2, 30, 0.25,
                   "scaled up to two again (a ghost would leave it at one)", dump=first.log)
        time.sleep(2)
        assert len(live()) == 2  # and not more: the pool counts exactly what exists
    finally:
        for op in (first, second):
            op.stop()
        operator.start()
