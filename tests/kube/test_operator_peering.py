"""Two operator replicas with kopf peering: exactly one acts, the other stands by; when the active one dies (SIGKILL,
no goodbye), the standby takes over within the peering lifetime, keeps the claims the other bound, and serves new
ones. (kopf pauses every replica when two share a priority, so `python -m corral.operator` gives each a random one.)"""

import time

import pytest
import yaml
from lightkube.generic_resource import create_global_resource

from corral.components.controller_values import CHART_DIR
from kubeutil import apply_crd, bound, claim_status, claim, idle_ready, template, wait_until, warm_pool

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
            op.env = {"CORRAL_PEERING_LIFETIME": str(LIFETIME)}
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
        print(f"takeover after SIGKILL: claim b Bound {time.monotonic() - t0:.1f}s later (lifetime {LIFETIME}s)")
    finally:
        for op in replicas:
            op.stop()
        operator.start()
