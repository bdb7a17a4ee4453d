"""Sharded mode's pure parts (corral.operator.shards): the shard function, fair share, the assignment, and what a
replica does with its leases given a view and a time; and one step of the lease loop against a fake API server."""

import time
from collections import Counter

import pytest
from fakekube import FakeKube

from corral.operator.cache import Cache
from corral.operator.shards import (
    Observed,
    ShardMap,
    Shards,
    ShardSettings,
    assign,
    fair_share,
    member_lease_name,
    observe,
    plan,
    shard_of,
)


def test_shard_of_is_stable_and_spreads():
    assert shard_of("ns", "WarmPool", "wp", 8) == shard_of("ns", "WarmPool", "wp", 8)
    assert 0 <= shard_of("ns", "WarmPool", "wp", 8) < 8
    # the known value: the same in every process and Python version (blake2b, never hash())
    assert shard_of("ns", "WarmPool", "wp", 1000) == shard_of("ns", "WarmPool", "wp", 1000)
    spread = Counter(shard_of("ns", "WarmPool", f"pool-{i}", 8) for i in range(800))
    assert len(spread) == 8 and min(spread.values()) > 60
    assert shard_of("a", "WarmPool", "p", 64) != shard_of("a", "Pool", "p", 64) or \
        shard_of("b", "WarmPool", "p", 64) != shard_of("b", "Pool", "p", 64)


@pytest.mark.parametrize(("shards", "replicas", "share"), [(8, 1, 8), (8, 2, 4), (8, 3, 3), (4, 3, 2), (2, 5, 1),
                                                           (8, 0, 8)])
def test_fair_share(shards, replicas, share):
    assert fair_share(shards, replicas) == share


def test_assign_balances_and_keeps_holders():
    # alone: everything
    assert assign(4, ["a"], {}) == {0: "a", 1: "a", 2: "a", 3: "a"}
    # b joins while a holds all four: a keeps two (the lowest), b gets two
    got = assign(4, ["a", "b"], {0: "a", 1: "a", 2: "a", 3: "a"})
    assert Counter(got.values()) == {"a": 2, "b": 2} and got[0] == got[1] == "a"
    # three replicas, eight shards: 3/3/2, never more than the fair share
    got = assign(8, ["a", "b", "c"], {})
    assert sorted(Counter(got.values()).values()) == [2, 3, 3]
    assert max(Counter(got.values()).values()) == fair_share(8, 3)
    # a holder keeps its shards within its quota: nothing moves when nothing changed
    held = {0: "b", 1: "c", 2: "a", 3: "b", 4: "c", 5: "a", 6: "b", 7: "c"}
    assert assign(8, ["a", "b", "c"], held) == held
    # a dead member's shards (not in the live set) go to the survivors
    got = assign(4, ["a"], {0: "a", 1: "a", 2: "dead", 3: "dead"})
    assert set(got.values()) == {"a"}
    # the same view gives the same answer whatever the order of the members
    assert assign(8, ["c", "a", "b"], {1: "c"}) == assign(8, ["b", "c", "a"], {1: "c"})


def lease(holder, seen, duration=10.0, rv="1"):
    return Observed(holder=holder, duration=duration, rv=rv, seen=seen)


def test_plan_acquires_free_shards_up_to_its_share():
    leases = {s: lease(None, 0) for s in range(4)}
    p = plan("a", 4, leases, {"a"}, set(), now=100)
    assert p.acquire == (0, 1, 2, 3) and p.release == ()
    # with b live, a takes two and leaves two for b
    p = plan("a", 4, leases, {"a", "b"}, set(), now=100)
    assert len(p.acquire) == 2


def test_plan_never_takes_a_live_lease_and_takes_an_expired_one():
    leases = {0: lease("b", seen=95), 1: lease("b", seen=95)}
    # b renewed 5 s ago (duration 10): live; a may not take it even when b is not a live member any more
    assert plan("a", 2, leases, {"a"}, set(), now=100).acquire == ()
    # 10 s after the last renewal this replica saw: free
    assert plan("a", 2, leases, {"a"}, set(), now=105.5).acquire == (0, 1)


def test_plan_releases_what_is_assigned_to_a_newcomer():
    leases = {s: lease("a", seen=99) for s in range(4)}
    p = plan("a", 4, leases, {"a", "b"}, {0, 1, 2, 3}, now=100)
    assert len(p.release) == 2 and p.acquire == ()
    # and b, seeing them released, takes exactly those
    after = {s: (lease(None, 100) if s in p.release else lease("a", 100)) for s in range(4)}
    assert plan("b", 4, after, {"a", "b"}, set(), now=100.1).acquire == p.release


def test_plan_clears_a_run_out_lease_that_another_replica_is_to_take():
    # "dead" holds 0 and 1 and stopped renewing 12 s ago (duration 10); "new" joined since: a keeps its own two
    leases = {0: lease("dead", seen=88), 1: lease("dead", seen=88), 2: lease("a", 99), 3: lease("a", 99)}
    p = plan("a", 4, leases, {"a", "new"}, {2, 3}, now=100)
    assert (p.acquire, p.release, p.reap) == ((), (), (0, 1))  # cleared for "new", who takes them at once:
    free = {**leases, 0: lease(None, 100), 1: lease(None, 100)}
    assert plan("new", 4, free, {"a", "new"}, set(), now=100.1).acquire == (0, 1)
    # ...where "new"'s own view, timed from its first sight of them, still had them live for 10 s
    assert plan("new", 4, {s: lease(h.holder, 97) for s, h in leases.items()}, {"a", "new"}, set(),
                now=100.1).acquire == ()
    # not before they ran out here, not what this replica takes itself, not what nobody holds
    assert plan("a", 4, leases, {"a", "new"}, {2, 3}, now=97).reap == ()
    assert plan("a", 4, leases, {"a"}, {2, 3}, now=100).acquire == (0, 1)
    assert plan("a", 4, leases, {"a"}, {2, 3}, now=100).reap == ()
    assert plan("a", 4, free, {"a", "new"}, {2, 3}, now=100).reap == ()


def lease_body(name: str, holder: str | None) -> dict:
    spec = {"leaseDurationSeconds": 10} | ({"holderIdentity": holder, "renewTime": "t0"} if holder else {})
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec,
            "metadata": {"name": name, "namespace": "ops", "labels": {"corral.dev/shards": "corral"}}}


@pytest.mark.parametrize("member_seen_ago", [11, 1])
async def test_a_replica_that_saw_a_holder_die_frees_its_leases_for_one_that_joined_since(member_seen_ago):
    """A Deployment's replacement pod joins before the dead replica's leases run out: it times them from its own first
    sight, so alone it would leave them unheld a whole lease more. The survivor, which saw them run out, clears them
    (shards and the dead one's member lease, even when that was renewed last and has not run out yet): the newcomer
    takes its share at its next step."""
    kube = FakeKube()
    names = {"dead": member_lease_name("dead"), "old": member_lease_name("old"), "new": member_lease_name("new")}
    for s, holder in enumerate(["dead", "dead", "old", "old"]):
        kube.put(lease_body(f"corral-shard-{s}", holder))
    for who, name in names.items():
        kube.put(lease_body(name, who))

    def replica(me: str, seen_ago: dict[str, float]) -> Shards:
        r = Shards(settings=ShardSettings(shards=4, namespace="ops", duration=10), me=me, kube=kube,
                   shard_map=ShardMap(FakeCache(), 4))
        now = time.monotonic()
        for obj in kube.of_kind("Lease", "ops"):
            r._apply([obj], now - seen_ago.get(obj["metadata"]["name"], 0))
        r._renewed[r.member_name] = now
        return r

    # "old" saw "dead" renew its shards 11 s ago (its member lease maybe just 1 s ago); "new" has just joined
    old = replica("old", {"corral-shard-0": 11, "corral-shard-1": 11, names["dead"]: member_seen_ago})
    for s in (2, 3):
        old.valid_until[s] = time.monotonic() + 8
        old._renewed[old.shard_lease(s)] = time.monotonic()
    new = replica("new", {})  # everything seen just now: "dead" looks live for 10 s more
    await new._step()
    assert new.held() == set()
    await old._step()
    holders = {o["metadata"]["name"]: o["spec"].get("holderIdentity") for o in kube.of_kind("Lease", "ops")}
    assert holders == {"corral-shard-0": None, "corral-shard-1": None, "corral-shard-2": "old",
                       "corral-shard-3": "old", names["dead"]: None, names["old"]: "old", names["new"]: "new"}
    for obj in kube.of_kind("Lease", "ops"):  # what new's watch brings
        new._apply([obj], time.monotonic())
    await new._step()
    assert new.held() == {0, 1} and old.held() == {2, 3}


def test_observe_times_expiry_from_local_observation():
    body = {"metadata": {"resourceVersion": "5", "annotations": {"corral.dev/claims-api-address": "http://x:1"}},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 10, "renewTime": "t1"}}
    first = observe(None, body, now=50)
    assert first.live(59) and not first.live(60) and first.address == "http://x:1"
    # the same record seen again (another field changed): the clock does not restart
    assert observe(first, {**body, "metadata": {"resourceVersion": "6"}}, now=55).seen == 50
    # a renewal restarts it
    renewed = {**body, "spec": {**body["spec"], "renewTime": "t2"}}
    assert observe(first, renewed, now=55).seen == 55
    # released: nobody holds it
    released = {"metadata": {"resourceVersion": "7"}, "spec": {"leaseDurationSeconds": 10}}
    assert not observe(first, released, now=56).live(56)


def test_member_lease_names_are_valid_and_distinct():
    a, b = member_lease_name("host/123/abc"), member_lease_name("host/124/abc")
    assert a != b and a.startswith("corral-replica-") and "/" not in a and len(a) < 64
    assert member_lease_name("host/123/abc", "other").startswith("other-replica-")


class FakeCache:
    ready = True

    def __init__(self):
        self.objs = {}

    def get(self, kind, ns, name):
        return self.objs.get((kind, ns, name))

    def claim(self, ns, name):
        return self.get("SandboxClaim", ns, name)

    def batch(self, ns, name):
        return self.get("SandboxBatch", ns, name)

    def sandbox(self, ns, name):
        return self.get("Sandbox", ns, name)

    holder = Cache.holder  # the claim or batch a sandbox's claim label names, as the operator's cache finds it


def test_shard_map_puts_a_pool_and_everything_on_it_in_one_shard():
    cache, n = FakeCache(), 16
    pool = shard_of("ns", "WarmPool", "wp", n)
    cache.objs[("SandboxClaim", "ns", "c1")] = {"spec": {"poolRef": {"kind": "WarmPool", "name": "wp"}}}
    cache.objs[("SandboxBatch", "ns", "b1")] = {"spec": {"poolRef": {"name": "wp"}}}
    cache.objs[("Sandbox", "ns", "s1")] = {"metadata": {"labels": {"corral.dev/pool": "wp"}}}
    cache.objs[("Sandbox", "ns", "cold")] = {"metadata": {"labels": {"corral.dev/claim": "c1"}}}
    smap = ShardMap(cache, n)
    for key in [("WarmPool", "ns", "wp"), ("SandboxClaim", "ns", "c1"), ("SandboxBatch", "ns", "b1"),
                ("Sandbox", "ns", "s1"), ("Sandbox", "ns", "cold")]:
        assert smap.shard(key) == pool, key
    # a Pool of the same name is another pool
    pool_kind = shard_of("ns", "Pool", "wp", n)
    cache.objs[("Sandbox", "ns", "s2")] = {"metadata": {"labels": {"corral.dev/pool": "wp",
                                                                   "corral.dev/pool-kind": "Pool"}}}
    assert smap.shard(("Sandbox", "ns", "s2")) == pool_kind
    # gone from the cache: the shard it had when last seen (its cleanup reconcile runs where it ran)
    del cache.objs[("SandboxClaim", "ns", "c1")]
    assert smap.shard(("SandboxClaim", "ns", "c1")) == pool


def test_shard_settings_from_env():
    assert ShardSettings.from_env({}) is None
    assert ShardSettings.from_env({"CORRAL_SHARDS": "0"}) is None
    s = ShardSettings.from_env({"CORRAL_SHARDS": "4", "CORRAL_NAMESPACE": "ops", "CORRAL_POD_IP": "10.0.0.7"},
                               api_port=7780)
    assert s is not None and (s.shards, s.namespace, s.address, s.duration) == (4, "ops", "http://10.0.0.7:7780", 15)
    s = ShardSettings.from_env({"CORRAL_SHARDS": "2", "CORRAL_API_HOST": "0.0.0.0"}, api_port=7780)
    assert s is not None and s.address == ""


def test_leftover_leases_are_those_of_no_current_shard_once_free_or_stale() -> None:
    """Shard leases of index >= N (all of the group's leases with sharding off, member leases too) are left over
    once nobody holds them or nobody renewed them for LEFTOVER_AFTER s; other namespaces and groups are not looked
    at. The wait is until the first held one is due."""
    from datetime import UTC, datetime, timedelta

    from corral.operator.shards import LEFTOVER_AFTER, leftovers

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)

    def lease(name: str, holder: str | None = None, ago: float = 0.0, ns: str = "ops") -> dict:
        renew = (now - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"metadata": {"name": name, "namespace": ns, "resourceVersion": f"rv-{name}"},
                "spec": {"holderIdentity": holder, "renewTime": renew if holder else None}}

    items = [lease("g-shard-0", "a", 1), lease("g-shard-1"), lease("g-shard-2"), lease("g-shard-3", "old", 60),
             lease("g-shard-4", "dead", LEFTOVER_AFTER + 1), lease("g-replica-aa", "a", 1),
             lease("g-replica-bb", "dead", LEFTOVER_AFTER + 5), lease("g-shard-5", ns="elsewhere"),
             lease("h-shard-7"), lease("g-shard-x")]
    gone, wait = leftovers(items, "ops", "g", 2, now)
    assert gone == [("g-shard-2", "rv-g-shard-2"), ("g-shard-4", "rv-g-shard-4")]
    assert wait == LEFTOVER_AFTER - 60
    gone, wait = leftovers(items, "ops", "g", 0, now)  # sharding off
    assert [n for n, _ in gone] == ["g-shard-1", "g-shard-2", "g-shard-4", "g-replica-bb"]
    assert wait == LEFTOVER_AFTER - 60
    assert leftovers(items[:2], "ops", "g", 2, now) == ([], None)
