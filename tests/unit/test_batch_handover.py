"""A SandboxBatch bound by two operator processes at once (a shard changing hands, corral.operator.shards), against
the in-memory API (fakekube.py): each index ends with one sandbox, the one the status names, because every status
write is conditional on the batch version its entries are built on and the loser of a conflict gives its sandbox up.

Scenarios: the decision table of `settle_indexes`; two processes with the same stale view binding one batch; a
sandbox left labelled for an index by a loser that died; back-to-back writes of one process never conflict with
themselves (no read, no write more on the normal path); a task starts only after the status names its sandbox.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fakekube import FakeKube, Operator
from prometheus_client import REGISTRY
from test_reconcilers import NS, TEMPLATE, bp_hash_of, put_member, put_template, put_warmpool

from corral.api.common import API_VERSION
from corral.operator.builders import owner_ref, sandbox_labels, sandbox_manifest
from corral.operator.constants import L_CLAIM
from corral.operator.core import batches as b
from corral.operator.reconcile import batches
from corral.operator.reconcile.batches import reconcile_batch, settle_indexes


def put_batch(fake: FakeKube, name: str = "job", replicas: int = 2, **spec: Any) -> dict[str, Any]:
    return fake.put({"apiVersion": API_VERSION, "kind": "SandboxBatch", "metadata": {"name": name, "namespace": NS},
                     "spec": {"poolRef": {"kind": "WarmPool", "name": "wp"}, "replicas": replicas, **spec}})


def labelled(fake: FakeKube) -> dict[str, list[str]]:
    """claim label -> the sandboxes carrying it."""
    out: dict[str, list[str]] = {}
    for s in fake.of_kind("Sandbox", NS):
        label = (s["metadata"].get("labels") or {}).get(L_CLAIM)
        if label:
            out.setdefault(label, []).append(s["metadata"]["name"])
    return out


def named(fake: FakeKube, batch: str = "job") -> dict[int, str | None]:
    status = (fake.find("SandboxBatch", NS, batch) or {}).get("status") or {}
    return {e["index"]: e.get("sandbox") for e in status.get("indexes") or []}


def lost_binds() -> float:
    return REGISTRY.get_sample_value("corral_claim_lost_binds_total") or 0.0


def pool_of_four() -> tuple[FakeKube, Operator, Operator]:
    fake = FakeKube()
    put_template(fake)
    wp = put_warmpool(fake, replicas=4)
    first, second = Operator(fake), Operator(fake)
    h = bp_hash_of(first)
    for i, name in enumerate(("wp-a", "wp-b", "wp-c", "wp-d")):
        put_member(fake, wp, h, name, ip=f"127.0.0.{i + 1}", created=time.time() - 60 + i)
    return fake, first, second


def entry(index: int, phase: str, sandbox: str | None = None, **more: Any) -> dict[str, Any]:
    return {"index": index, "phase": phase, **({"sandbox": sandbox} if sandbox else {}), **more}


@pytest.mark.parametrize(("mine", "theirs", "after", "lost"), [
    # the status gives the index another sandbox: it has that one, this process's is lost
    (entry(0, b.BOUND, "s-mine"), entry(0, b.BOUND, "s-theirs"), entry(0, b.BOUND, "s-theirs"), [(0, "s-mine")]),
    (entry(0, b.RUNNING, "s-mine", commandId="c1"), entry(0, "Failed", "s-theirs", reason="SandboxLost"),
     entry(0, "Failed", "s-theirs", reason="SandboxLost"), [(0, "s-mine")]),
    # this process has none for it yet: it takes the status's, nothing lost
    (entry(0, "Pending"), entry(0, b.BOUND, "s-theirs"), entry(0, b.BOUND, "s-theirs"), []),
    # the status has none for it: this process's sandbox stands (its write then records it), even over an ended entry
    (entry(0, b.BOUND, "s-mine"), entry(0, "Pending"), entry(0, b.BOUND, "s-mine"), []),
    (entry(0, b.BOUND, "s-mine"), entry(0, "Failed", reason="StartFailed"), entry(0, b.BOUND, "s-mine"), []),
    # the same sandbox on both sides: the entry further along wins, this process's on a tie
    (entry(0, b.BOUND, "s"), entry(0, b.RUNNING, "s", commandId="c1"), entry(0, b.RUNNING, "s", commandId="c1"), []),
    (entry(0, "Succeeded", "s", exitCode=0), entry(0, b.RUNNING, "s", commandId="c1"),
     entry(0, "Succeeded", "s", exitCode=0), []),
    (entry(0, b.RUNNING, "s", commandId="mine"), entry(0, b.RUNNING, "s", commandId="theirs"),
     entry(0, b.RUNNING, "s", commandId="mine"), []),
    # neither has one: the further along (a failed create of the other's) wins
    (entry(0, "Pending"), entry(0, "Failed", reason="StartFailed"), entry(0, "Failed", reason="StartFailed"), []),
])
def test_settle_indexes_takes_the_status_s_sandbox_for_an_index_and_the_entry_further_along(mine, theirs, after, lost):
    entries = [mine, entry(1, b.BOUND, "s-other")]
    kept = entries[0]
    assert settle_indexes(entries, [theirs]) == lost
    assert entries == [after, entry(1, b.BOUND, "s-other")]  # an index the status does not list is left alone
    assert entries[0] is kept  # changed in place: a task follower holding the entry sees it


async def test_two_processes_binding_one_batch_at_once_leave_each_index_one_sandbox() -> None:
    fake, first, second = pool_of_four()
    put_batch(fake)
    first.sync()
    second.sync()  # both see the batch new and all four sandboxes idle
    lost = lost_binds()

    await reconcile_batch(first.ctx, NS, "job")
    won = named(fake)
    assert sorted(won) == [0, 1] and all(won.values())
    fake.reset_calls()
    await reconcile_batch(second.ctx, NS, "job")  # its cache still shows the batch new and every sandbox idle

    # its adoptions of the first's candidates got 409s, so it started two cold; its status write got a 409 too
    assert [c.code for c in fake.made("patch", "Sandbox")] == [409, 409]
    adopted = {c.body["metadata"]["name"] for c in fake.made("create", "Sandbox", ok=True)}
    assert len(adopted) == 2 and not adopted & set(won.values())
    assert [c.code for c in fake.made("patch", "SandboxBatch")][:1] == [409]
    assert len(fake.made("get", "SandboxBatch")) == 1  # one read after the conflict
    # ... so it took the status's entries and deleted what it had taken, by uid
    deleted = fake.made("delete", "Sandbox")
    assert {c.name for c in deleted} == adopted and all(c.body["uid"] for c in deleted)
    assert named(fake) == won  # the status never named the loser's sandboxes
    assert labelled(fake) == {b.claim_label("job", i): [s] for i, s in won.items()}
    st = second.ctx.batches.states[(NS, "job")]
    assert {e["index"]: e.get("sandbox") for e in st.indexes or []} == won
    assert lost_binds() - lost == 2
    assert not {s for (_, s) in second.ctx.claims.reserved} & adopted

    # both see the cluster as it is now: nothing more to do for either
    first.sync()
    second.sync()
    fake.reset_calls()
    for op in (first, second):
        await reconcile_batch(op.ctx, NS, "job")
    assert [c for c in fake.writes() if c.kind == "Sandbox"] == []
    assert named(fake) == won


async def test_a_sandbox_left_labelled_for_an_index_by_a_dead_loser_is_deleted() -> None:
    fake, first, _ = pool_of_four()
    put_batch(fake)
    first.sync()
    await reconcile_batch(first.ctx, NS, "job")
    won = named(fake)
    # the loser adopted wp-d for index 0 and died before it learnt that it lost
    fake.edit("Sandbox", NS, "wp-d", {"metadata": {"labels": {L_CLAIM: b.claim_label("job", 0)}}})
    first.sync()
    fake.reset_calls()
    await reconcile_batch(first.ctx, NS, "job")
    assert [(c.name, c.code) for c in fake.made("delete", "Sandbox")] == [("wp-d", None)]
    assert labelled(fake) == {b.claim_label("job", i): [s] for i, s in won.items()}
    assert named(fake) == won


async def test_a_labelled_sandbox_is_never_deleted_for_an_index_whose_status_names_none_yet() -> None:
    """Only a sandbox the status records makes another labelled one an extra: one this process took a moment ago and
    has not written yet proves nothing (its write may still lose)."""
    fake, first, _ = pool_of_four()
    put_batch(fake, replicas=1)
    template = fake.objects[("SandboxTemplate", NS, TEMPLATE)]
    batch = fake.objects[("SandboxBatch", NS, "job")]
    for name in ("job-x", "job-y"):  # two labelled for index 0 (two replicas' cold starts), no status yet
        fake.put(sandbox_manifest(name=name, namespace=NS, template_name=TEMPLATE, blueprint=template["spec"],
                                  labels=sandbox_labels(TEMPLATE, claim=b.claim_label("job", 0), bp_hash="h"),
                                  owner=owner_ref(batch)))
    first.sync()
    fake.reset_calls()
    await reconcile_batch(first.ctx, NS, "job")
    assert fake.made("delete") == []
    (chosen,) = named(fake).values()
    assert chosen in ("job-x", "job-y")
    # once the status names it, the other goes
    first.sync()
    await reconcile_batch(first.ctx, NS, "job")
    assert [c.name for c in fake.made("delete", "Sandbox")] == [{"job-x": "job-y", "job-y": "job-x"}[chosen]]


async def test_back_to_back_status_writes_of_one_process_never_conflict_with_themselves() -> None:
    """The normal path: each write is conditional on the version the previous one returned, not on the cache's (which
    has not shown that write yet): no 409, no read, no write more than before."""
    fake, first, _ = pool_of_four()
    put_batch(fake)
    first.sync()
    await reconcile_batch(first.ctx, NS, "job")  # binds both indexes and writes
    st = first.ctx.batches.states[(NS, "job")]
    assert st.indexes is not None
    for step in ("Running", "Succeeded"):  # what the task followers do, written before the cache saw the last write
        for e in st.indexes:
            e["phase"] = step
        await batches.flush(first.ctx, NS, "job")
    patches = fake.made("patch", "SandboxBatch")
    assert [c.code for c in patches] == [None, None, None]
    assert all(c.body["metadata"]["resourceVersion"] for c in patches)  # every one conditional
    assert fake.made("get") == []
    status = (fake.find("SandboxBatch", NS, "job") or {})["status"]
    assert [e["phase"] for e in status["indexes"]] == ["Succeeded", "Succeeded"]


async def test_a_task_starts_only_once_the_status_names_its_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that gives an index a sandbox writes the status before it starts the index's task: another replica's
    write may have won the index meanwhile, and a task must never run in a sandbox that is then given up."""
    fake, first, _ = pool_of_four()
    put_batch(fake, task={"command": "true"})
    for i, name in enumerate(("wp-a", "wp-b")):  # adopted for the batch, the status not written (a restart between)
        fake.edit("Sandbox", NS, name, {"metadata": {"labels": {L_CLAIM: b.claim_label("job", i)}}})
    first.sync()
    writes_when_started: list[int] = []

    async def follow(*args: Any, **kwargs: Any) -> None:
        writes_when_started.append(len(fake.made("patch", "SandboxBatch", ok=True)))

    monkeypatch.setattr(batches, "follow", follow)
    await reconcile_batch(first.ctx, NS, "job")
    st = first.ctx.batches.states[(NS, "job")]
    for task in st.followers.values():
        await task
    assert named(fake) == {0: "wp-a", 1: "wp-b"}
    assert writes_when_started == [1, 1]  # both followers were made after the write that named their sandboxes
    assert len(fake.made("patch", "SandboxBatch")) == 1  # and no write more for that
