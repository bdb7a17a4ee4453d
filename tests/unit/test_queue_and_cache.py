"""The operator's work queue (coalescing, hold/release for a standby replica) and its view of the kopf indices (one
index per kind with tagged secondary keys; objects hidden after a resume)."""

from __future__ import annotations

import asyncio
import random

from corral.operator.cache import Cache, claim_keys, sandbox_keys
from corral.operator.planning import Member, adoption_candidates
from corral.operator.workqueue import WorkQueue


def test_held_queue_runs_nothing_new_until_released():
    async def main() -> list[str]:
        ran: list[str] = []
        gate = asyncio.Event()

        async def handler(key: str) -> None:
            ran.append(key)
            if key == "slow":
                await gate.wait()

        q = WorkQueue(handler, workers=2)
        q.start()
        q.add("slow")
        await asyncio.sleep(0.01)
        q.hold()  # "slow" is running: it finishes; nothing else starts
        q.add("a")
        q.add("b")
        q.add("a")  # coalesced
        q.add_at("c", 0)  # a due timer queues too
        await asyncio.sleep(0.05)
        assert ran == ["slow"] and q.held
        gate.set()
        await asyncio.sleep(0.05)
        assert ran == ["slow"]
        q.release()
        await asyncio.wait_for(q.wait_idle(), 2)
        await q.stop()
        return ran

    ran = asyncio.run(main())
    assert ran[0] == "slow" and sorted(ran[1:]) == ["a", "b", "c"]


def body(kind: str, name: str, uid: str, labels: dict | None = None, spec: dict | None = None) -> dict:
    return {"kind": kind, "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": "1",
                                       "labels": labels or {}}, "spec": spec or {}, "status": {}}


def cache_of(claims: list[dict], sandboxes: list[dict]) -> Cache:
    """A Cache over index dicts shaped as kopf builds them from the handlers' key functions."""
    idx: dict[str, dict] = {n: {} for n in Cache.NAMES}
    for c in claims:
        for k, v in claim_keys("ns", c["metadata"]["name"], c["spec"], c).items():
            idx["claims_idx"].setdefault(k, []).append(v)
    for s in sandboxes:
        for k, v in sandbox_keys("ns", s["metadata"]["name"], s["metadata"]["labels"], s).items():
            idx["sandboxes_idx"].setdefault(k, []).append(v)
    cache = Cache()
    cache.bind(idx)
    return cache


def test_one_index_per_kind_serves_every_lookup_and_hides_ghosts():
    pool = {"corral.dev/pool": "wp", "corral.dev/pool-kind": "WarmPool"}
    claims = [body("SandboxClaim", "c1", "u-c1", spec={"poolRef": {"kind": "WarmPool", "name": "wp"}}),
              body("SandboxClaim", "c2", "u-c2", spec={"poolRef": {"kind": "Pool", "name": "p"}})]
    sandboxes = [body("Sandbox", "s1", "u-s1", pool), body("Sandbox", "s2", "u-s2", {**pool, "corral.dev/claim": "c1"}),
                 body("Sandbox", "loose", "u-s3")]
    cache = cache_of(claims, sandboxes)
    assert cache.ready
    assert cache.claim("ns", "c1")["metadata"]["uid"] == "u-c1"
    assert [c["metadata"]["name"] for c in cache.claims_for("ns", "WarmPool", "wp")] == ["c1"]
    assert [c["metadata"]["name"] for c in cache.claims_for("ns", "Pool", "p")] == ["c2"]
    assert sorted(m.name for m in cache.members("ns", "WarmPool", "wp")) == ["s1", "s2"]
    assert cache.claim_sandbox("ns", "c1").name == "s2"
    # list/all_objects see each object once, whatever its secondary keys
    assert sorted(s["metadata"]["name"] for s in cache.list("Sandbox", "ns")) == ["loose", "s1", "s2"]
    assert len(cache.all_objects("SandboxClaim")) == 2 and cache.list("Sandbox", "other") == []

    cache.hide({"u-s1", "u-c2"})  # deleted while the replica was paused: kopf still holds them
    assert [m.name for m in cache.members("ns", "WarmPool", "wp")] == ["s2"]
    assert cache.sandbox("ns", "s1") is None and cache.claims_for("ns", "Pool", "p") == []
    assert sorted(s["metadata"]["name"] for s in cache.all_objects("Sandbox")) == ["loose", "s2"]


def test_lazy_adoption_order_is_the_full_order():
    rnd = random.Random(7)
    for _ in range(200):
        members = [Member(name=f"s{i}", namespace="ns", ready=rnd.random() < 0.8, claim=None if rnd.random() < 0.8
                          else "c", node=f"n{rnd.randrange(3)}", created=rnd.randrange(5),
                          blueprint_hash=rnd.choice(["old", "new"])) for i in range(rnd.randrange(0, 12))]
        reserved = {f"s{rnd.randrange(12)}"}
        lazy = [m.name for m in adoption_candidates(members, "new", reserved)]
        ready = [m for m in members if m.ready and not m.claim and m.name not in reserved]
        per_node = {n: sum(1 for m in ready if m.node == n) for n in {m.node for m in ready}}
        full = [m.name for m in sorted(ready, key=lambda m: (m.blueprint_hash == "new", -per_node[m.node],
                                                             m.created, m.name))]
        assert lazy == full


class FakeKube:
    """list_all over a mutable 'server' (kind -> bodies), counting calls."""

    def __init__(self, server: dict[str, list[dict]], rv: int) -> None:
        self.server, self.rv, self.lists = server, rv, 0

    async def list_all(self, kind, labels=None):
        self.lists += 1
        return list(self.server.get(kind, [])), self.rv


def test_resume_waits_for_the_relist_hides_ghosts_and_redoes_everything():
    """kopf's kinds (here WarmPools) are checked on resume; the informers' kinds are current already."""
    from types import SimpleNamespace

    from corral.operator.leadership import Leadership
    from corral.operator.resync import resync

    kept, ghost, newer = (body("WarmPool", n, f"u-{n}") for n in ("kept", "ghost", "newer"))
    newer["metadata"]["resourceVersion"] = "99"  # created after the listing: not a ghost
    late = body("WarmPool", "late", "u-late")  # on the server, not yet re-listed by kopf
    cache = cache_of([], [])
    for b in (kept, ghost, newer):
        cache._idx["warmpools_idx"][("ns", b["metadata"]["name"])] = [b]
    requested: list[tuple[str, str, str]] = []

    async def main() -> None:
        queue = WorkQueue(lambda key: asyncio.sleep(0))
        queue.hold()
        kube = FakeKube({"WarmPool": [kept, late]}, rv=50)
        ctx = SimpleNamespace(kube=kube, cache=cache, queue=queue,
                              leadership=Leadership(), request=lambda *key: requested.append(key))
        task = asyncio.create_task(resync(ctx))
        await asyncio.sleep(0.2)
        assert not task.done() and queue.held  # waits for kopf's re-list to bring "late"
        cache._idx["warmpools_idx"][("ns", "late")] = [late]
        await asyncio.wait_for(task, 5)
        assert not queue.held
        assert kube.lists == 4  # kopf's four kinds, once each

    asyncio.run(main())
    assert sorted(w["metadata"]["name"] for w in cache.list("WarmPool", "ns")) == ["kept", "late", "newer"]
    assert sorted(name for kind, _, name in requested if kind == "WarmPool") == ["kept", "late", "newer"]


def test_kopf_indices_count_as_complete_once_they_hold_what_the_server_lists_even_after_a_refusal():
    """kopf calls no handler while its kinds are empty, so the startup check lists them; a new CRD's storage answers
    429 for a moment: the check tries again instead of leaving the cache never ready."""
    from types import SimpleNamespace

    from corral.operator.leadership import Leadership
    from corral.operator.resync import kopf_indices_complete

    class Refusing(FakeKube):
        async def list_all(self, kind, labels=None):
            if self.lists == 0:
                self.lists += 1
                raise RuntimeError("storage is (re)initializing")
            return await super().list_all(kind, labels)

    indices = {n: {} for n in ("templates_idx", "warmpools_idx", "pools_idx", "batches_idx")}
    cache = Cache()
    for n, idx in indices.items():
        cache.attach(n, idx)
    kube = Refusing({}, rv=7)
    asyncio.run(asyncio.wait_for(kopf_indices_complete(SimpleNamespace(kube=kube, cache=cache,
                                                                       leadership=Leadership()), indices), 10))
    assert cache.kopf_at is not None and kube.lists == 5  # the refused one, then kopf's four kinds
