"""What a replica keeps in memory for a shard's objects when the shard moves (corral.operator.shards `start_shards`:
`lost` and `acquired`, Context.forget), with a real Context and Cache over the in-memory API (fakekube.py); and the
shard a deleted object's key keeps while its cleanup is asked about.

Scenarios: a lost shard takes its claims', sandboxes', pools' and batches' entries along and leaves the other
shard's; a Bound phase written just before the shard went, whose echo another replica overtook, would have held the
claim back for good when the shard came back; what a reconcile that outlived the loss noted is dropped when the shard
comes back; a deleted claim's key gets the same shard from the request, the dispatch and the timers.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from fakekube import FakeKube, Operator
from test_reconcilers import NS, bp_hash_of, put_member, put_template, put_warmpool

from corral.api.common import API_VERSION
from corral.operator import shards as shards_module
from corral.operator.reconcile.claims import reconcile_claim
from corral.operator.shards import GONE_TTL, ShardMap, Shards, ShardSettings, shard_of, start_shards

N = 2


def pools_in_two_shards() -> tuple[str, str]:
    """Two WarmPool names whose shards (of N) differ."""
    names = [f"wp{i}" for i in range(50)]
    first = names[0]
    other = next(n for n in names if shard_of(NS, "WarmPool", n, N) != shard_of(NS, "WarmPool", first, N))
    return first, other


def put_claim(fake: FakeKube, name: str, pool: str, **spec: Any) -> None:
    fake.put({"apiVersion": API_VERSION, "kind": "SandboxClaim", "metadata": {"name": name, "namespace": NS},
              "spec": {"poolRef": {"kind": "WarmPool", "name": pool}, **spec}})


def sharded(op: Operator, monkeypatch: pytest.MonkeyPatch) -> Shards:
    """start_shards' wiring over the operator's Context, holding every shard (its lease loop not started)."""
    monkeypatch.setattr(Shards, "start", lambda self: None)
    shards = start_shards(op.ctx, ShardSettings(shards=N, namespace="ops"), "me")
    shards.valid_until.update({s: time.monotonic() + 3600 for s in range(N)})
    return shards


async def lose(shards: Shards, s: int) -> None:
    await shards._lose(s, "test")  # noqa: SLF001 - the loop's own way of losing a shard


def kept_for(op: Operator, claim: str) -> dict[str, Any]:
    book = op.ctx.claims
    return {k: v for k, v in {
        "reserved": [sb for sb, h in book.reserved.items() if h == (NS, claim)],
        "bound": book.bound_to(NS, claim),
        "phase": book._phase_written.get((NS, claim)),  # noqa: SLF001
        "spec": (NS, claim) in book._specs,  # noqa: SLF001
    }.items() if v}


async def test_a_lost_shard_takes_its_objects_in_flight_state_along_and_leaves_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeKube()
    put_template(fake)
    a, b = pools_in_two_shards()
    op = Operator(fake, {"claim_quiet": 0.0})
    for pool, ip in ((a, "127.0.0.1"), (b, "127.0.0.2")):
        wp = put_warmpool(fake, pool, replicas=1)
        put_member(fake, wp, bp_hash_of(op), f"{pool}-s", ip=ip)
        put_claim(fake, f"c-{pool}", pool)
        fake.put({"apiVersion": API_VERSION, "kind": "SandboxBatch",
                  "metadata": {"name": f"batch-{pool}", "namespace": NS},
                  "spec": {"poolRef": {"kind": "WarmPool", "name": pool}, "replicas": 1}})
    op.sync()
    for pool in (a, b):
        await reconcile_claim(op.ctx, NS, f"c-{pool}")  # adopted, Bound written: both awaiting the watch
    shards = sharded(op, monkeypatch)
    for pool in (a, b):
        assert kept_for(op, f"c-{pool}").keys() == {"reserved", "bound", "phase", "spec"}
        op.ctx.starts.pod_created((NS, f"{pool}-s"), time.time())
        op.ctx.pacing.claim_decided("WarmPool", NS, pool)
        op.ctx.creates.expect(("WarmPool", NS, pool), f"{pool}-new")
        op.ctx.batches.state(NS, f"batch-{pool}")
    sizes = {"starts": len(op.ctx.starts), "pacing": len(op.ctx.pacing), "creates": len(op.ctx.creates)}

    await lose(shards, shard_of(NS, "WarmPool", a, N))

    assert kept_for(op, f"c-{a}") == {}
    assert kept_for(op, f"c-{b}").keys() == {"reserved", "bound", "phase", "spec"}
    assert list(op.ctx.batches.states) == [(NS, f"batch-{b}")]
    assert not op.ctx.starts.pod_create_due((NS, f"{b}-s"), time.time())  # still trusted: b's shard is held
    assert op.ctx.starts.pod_create_due((NS, f"{a}-s"), time.time())
    assert op.ctx.creates.outstanding(("WarmPool", NS, a), set()) == 0
    assert op.ctx.creates.outstanding(("WarmPool", NS, b), set()) == 1
    assert op.ctx.pacing.claims_streaming("WarmPool", NS, a, time.time(), quiet=60) is None
    assert op.ctx.pacing.claims_streaming("WarmPool", NS, b, time.time(), quiet=60) is not None
    assert 0 < len(op.ctx.starts) < sizes["starts"] and 0 < len(op.ctx.pacing) < sizes["pacing"]
    assert 0 < len(op.ctx.creates) < sizes["creates"]


async def test_a_claim_whose_shard_comes_back_is_not_held_back_by_a_phase_written_before_it_went(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """This replica wrote Bound and lost the shard before the watch showed it; the other replica finished the claim
    meanwhile (its shutdownTime), and the watch shows Finished. Kept, the Bound awaiting its echo would have held
    every later pass back (`awaiting_echo`): the claim's ttlSecondsAfterFinished would never have deleted it."""
    fake = FakeKube()
    put_template(fake)
    a, _ = pools_in_two_shards()
    op = Operator(fake, {"claim_quiet": 0.0})
    wp = put_warmpool(fake, a, replicas=1)
    put_member(fake, wp, bp_hash_of(op), f"{a}-s")
    put_claim(fake, "c", a, lifecycle={"ttlSecondsAfterFinished": 0})
    op.sync()
    await reconcile_claim(op.ctx, NS, "c")
    assert kept_for(op, "c").get("phase") == "Bound"  # not seen back yet
    shards = sharded(op, monkeypatch)
    s = shard_of(NS, "WarmPool", a, N)
    await lose(shards, s)
    # a reconcile that was running when the shard went notes its write after `lost` ran
    op.ctx.claims.phase_written(NS, "c", "Bound")
    # the other replica finishes the claim; this one's watch shows it
    fake.edit("SandboxClaim", NS, "c", {"status": {"phase": "Finished", "finishedTime": "2020-01-01T00:00:00Z"}})
    op.sync()

    shards.valid_until[s] = time.monotonic() + 3600
    shards.on_acquired(s)
    assert ("SandboxClaim", NS, "c") in op.queue.added  # looked at again
    assert kept_for(op, "c") == {}
    await reconcile_claim(op.ctx, NS, "c")
    assert fake.find("SandboxClaim", NS, "c") is None  # its TTL ran: deleted


def test_a_deleted_objects_key_keeps_its_shard_for_every_question_until_it_is_forgotten(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim's deletion is asked about by the request (Context.request), again by dispatch, and by a lost shard's
    timers: each must say the pool's shard, or the cleanup reconcile is dropped where it should run (its key's own
    hash names another shard: `shard_of(ns, "SandboxClaim", name)`)."""
    n = 16
    objs: dict[tuple[str, str, str], Any] = {}

    class Cache:
        ready = True

        def claim(self, ns: str, name: str) -> Any:
            return objs.get(("SandboxClaim", ns, name))

    pool = shard_of("ns", "WarmPool", "wp", n)
    name = next(f"c{i}" for i in range(100) if shard_of("ns", "SandboxClaim", f"c{i}", n) != pool)
    key = ("SandboxClaim", "ns", name)
    objs[key] = {"spec": {"poolRef": {"kind": "WarmPool", "name": "wp"}}}
    smap = ShardMap(Cache(), n)
    assert smap.shard(key) == pool
    del objs[key]
    assert [smap.shard(key) for _ in range(3)] == [pool, pool, pool]
    # forgotten GONE_TTL after it went (on a later question about any gone key)
    now = time.monotonic()
    monkeypatch.setattr(shards_module.time, "monotonic", lambda: now + GONE_TTL + 1)
    assert smap.shard(key) == shard_of("ns", "SandboxClaim", name, n)
    assert smap._last == {} and smap._gone == {}  # noqa: SLF001


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Wall-clock time as the reconcilers read it (time.time), moved by the test: clock[0] = t."""
    now = [1_800_000_000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    return now


def behind(fake: FakeKube, op: Operator, **stale: dict[str, Any] | None) -> None:
    """`op`'s watch shows the cluster as it is, except the objects given (kind -> body; None: not there yet)."""
    keep = dict(fake.objects)
    for kind, body in stale.items():
        key = next(k for k in fake.objects if k[0] == kind)
        if body is None:
            del fake.objects[key]
        else:
            fake.objects[key] = body
    op.sync()
    fake.objects.clear()
    fake.objects.update(keep)


@pytest.mark.parametrize("stale_view", ["pool not seen yet", "sandbox not seen Ready, claim timed out"])
async def test_a_replica_whose_view_is_behind_never_writes_over_a_claim_another_bound(clock: list[float],
                                                                                       stale_view: str) -> None:
    """Both replicas act on one claim for a moment; the second still sees it Pending. Its status writes (Pending
    while it waits for the pool; Failed once the timeout it sees has passed) are conditional on that version, so
    they get a 409 and write nothing; nor is the sandbox the first bound deleted for a failure that was not."""
    fake = FakeKube()
    put_template(fake)
    first, second = Operator(fake, {"claim_quiet": 0.0}), Operator(fake, {"claim_quiet": 0.0})
    wp = put_warmpool(fake, "wp", replicas=1)
    put_member(fake, wp, bp_hash_of(first), "wp-s")
    put_claim(fake, "c", "wp", timeoutSeconds=30)
    first.sync()
    pending = fake.find("SandboxClaim", NS, "c")
    await reconcile_claim(first.ctx, NS, "c")
    assert (fake.find("SandboxClaim", NS, "c") or {})["status"]["phase"] == "Bound"
    if stale_view == "pool not seen yet":
        behind(fake, second, SandboxClaim=pending, WarmPool=None)
    else:
        sandbox = fake.find("Sandbox", NS, "wp-s") or {}
        sandbox["status"]["conditions"][0]["status"] = "False"
        behind(fake, second, SandboxClaim=pending, Sandbox=sandbox)
        clock[0] += 31
    fake.reset_calls()

    await reconcile_claim(second.ctx, NS, "c")

    assert [c.code for c in fake.made("patch", "SandboxClaim")] == [409]
    assert fake.made("delete") == []
    status = (fake.find("SandboxClaim", NS, "c") or {})["status"]
    assert (status["phase"], status["sandbox"]["name"]) == ("Bound", "wp-s")


async def test_a_failed_claims_sandbox_goes_after_the_failed_status_and_a_failed_delete_is_retried(
        clock: list[float]) -> None:
    """The order behind the test above: Failed is written first, the sandbox deleted after it; a delete that fails
    then is made again by the failed claim's next reconcile (a failed claim holds no sandbox)."""
    fake = FakeKube()
    put_template(fake)
    op = Operator(fake, {"claim_quiet": 0.0})
    wp = put_warmpool(fake, "wp", replicas=1)
    put_member(fake, wp, bp_hash_of(op), "wp-s", ready=False)
    put_claim(fake, "c", "wp", timeoutSeconds=30)
    fake.edit("Sandbox", NS, "wp-s", {"metadata": {"labels": {"corral.dev/claim": "c"}}})  # adopted, not Ready
    op.sync()
    clock[0] += 31
    fake.fail("delete", "Sandbox", 500)
    with pytest.raises(Exception, match="injected"):
        await reconcile_claim(op.ctx, NS, "c")
    assert [(c.verb, c.kind, c.code) for c in fake.writes()] == [("patch", "SandboxClaim", None),
                                                                  ("delete", "Sandbox", 500)]
    assert (fake.find("SandboxClaim", NS, "c") or {})["status"]["phase"] == "Failed"
    op.sync()
    await reconcile_claim(op.ctx, NS, "c")
    assert fake.find("Sandbox", NS, "wp-s") is None


async def test_a_sandbox_given_back_after_a_lost_bind_is_counted_once(clock: list[float]) -> None:
    """Two replicas bind one claim at once. The second loses the status write and deletes the sandbox it adopted
    (a lost bind); its next pass, before the deletion's watch event, still sees that sandbox labelled for the claim
    and deletes it again. corral_claim_lost_binds_total counts the sandbox once."""
    from prometheus_client import REGISTRY

    def lost_binds() -> float:
        return REGISTRY.get_sample_value("corral_claim_lost_binds_total") or 0.0

    fake = FakeKube()
    put_template(fake)
    first, second = Operator(fake, {"claim_quiet": 0.0}), Operator(fake, {"claim_quiet": 0.0})
    wp = put_warmpool(fake, "wp", replicas=2)
    for name in ("wp-a", "wp-b"):
        put_member(fake, wp, bp_hash_of(first), name)
    put_claim(fake, "c", "wp")
    first.sync()
    second.sync()  # both see the claim Pending and both sandboxes idle
    await reconcile_claim(first.ctx, NS, "c")
    winner = (fake.find("SandboxClaim", NS, "c") or {})["status"]["sandbox"]["name"]
    deleted: dict[str, Any] = {}
    fake.before("delete", "Sandbox", lambda call: deleted.update(
        {call.name: copy.deepcopy(fake.find("Sandbox", NS, call.name))}))
    before = lost_binds()

    await reconcile_claim(second.ctx, NS, "c")  # adopts the other sandbox, loses the Bound write, gives it back
    assert list(deleted) == [other := ({"wp-a", "wp-b"} - {winner}).pop()]
    assert lost_binds() - before == 1
    keep = dict(fake.objects)
    fake.objects[("Sandbox", NS, other)] = deleted[other]
    second.sync()  # its watch shows the claim Bound, but not yet the deletion
    fake.objects.clear()
    fake.objects.update(keep)
    fake.reset_calls()

    await reconcile_claim(second.ctx, NS, "c")

    assert [c.name for c in fake.made("delete", "Sandbox")] == [other]  # deleted again (a 404 here: it is gone)
    assert lost_binds() - before == 1


def test_a_claim_token_noted_for_a_sandbox_goes_with_its_deletion_event_on_every_replica() -> None:
    """A replica put a claim's token into a sandbox's execd and then lost the shard: the note stays while the
    sandbox exists (Context.forget). The sandbox's deletion, reconciled by the shard's new holder, reaches this
    replica as a watch event: the note goes then, not at its next shard change."""
    from types import SimpleNamespace

    from corral.operator.informer import react_sandbox

    op = Operator(FakeKube(), {})
    op.ctx.tokens.note_installed(NS, "wp-a", "pod-uid", "claim-uid")
    op.ctx.tokens.note_installed(NS, "wp-b", "pod-uid-b", "claim-uid-b")
    gone = SimpleNamespace(metadata=SimpleNamespace(namespace=NS, name="wp-a", labels={}))
    react_sandbox(op.ctx, "MODIFIED", gone)
    assert op.ctx.tokens.installed(NS, "wp-a") == ("pod-uid", "claim-uid")
    react_sandbox(op.ctx, "DELETED", gone)
    assert op.ctx.tokens.installed(NS, "wp-a") is None
    assert op.ctx.tokens.installed(NS, "wp-b") == ("pod-uid-b", "claim-uid-b")
