"""The Kubernetes reconcilers (corral.operator.reconcile) against an in-memory API (fakekube.py): real reconcile
functions, a real Context and Cache, and the API calls they make counted and checked.

Scenarios: two claims racing for one warm sandbox; a WarmPool's refill paced by a claim stream; a claim that
outlives its pool; lost pods in a namespace being deleted; a refill whose creates fail.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fakekube import FakeKube, Operator, iso
from lightkube import ApiError

from corral.api.common import API_VERSION
from corral.api.template import EXECD_DEFAULT_PORT
from corral.components import catalogue
from corral.operator.builders import owner_ref, sandbox_labels, sandbox_manifest
from corral.operator.constants import A_LAUNCH, L_CLAIM, L_MANAGED_BY, L_SANDBOX, MANAGED_BY
from corral.operator.reconcile.claims import reconcile_claim
from corral.operator.reconcile.pools import reconcile_warmpool
from corral.operator.reconcile.sandboxes import reconcile_sandbox

NS = "team"
TEMPLATE = "shell"


# ---- objects -------------------------------------------------------------------------------------------------------
def put_template(fake: FakeKube) -> dict[str, Any]:
    return fake.put({"apiVersion": API_VERSION, "kind": "SandboxTemplate",
                     "metadata": {"name": TEMPLATE, "namespace": NS}, "spec": catalogue.render("shell").to_k8s()})


def put_warmpool(fake: FakeKube, name: str = "wp", replicas: int = 2) -> dict[str, Any]:
    return fake.put({"apiVersion": API_VERSION, "kind": "WarmPool", "metadata": {"name": name, "namespace": NS},
                     "spec": {"replicas": replicas, "templateRef": {"name": TEMPLATE}}})


def put_pool(fake: FakeKube, name: str = "p") -> dict[str, Any]:
    return fake.put({"apiVersion": API_VERSION, "kind": "Pool", "metadata": {"name": name, "namespace": NS},
                     "spec": {"templateRef": {"name": TEMPLATE},
                              "capacity": {"bufferMin": 0, "bufferMax": 2, "poolMin": 0, "poolMax": 4}}})


def put_claim(fake: FakeKube, name: str, pool: str = "wp", kind: str = "WarmPool") -> dict[str, Any]:
    return fake.put({"apiVersion": API_VERSION, "kind": "SandboxClaim", "metadata": {"name": name, "namespace": NS},
                     "spec": {"poolRef": {"kind": kind, "name": pool}}})


def run_pod(fake: FakeKube, sandbox: str, ip: str, node: str = "n1") -> None:
    """The kubelet: the sandbox's pod (made by the operator, or stood in for) runs and is Ready."""
    pod = fake.objects.get(("Pod", NS, sandbox))
    if pod is None:
        owner = fake.objects[("Sandbox", NS, sandbox)]
        pod = fake.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": sandbox, "namespace": NS, "labels": {L_SANDBOX: sandbox, L_MANAGED_BY: MANAGED_BY},
            "ownerReferences": [owner_ref(owner)]}, "spec": {}})
        pod = fake.objects[("Pod", NS, sandbox)]
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                     "conditions": [{"type": "Ready", "status": "True"}]}


def put_member(fake: FakeKube, pool: dict[str, Any], bp_hash: str, name: str, *, ready: bool = True,
               ip: str = "127.0.0.1", node: str = "n1", created: float | None = None) -> None:
    """A pool member as the pool and sandbox reconcilers leave it: Ready (with a running pod) or still starting."""
    kind = pool["kind"]
    template = fake.objects[("SandboxTemplate", NS, TEMPLATE)]
    body = sandbox_manifest(name=name, namespace=NS, template_name=TEMPLATE, blueprint=template["spec"],
                            labels=sandbox_labels(TEMPLATE, pool=pool["metadata"]["name"], pool_kind=kind,
                                                  bp_hash=bp_hash), owner=owner_ref(pool))
    body["metadata"]["creationTimestamp"] = iso(created if created is not None else time.time())
    if ready:
        since = body["metadata"]["creationTimestamp"]
        body["status"] = {"phase": "Running", "podIPs": [ip], "endpoint": f"{ip}:{EXECD_DEFAULT_PORT}",
                          "nodeName": node, "conditions": [{"type": "Ready", "status": "True", "reason": "PodReady",
                                                            "lastTransitionTime": since}]}
    fake.put(body)
    if ready:
        run_pod(fake, name, ip, node)


def claim_status(fake: FakeKube, name: str) -> dict[str, Any]:
    return (fake.find("SandboxClaim", NS, name) or {}).get("status") or {}


def claimed_by(fake: FakeKube, sandbox: str) -> str | None:
    obj = fake.find("Sandbox", NS, sandbox)
    return None if obj is None else (obj["metadata"].get("labels") or {}).get(L_CLAIM)


def bp_hash_of(op: Operator) -> str:
    return op.ctx.templates.spec(op.kube.objects[("SandboxTemplate", NS, TEMPLATE)])[1]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Wall-clock time as the reconcilers read it (time.time), moved by the test: clock[0] = t."""
    now = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    return now


# ---- adoption: one conditional write, a 409 moves on ----------------------------------------------------------------
async def test_two_claims_racing_for_one_warm_sandbox_the_loser_gets_409_and_adopts_the_next() -> None:
    # Two operator processes (a peering handover, say) with the same view of the pool: both try the same first
    # candidate. The sandbox's resourceVersion decides: one adoption, one 409, and the loser takes the next one.
    fake = FakeKube()
    put_template(fake)
    wp = put_warmpool(fake, replicas=2)
    first, second = Operator(fake), Operator(fake)
    h = bp_hash_of(first)
    put_member(fake, wp, h, "wp-old", ip="127.0.0.1", created=time.time() - 60)  # oldest: everyone's first choice
    put_member(fake, wp, h, "wp-new", ip="127.0.0.2")
    put_claim(fake, "c1")
    put_claim(fake, "c2")
    first.sync()
    second.sync()

    await reconcile_claim(first.ctx, NS, "c1")
    await reconcile_claim(second.ctx, NS, "c2")  # its cache still shows wp-old idle

    patches = [(c.name, c.code) for c in fake.made("patch", "Sandbox")]
    assert patches == [("wp-old", None), ("wp-old", 409), ("wp-new", None)]
    assert claimed_by(fake, "wp-old") == "c1" and claimed_by(fake, "wp-new") == "c2"
    for claim, sandbox in (("c1", "wp-old"), ("c2", "wp-new")):
        status = claim_status(fake, claim)
        assert (status["phase"], status["sandbox"]["name"], status["launchType"]) == ("Bound", sandbox, "Warm")
    assert not second.ctx.claims.is_reserved("team", "wp-old")  # the lost candidate is not held back
    assert fake.made("create") == []  # nobody went cold
    # Each sandbox owned by its claim now: deleting the claim deletes it, the pool no longer does.
    assert [r["name"] for r in fake.objects[("Sandbox", NS, "wp-new")]["metadata"]["ownerReferences"]] == ["c2"]


async def test_concurrent_claims_in_one_process_never_share_a_sandbox_and_the_rest_start_cold() -> None:
    fake = FakeKube()
    put_template(fake)
    wp = put_warmpool(fake, replicas=2)
    op = Operator(fake)
    h = bp_hash_of(op)
    put_member(fake, wp, h, "wp-a", ip="127.0.0.1")
    put_member(fake, wp, h, "wp-b", ip="127.0.0.2")
    for i in range(3):
        put_claim(fake, f"c{i}")
    op.sync()

    await asyncio.gather(*(reconcile_claim(op.ctx, NS, f"c{i}") for i in range(3)))

    warm = {claim_status(fake, f"c{i}").get("sandbox", {}).get("name") for i in range(3)} - {None}
    assert warm == {"wp-a", "wp-b"}  # two warm, on two different sandboxes
    assert [c.code for c in fake.made("patch", "Sandbox")] == [None, None]  # reservations: no 409 within a process
    cold = fake.made("create", "Sandbox")
    assert len(cold) == 1 and cold[0].body["metadata"]["annotations"][A_LAUNCH] == "Cold"


@pytest.mark.parametrize("meanwhile", ["taken", "deleted"])
async def test_a_candidate_gone_since_the_cache_saw_it_is_skipped(meanwhile: str) -> None:
    fake = FakeKube()
    put_template(fake)
    wp = put_warmpool(fake, replicas=2)
    op = Operator(fake)
    h = bp_hash_of(op)
    put_member(fake, wp, h, "wp-a", ip="127.0.0.1", created=time.time() - 60)
    put_member(fake, wp, h, "wp-b", ip="127.0.0.2")
    put_claim(fake, "c1")
    op.sync()

    def other_writer(call: Any) -> None:  # another claimant's write lands just before ours
        if call.name == "wp-a" and fake.find("Sandbox", NS, "wp-a"):
            if meanwhile == "taken":
                fake.edit("Sandbox", NS, "wp-a", {"metadata": {"labels": {L_CLAIM: "someone"}}})
            else:
                fake.remove("Sandbox", NS, "wp-a")

    fake.before("patch", "Sandbox", other_writer)
    await reconcile_claim(op.ctx, NS, "c1")

    mine = [(c.name, c.code) for c in fake.made("patch", "Sandbox") if (c.body["metadata"].get("labels") or {})
            .get(L_CLAIM) == "c1"]
    assert mine == [("wp-a", 409 if meanwhile == "taken" else 404), ("wp-b", None)]
    assert claim_status(fake, "c1")["sandbox"]["name"] == "wp-b"


# ---- refill pacing ---------------------------------------------------------------------------------------------------
def _stream_setup(ready: int, replicas: int = 20) -> tuple[FakeKube, Operator]:
    fake = FakeKube()
    put_template(fake)
    wp = put_warmpool(fake, replicas=replicas)
    op = Operator(fake, {"claim_quiet": 0.15, "max_refill_defer": 1.0})
    h = bp_hash_of(op)
    for i in range(replicas):  # the unready ones are still starting (well within their readiness grace)
        put_member(fake, wp, h, f"wp-{i:02d}", ready=i < ready, ip=f"127.0.0.{i + 1}", node=f"n{i % 3}")
    op.sync()
    return fake, op


async def _claim(fake: FakeKube, op: Operator, name: str) -> None:
    put_claim(fake, name)
    op.sync()
    await reconcile_claim(op.ctx, NS, name)
    op.sync()
    assert claim_status(fake, name)["launchType"] == "Warm"


async def test_a_claim_stream_defers_the_refill_until_a_quiet_moment(clock: list[float]) -> None:
    fake, op = _stream_setup(ready=20)
    t0 = clock[0]
    await _claim(fake, op, "c0")
    clock[0] = t0 + 0.05
    await reconcile_warmpool(op.ctx, NS, "wp")
    assert fake.made("create", "Sandbox") == []
    assert op.queue.timers[("WarmPool", NS, "wp")] == pytest.approx(t0 + 0.15)  # back when the stream pauses

    clock[0] = t0 + 0.2  # quiet
    await reconcile_warmpool(op.ctx, NS, "wp")
    created = fake.made("create", "Sandbox")
    assert len(created) == 1 and created[0].body["metadata"]["generateName"] == "wp-"


async def test_a_claim_stream_that_never_pauses_refills_in_chunks_at_its_own_pace(clock: list[float]) -> None:
    # 40 ready, a claim every 0.1 s for 3 s, each followed by the pool's reconcile (the adoption requests it). The
    # refills are not Ready yet (starting): the pool never runs low, so the refill goes in chunks, max_refill_defer
    # (1 s here) apart, each what was claimed since the last: it keeps up without waiting for the stream to end.
    fake, op = _stream_setup(ready=40, replicas=40)
    t0 = clock[0]
    chunks: list[tuple[float, int, int]] = []  # (when, how many created, how many claimed by then)
    for i in range(30):
        clock[0] = t0 + i * 0.1
        await _claim(fake, op, f"c{i}")
        before = len(fake.made("create", "Sandbox"))
        await reconcile_warmpool(op.ctx, NS, "wp")
        made = len(fake.made("create", "Sandbox")) - before
        if made:
            chunks.append((clock[0] - t0, made, i + 1))
        op.sync()
    assert len(chunks) == 2, chunks
    assert chunks[0][0] >= 1.0 - 1e-3 and chunks[1][0] - chunks[0][0] >= 1.0 - 1e-3, chunks  # not sooner
    assert chunks[0][0] <= 1.1 + 1e-3 and chunks[1][0] - chunks[0][0] <= 1.2 + 1e-3, chunks  # nor much later
    assert chunks[0][1] == chunks[0][2] and chunks[0][1] + chunks[1][1] == chunks[1][2], chunks  # all claimed so far


async def test_a_pool_under_its_low_water_mark_refills_at_once_during_a_stream(clock: list[float]) -> None:
    fake, op = _stream_setup(ready=2)  # 20 replicas: low water is 2 ready idle sandboxes
    await _claim(fake, op, "c0")
    clock[0] += 0.01
    await reconcile_warmpool(op.ctx, NS, "wp")
    assert len(fake.made("create", "Sandbox")) == 1
    # Its only timer is the readiness-grace wake of the starting sandboxes (minutes away), not a quiet moment.
    assert op.queue.timers[("WarmPool", NS, "wp")] > clock[0] + 60


# ---- a claim that outlives its pool ---------------------------------------------------------------------------------
async def test_a_bound_claim_keeps_its_sandbox_when_its_warmpool_is_deleted() -> None:
    fake = FakeKube()
    put_template(fake)
    wp = put_warmpool(fake, replicas=2)
    op = Operator(fake)
    h = bp_hash_of(op)
    put_member(fake, wp, h, "wp-a", ip="127.0.0.1", created=time.time() - 60)
    put_member(fake, wp, h, "wp-b", ip="127.0.0.2")
    put_claim(fake, "c1")
    op.sync()
    await reconcile_claim(op.ctx, NS, "c1")
    op.sync()

    fake.remove("WarmPool", NS, "wp")  # the garbage collector takes its idle sandbox, not the claimed one
    op.sync()
    fake.reset_calls()
    await reconcile_warmpool(op.ctx, NS, "wp")
    await reconcile_claim(op.ctx, NS, "c1")

    assert fake.find("Sandbox", NS, "wp-b") is None
    assert claimed_by(fake, "wp-a") == "c1"
    assert claim_status(fake, "c1")["phase"] == "Bound"
    assert fake.writes() == []


async def test_a_bound_claim_whose_pool_took_its_sandbox_along_fails_as_sandbox_lost() -> None:
    # A Pool owns its allocated sandboxes too (they go back to it on release): deleting the Pool deletes them, and
    # the claim says so instead of staying Bound to nothing.
    fake = FakeKube()
    put_template(fake)
    pool = put_pool(fake)
    op = Operator(fake)
    put_member(fake, pool, bp_hash_of(op), "p-a")
    put_claim(fake, "c1", pool="p", kind="Pool")
    op.sync()
    await reconcile_claim(op.ctx, NS, "c1")
    op.sync()
    await reconcile_claim(op.ctx, NS, "c1")  # the adopted sandbox's watch event brings the claim back
    assert claim_status(fake, "c1")["phase"] == "Bound"

    fake.remove("Pool", NS, "p")
    op.sync()
    await reconcile_claim(op.ctx, NS, "c1")

    assert fake.find("Sandbox", NS, "p-a") is None
    status = claim_status(fake, "c1")
    assert status["phase"] == "Failed"
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Failed"] == "SandboxLost"
    assert [c.code for c in fake.made("get", "Sandbox")] == [404]  # asked the server once before failing it


async def test_a_pending_claim_waits_with_pool_not_found_and_binds_when_the_pool_comes_back() -> None:
    fake = FakeKube()
    put_template(fake)
    put_claim(fake, "c1")
    op = Operator(fake)

    await reconcile_claim(op.ctx, NS, "c1")
    status = claim_status(fake, "c1")
    assert status["phase"] == "Pending"
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Bound"] == "PoolNotFound"
    assert ("SandboxClaim", NS, "c1") in op.queue.timers  # its timeout, nothing sooner: no polling
    op.sync()
    fake.reset_calls()
    await reconcile_claim(op.ctx, NS, "c1")
    assert fake.writes() == []  # the same wait is not written twice

    put_warmpool(fake, replicas=1)  # the pool comes back
    op.sync()
    await reconcile_warmpool(op.ctx, NS, "wp")
    assert ("SandboxClaim", NS, "c1") in op.queue.added  # the waiting claim is woken
    assert fake.made("create", "Sandbox") == []  # the refill waits for the undecided claim

    await reconcile_claim(op.ctx, NS, "c1")  # nothing warm yet: a cold start
    (sandbox,) = [o["metadata"]["name"] for o in fake.of_kind("Sandbox")]
    op.sync()
    await reconcile_sandbox(op.ctx, NS, sandbox)  # its pod
    assert [c.kind for c in fake.made("create")] == ["Sandbox", "Secret", "Pod"]
    run_pod(fake, sandbox, "127.0.0.9")
    op.sync()
    await reconcile_sandbox(op.ctx, NS, sandbox)  # Ready, with its endpoint
    op.sync()
    await reconcile_claim(op.ctx, NS, "c1")

    status = claim_status(fake, "c1")
    assert (status["phase"], status["launchType"]) == ("Bound", "Cold")
    assert status["sandbox"] == {"name": sandbox, "podIPs": ["127.0.0.9"],
                                 "endpoint": f"127.0.0.9:{EXECD_DEFAULT_PORT}"}


# ---- lost pods in a namespace being deleted ---------------------------------------------------------------------
def _lost_pods(n: int) -> tuple[FakeKube, Operator]:
    """n sandboxes whose pods are gone (each had one: status.nodeName), as when their namespace is being deleted
    (pods go first) or their node was lost."""
    fake = FakeKube()
    put_template(fake)
    pool = put_pool(fake)
    op = Operator(fake)
    h = bp_hash_of(op)
    for i in range(n):
        put_member(fake, pool, h, f"p-{i}", ip=f"127.0.0.{i + 1}", created=time.time() - 60)
        fake.remove("Pod", NS, f"p-{i}")
    op.sync()
    return fake, op


async def test_lost_pods_in_a_namespace_being_deleted_cost_one_refused_create() -> None:
    fake, op = _lost_pods(5)
    fake.terminating.add(NS)

    await asyncio.gather(*(reconcile_sandbox(op.ctx, NS, f"p-{i}") for i in range(5)))

    assert [(c.kind, c.code) for c in fake.made("create")] == [("Secret", 403)]
    assert len(fake.made("get")) == 1  # the first repair's check that its sandbox is still there
    assert fake.writes() == fake.made("create")  # and no status written for sandboxes about to go
    assert op.ctx.namespaces.is_terminating(NS)


async def test_lost_pods_after_a_node_loss_are_all_repaired() -> None:
    fake, op = _lost_pods(5)

    await asyncio.gather(*(reconcile_sandbox(op.ctx, NS, f"p-{i}") for i in range(5)))

    assert sorted(c.name for c in fake.made("create", "Pod", ok=True)) == [f"p-{i}" for i in range(5)]
    assert len(fake.made("create", "Secret")) == 1  # the namespace's execd key, once
    assert not op.ctx.namespaces.is_terminating(NS)


# ---- a failing refill ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("code,raised", [(500, True), (422, False)])
async def test_a_refill_stops_at_the_first_failed_batch_and_says_why(code: int, raised: bool) -> None:
    fake = FakeKube()
    put_template(fake)
    put_warmpool(fake, replicas=7)  # slow start: batches of 1, 2, 4
    op = Operator(fake)
    fake.fail("create", "Sandbox", code, message="admission webhook said no", times=1)

    try:
        await reconcile_warmpool(op.ctx, NS, "wp")
        error = None
    except ApiError as exc:
        error = exc

    assert (error is not None) == raised  # transient: retried by the queue; 403/422: reported, not retried
    assert [c.code for c in fake.made("create", "Sandbox")] == [code]  # the first batch (one) failed: no second
    ready = {c["type"]: c for c in fake.find("WarmPool", NS, "wp")["status"]["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "CreateFailed")
    assert ready["message"] == "admission webhook said no"


# ---- nothing outlives what it is about ------------------------------------------------------------------------------
def _kept(op: Operator) -> dict[str, int]:
    ctx = op.ctx
    books = {"claims": ctx.claims, "pacing": ctx.pacing, "starts": ctx.starts, "namespaces": ctx.namespaces,
             "tokens": ctx.tokens, "templates": ctx.templates, "pool_locks": ctx.pool_locks, "creates": ctx.creates}
    return {name: len(book) for name, book in books.items() if len(book)}


async def test_the_in_flight_state_of_claims_sandboxes_pools_and_templates_goes_with_them() -> None:
    fake = FakeKube()
    put_template(fake)
    wp = put_warmpool(fake, replicas=3)
    op = Operator(fake, {"claim_quiet": 0.0, "sandbox_settle": 0.0})
    h = bp_hash_of(op)
    put_member(fake, wp, h, "wp-a", ip="127.0.0.1", created=time.time() - 60)
    put_member(fake, wp, h, "wp-b", ip="127.0.0.2")
    op.sync()
    await reconcile_warmpool(op.ctx, NS, "wp")  # refills one (an expected create) and writes its status
    (new,) = {o["metadata"]["name"] for o in fake.of_kind("Sandbox")} - {"wp-a", "wp-b"}
    op.sync()
    await reconcile_sandbox(op.ctx, NS, new)  # its pod (a pod create awaiting the watch) and the namespace's key
    put_claim(fake, "c1")
    op.sync()
    await reconcile_claim(op.ctx, NS, "c1")  # adopts wp-a: reserved, bound, its Bound phase awaiting the watch
    assert set(_kept(op)) == {"claims", "pacing", "starts", "tokens", "templates", "creates"}

    # The claim and the pool are deleted before the watch reported any of that (wp-a's labelled event never came).
    fake.remove("SandboxClaim", NS, "c1")
    fake.remove("WarmPool", NS, "wp")
    fake.remove("SandboxTemplate", NS, TEMPLATE)
    op.sync()
    assert fake.of_kind("Sandbox") == []
    await reconcile_claim(op.ctx, NS, "c1")
    for sandbox in ("wp-a", "wp-b", new):
        await reconcile_sandbox(op.ctx, NS, sandbox)
    await reconcile_warmpool(op.ctx, NS, "wp")
    from corral.operator.reconcile.templates import reconcile_template
    await reconcile_template(op.ctx, NS, TEMPLATE)

    assert _kept(op) == {}


async def test_a_pod_in_phase_unknown_reports_its_sandbox_pending_not_a_phase_the_crd_refuses() -> None:
    fake = FakeKube()
    put_template(fake)
    wp = put_warmpool(fake, replicas=1)
    op = Operator(fake, {"sandbox_settle": 0.0})
    put_member(fake, wp, bp_hash_of(op), "wp-a", ip="127.0.0.1")
    fake.objects[("Pod", NS, "wp-a")]["status"] = {"phase": "Unknown", "podIP": "127.0.0.1",
                                                   "podIPs": [{"ip": "127.0.0.1"}], "reason": "NodeLost"}
    op.sync()
    await reconcile_sandbox(op.ctx, NS, "wp-a")
    status = fake.find("Sandbox", NS, "wp-a")["status"]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (status["phase"], ready["status"], ready["reason"], ready["message"]) == (
        "Pending", "False", "PodUnknown", "NodeLost")


async def test_a_deleted_batch_leaves_no_binds_behind() -> None:
    """A batch deleted before its sandboxes' labelled events came: its binds go with it, another batch's stay."""
    from corral.operator.reconcile.batches import reconcile_batch

    op = Operator(FakeKube())
    op.ctx.claims.bound.update({(NS, "gone_0"): "sb-a", (NS, "gone_1"): "sb-b", (NS, "other_0"): "sb-c",
                                ("elsewhere", "gone_0"): "sb-d"})
    await reconcile_batch(op.ctx, NS, "gone")
    assert op.ctx.claims.bound == {(NS, "other_0"): "sb-c", ("elsewhere", "gone_0"): "sb-d"}
