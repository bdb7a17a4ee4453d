"""Sharded mode (corral.operator.shards): two operator replicas, each reconciling the pools of the shards it holds
under its own Lease. Both serve claims at once, on pools of different shards, through either replica's claims API
(a request for the other's pool is forwarded to it); an idle pair makes no API call but its lease renewals; SIGKILL
one, and its shards move to the survivor within the lease time, with no claim lost or bound twice while the claims
API keeps answering through the survivor. And when two replicas both act on one pool at once (the moment of a
handover, made permanent here by giving each a shard group of its own), no sandbox is bound to two claims and no
claim to two sandboxes; and no SandboxBatch index ends with two sandboxes, nor a sandbox with two indexes."""

import contextlib
import threading
import time
from collections import Counter

import httpx
import pytest
from kubeutil import Sandbox, SandboxClaim, claim, idle_ready, template, wait_until, warm_pool
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace

from corral.operator.shards import shard_of

pytestmark = pytest.mark.kube

SHARDS = 4
LEASE = 5  # seconds


def auth(op) -> dict[str, str]:
    return {"Authorization": f"Bearer {op.api_token}"}


def metric(op, prefix: str) -> float:
    return sum(v for k, v in op.metrics().items() if k.startswith(prefix))


def binds(op) -> float:
    return metric(op, "corral_claim_latency_seconds_count")


def sharded(operator, kube_cluster, tmp_path, ns: str, name: str, group: str, shards: int = SHARDS):
    op = type(operator)(kube_cluster.kubeconfig, tmp_path / name)
    op.log_dir.mkdir()
    op.mode = []  # CORRAL_SHARDS makes it standalone kopf
    op.env = {"CORRAL_SHARDS": str(shards), "CORRAL_SHARD_LEASE_SECONDS": str(LEASE), "CORRAL_SHARD_GROUP": group,
              "CORRAL_NAMESPACE": ns, "CORRAL_API_NAMESPACE": ns}
    op.start()
    return op


def holders(kube, ns: str, group: str) -> tuple[dict[int, str | None], dict[str, str]]:
    """(shard -> holder identity, api address -> identity) from the leases."""
    shards, members = {}, {}
    for lease in kube.list(Lease, namespace=ns, labels={"corral.dev/shards": group}):
        name, spec = lease.metadata.name, lease.spec
        if name.startswith(f"{group}-shard-"):
            shards[int(name.rsplit("-", 1)[1])] = spec.holderIdentity
        elif name.startswith(f"{group}-replica-"):
            members[(lease.metadata.annotations or {}).get("corral.dev/claims-api-address", "")] = spec.holderIdentity
    return shards, members


def claims_per_sandbox(kube, ns: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """claim -> the live sandboxes labelled for it; claim -> the sandbox its status names."""
    labelled: dict[str, list[str]] = {}
    for s in kube.list(Sandbox, namespace=ns):
        c = (s.metadata.labels or {}).get("corral.dev/claim")
        if c and not s.metadata.deletionTimestamp:
            labelled.setdefault(c, []).append(s.metadata.name)
    named = {c.metadata.name: ((c.status or {}).get("sandbox") or {}).get("name")
             for c in kube.list(SandboxClaim, namespace=ns)}
    return labelled, named


def assert_bound_once(kube, ns: str, names: list[str]) -> None:
    def settled():
        labelled, named = claims_per_sandbox(kube, ns)
        bad = {n: (labelled.get(n), named.get(n)) for n in names if labelled.get(n) != [named.get(n)]}
        return (labelled, named) if not bad else None

    labelled, named = wait_until(settled, 60, 0.5, "every claim bound to exactly the one sandbox its status names",
                                 dump=lambda: claims_per_sandbox(kube, ns))
    sandboxes = [named[n] for n in names]
    assert len(set(sandboxes)) == len(sandboxes), f"a sandbox bound to two claims: {Counter(sandboxes)}"


def test_two_sharded_replicas_serve_claims_at_once_and_survive_sigkill(kube, kube_cluster, operator, ns, tmp_path):
    operator.stop()  # the session's standalone operator steps aside
    replicas = []
    try:
        for i in range(2):
            replicas.append(sharded(operator, kube_cluster, tmp_path, ns, f"r{i}", group=ns))
        r0, r1 = replicas

        def split():
            shards, members = holders(kube, ns, ns)
            ids = {op: members.get(op.api_url) for op in replicas}
            counts = Counter(shards.values())
            ok = len(shards) == SHARDS and all(ids.values()) and [counts[ids[op]] for op in replicas] == [2, 2]
            return (shards, ids) if ok else None

        shards, ids = wait_until(split, 60, 0.25, "two shards each",
                                 dump=lambda: (holders(kube, ns, ns), [op.log()[-1500:] for op in replicas]))
        # one pool in a shard of each replica
        pools = {}
        for op in replicas:
            pools[op] = next(f"wp{i}" for i in range(100)
                             if shards[shard_of(ns, "WarmPool", f"wp{i}", SHARDS)] == ids[op])
        kube.create(template("py"), namespace=ns)
        for op in replicas:
            kube.create(warm_pool(pools[op], "py", 4), namespace=ns)
        for op in replicas:
            wait_until(lambda p=pools[op]: len(idle_ready(kube, ns, p)) == 4, 60, 0.25, f"{pools[op]} ready",
                       dump=op.log)

        # Both replicas serve at once: claims on both pools, each sent to both replicas' APIs at the same time.
        before = {op: binds(op) for op in replicas}
        results: dict[str, httpx.Response] = {}

        def create(via, pool: str, name: str) -> None:
            results[name] = httpx.post(f"{via.api_url}/v1/claims", json={"pool": pool, "name": name},
                                       headers=auth(via), timeout=90)

        threads = [threading.Thread(target=create, args=(via, pools[owner], f"c-{i}-{j}-{k}"))
                   for i, via in enumerate(replicas) for j, owner in enumerate(replicas) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {n: r.status_code for n, r in results.items()} == {n: 201 for n in results}, \
            {n: r.text for n, r in results.items() if r.status_code != 201}
        # a request for the other replica's pool was forwarded to it (and says which shard)
        forwarded = [n for n, r in results.items() if "x-corral-shard" in r.headers]
        assert sorted(forwarded) == sorted(f"c-{i}-{j}-{k}" for i in range(2) for j in range(2) for k in range(2)
                                           if i != j), forwarded
        # each replica bound the claims of its own pool: four each
        wait_until(lambda: all(binds(op) - before[op] == 4 for op in replicas), 10, 0.25, "4 binds each",
                   dump=lambda: {op.api_url: binds(op) - before[op] for op in replicas})
        first = sorted(results)
        assert_bound_once(kube, ns, first)

        # Idle: no API call but the lease renewals, at a bounded rate (each replica renews its 2 shard leases and
        # its member lease every LEASE/3 s).
        for op in replicas:
            wait_until(lambda p=pools[op]: len(idle_ready(kube, ns, p)) == 4, 60, 0.25, "refilled")
        # other tests' namespaces are deleted in the background: their teardown is not "idle"
        wait_until(lambda: not [n for n in kube.list(Namespace) if n.metadata.name.startswith("t-")
                                and n.metadata.name != ns], 300, 1, "other test namespaces gone")
        time.sleep(2)
        snap = [op.metrics() for op in replicas]
        window = 12.0
        time.sleep(window)
        for op, before_m in zip(replicas, snap, strict=True):
            after = op.metrics()
            changed = {k: after[k] - before_m.get(k, 0) for k in after
                       if k.startswith(("corral_api_requests_total", "corral_reconciles_total"))
                       and after[k] != before_m.get(k, 0)}
            leases = {k: n for k, n in changed.items() if 'resource="Lease"' in k}
            others = {k: n for k, n in changed.items() if k not in leases}
            assert others == {}, f"API calls or reconciles while idle, besides lease renewals: {others}"
            renewals = sum(leases.values())
            bound = 3 * (window / (LEASE / 3) + 1)
            assert 0 < renewals <= bound, f"{renewals} lease calls in {window}s (bound {bound}): {leases}"

        # SIGKILL r1 while claims on both pools are being made through r0's API: r1's shards move to r0.
        results.clear()
        threads = [threading.Thread(target=create, args=(r0, pools[owner], f"k-{j}-{k}"))
                   for j, owner in enumerate(replicas) for k in range(3)]
        for t in threads[::2]:
            t.start()
        r1.kill()
        t0 = time.monotonic()
        for t in threads[1::2]:
            t.start()
        moved = wait_until(lambda: set(holders(kube, ns, ns)[0].values()) == {ids[r0]}, LEASE * 3, 0.1,
                           "every shard held by the survivor", dump=lambda: (holders(kube, ns, ns), r0.log()[-3000:]))
        took = time.monotonic() - t0
        assert moved and took < LEASE * 2, f"shards moved {took:.1f}s after the kill (lease {LEASE}s)"
        for t in threads:
            t.join()
        assert {n: r.status_code for n, r in results.items()} == {n: 201 for n in results}, \
            {n: r.text for n, r in results.items() if r.status_code != 201}
        # the claims API keeps answering through the survivor, for claims on the dead replica's pool too
        resp = httpx.post(f"{r0.api_url}/v1/claims", json={"pool": pools[r1], "name": "after"}, headers=auth(r0),
                          timeout=90)
        assert resp.status_code == 201, resp.text
        listed = httpx.get(f"{r0.api_url}/v1/claims", headers=auth(r0), timeout=10)
        assert listed.status_code == 200
        everything = [*first, *results, "after"]
        phases = {c["name"]: c["phase"] for c in listed.json()["items"]}
        assert all(phases.get(n) == "Ready" for n in everything), phases  # none lost
        assert_bound_once(kube, ns, everything)
        # and the dead replica's pool is refilled by the survivor
        wait_until(lambda: len(idle_ready(kube, ns, pools[r1])) == 4, 60, 0.25, "the moved pool refilled",
                   dump=r0.log)
        print(f"shards moved {took:.1f}s after SIGKILL (lease {LEASE}s)")
    finally:
        for op in replicas:
            op.stop()
        operator.start()


def split_brain(replicas: list, operator, kube, kube_cluster, tmp_path, ns: str, ready: int) -> None:
    """Two replicas that both hold the one shard of WarmPool "wp" (each a shard group of its own, one shard), appended
    to `replicas` (the caller stops them). The pool is filled by the first; the second joins for the claims: a split
    brain lasts a moment in a handover, not a whole fill (two replicas each creating the deficit the other's creates
    then make a surplus of fill a pool slowly, a cost of the split that the shard leases keep short)."""
    replicas.append(sharded(operator, kube_cluster, tmp_path, ns, "r0", group=f"{ns}-0", shards=1))
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", ready), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) >= ready, 120, 0.5, f"{ready} ready",
               dump=lambda: replicas[0].log()[-2000:])
    replicas.append(sharded(operator, kube_cluster, tmp_path, ns, "r1", group=f"{ns}-1", shards=1))
    wait_until(lambda: metric(replicas[1], "corral_shards_held") == 1, 30, 0.2, "the second replica's shard")


def test_two_replicas_acting_on_one_pool_at_once_never_bind_twice(kube, kube_cluster, operator, ns, tmp_path):
    """Split brain on purpose: each replica has a shard group of its own with one shard, so both hold the pool's
    shard and both reconcile every claim. The adoption patch (resourceVersion of the sandbox) and the Bound status
    write (resourceVersion of the claim) leave every claim with one sandbox and every sandbox with one claim."""
    operator.stop()
    replicas = []
    try:
        split_brain(replicas, operator, kube, kube_cluster, tmp_path, ns, 30)
        before = {op: (binds(op), metric(op, "corral_claim_lost_binds_total")) for op in replicas}
        # every sandbox each claim's status ever named, as the watch delivers it: a client that saw a claim Ready
        # must never see it move to another sandbox (a last-writer-wins status would)
        seen: dict[str, set[str]] = {}
        stop = threading.Event()

        def watch() -> None:
            from lightkube import Client, KubeConfig

            client = Client(config=KubeConfig.from_file(kube_cluster.kubeconfig))
            for _type, obj in client.watch(SandboxClaim, namespace=ns):
                name = ((obj.status or {}).get("sandbox") or {}).get("name")
                if name:
                    seen.setdefault(obj.metadata.name, set()).add(name)
                if stop.is_set():
                    return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        time.sleep(0.5)
        names = [f"c{i}" for i in range(20)]
        for n in names:
            kube.create(claim(n, "wp"), namespace=ns)
        wait_until(lambda: all((c.status or {}).get("phase") == "Bound"
                               for c in kube.list(SandboxClaim, namespace=ns)), 60, 0.25, "all Bound")
        assert_bound_once(kube, ns, names)
        time.sleep(2)
        stop.set()
        kube.create(claim("last", "wp"), namespace=ns)  # one more event: the watcher sees `stop`
        assert sorted(seen) == sorted([*names, "last"]) or sorted(seen) == sorted(names), seen
        moved = {n: s for n, s in seen.items() if len(s) != 1}
        assert not moved, f"claims whose status named two sandboxes: {moved}"
        # both replicas did act on these claims (or the test proved nothing): each bound some, or lost a race
        acted = {op.api_url: (binds(op) - before[op][0],
                              metric(op, "corral_claim_lost_binds_total") - before[op][1]) for op in replicas}
        assert all(b + lost > 0 for b, lost in acted.values()), acted
        print(f"split brain: (binds, lost binds) per replica {acted}")
    finally:
        for op in replicas:
            op.stop()
        operator.start()


def indexes_per_sandbox(kube, ns: str, batches: list[str]) -> tuple[dict[str, list[str]], dict[str, str | None]]:
    """'<batch>_<index>' -> the live sandboxes labelled for it; '<batch>_<index>' -> the sandbox the batch's status
    names for that index."""
    from test_operator_batches import SandboxBatch

    labelled: dict[str, list[str]] = {}
    for s in kube.list(Sandbox, namespace=ns):
        label = (s.metadata.labels or {}).get("corral.dev/claim")
        if label and not s.metadata.deletionTimestamp:
            labelled.setdefault(label, []).append(s.metadata.name)
    named: dict[str, str | None] = {}
    for name in batches:
        for e in (kube.get(SandboxBatch, name, namespace=ns).status or {}).get("indexes") or []:
            named[f"{name}_{e['index']}"] = e.get("sandbox")
    return labelled, named


def test_two_replicas_acting_on_one_pool_at_once_give_each_batch_index_one_sandbox(kube, kube_cluster, operator, ns,
                                                                                    tmp_path):
    """Split brain on purpose, as above, for SandboxBatches: both replicas bind every index of the same batches at
    once (each adoption is conditional on the sandbox's version only, so each replica can take a different sandbox
    for one index). The batch's status write, conditional on the batch's version, settles it: every index ends with
    exactly the one sandbox its status names, no sandbox serves two indexes, and no index's status ever names a
    second sandbox."""
    from test_operator_batches import SandboxBatch, batch

    operator.stop()
    replicas = []
    try:
        split_brain(replicas, operator, kube, kube_cluster, tmp_path, ns, 24)
        adoptions = 'corral_api_requests_total{resource="Sandbox",verb="patch"}'

        def batch_calls(op) -> float:
            return sum(v for k, v in op.metrics().items()
                       if k.startswith("corral_api_requests_total") and 'resource="SandboxBatch' in k)

        before = {op: (op.metrics().get(adoptions, 0), metric(op, "corral_claim_lost_binds_total"), batch_calls(op))
                  for op in replicas}
        # every sandbox each index's status ever named, as the watch delivers it
        seen: dict[str, set[str]] = {}
        stop = threading.Event()

        def watch() -> None:
            from lightkube import Client, KubeConfig

            client = Client(config=KubeConfig.from_file(kube_cluster.kubeconfig))
            with contextlib.suppress(Exception):  # the namespace goes at the end of a failed test
                for _type, obj in client.watch(SandboxBatch, namespace=ns):
                    for e in (obj.status or {}).get("indexes") or []:
                        if e.get("sandbox"):
                            seen.setdefault(f"{obj.metadata.name}_{e['index']}", set()).add(e["sandbox"])
                    if stop.is_set():
                        return

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        time.sleep(0.5)
        names, n = [f"b{i}" for i in range(3)], 6  # 18 indexes, 24 warm: both replicas cannot take 18 warm each
        for name in names:
            kube.create(batch(name, "wp", n), namespace=ns)
        indexes = [f"{name}_{i}" for name in names for i in range(n)]

        def settled():
            labelled, named = indexes_per_sandbox(kube, ns, names)
            bad = {i: (labelled.get(i), named.get(i)) for i in indexes
                   if not named.get(i) or labelled.get(i) != [named.get(i)]}
            return (labelled, named) if not bad else None

        labelled, named = wait_until(settled, 90, 0.5, "every index with exactly the one sandbox its status names",
                                     dump=lambda: (indexes_per_sandbox(kube, ns, names),
                                                   [op.log()[-3000:] for op in replicas]))
        sandboxes = [named[i] for i in indexes]
        assert len(set(sandboxes)) == len(sandboxes), f"a sandbox serving two indexes: {Counter(sandboxes)}"
        extra = {label: s for label, s in labelled.items() if label.startswith(tuple(f"{b}_" for b in names))
                 and label not in indexes}
        assert not extra, f"sandboxes labelled for indexes the batches do not have: {extra}"
        phases = {name: (kube.get(SandboxBatch, name, namespace=ns).status or {}).get("phase") for name in names}
        assert phases == {name: "Finished" for name in names}, phases
        time.sleep(2)
        stop.set()
        kube.create(batch("last", "wp", 1), namespace=ns)  # one more event: the watcher sees `stop`
        watcher.join(timeout=10)
        moved = {i: s for i, s in seen.items() if i in indexes and len(s) != 1}
        assert not moved, f"indexes whose status named two sandboxes: {moved}"
        # both replicas did act on these batches (or the test proved nothing): each adopted sandboxes for them
        acted = {op.api_url: (op.metrics().get(adoptions, 0) - before[op][0],
                              metric(op, "corral_claim_lost_binds_total") - before[op][1],
                              batch_calls(op) - before[op][2])
                 for op in replicas}
        assert all(adopted > 0 for adopted, _lost, _writes in acted.values()), acted
        print(f"split brain, batches: (adoption patches, lost binds, SandboxBatch calls) per replica {acted}")
    finally:
        for op in replicas:
            op.stop()
        operator.start()


def test_leases_of_an_earlier_sharding_configuration_are_swept(kube, kube_cluster, operator, ns, tmp_path):
    """Four shards, then two: the holder of shard 0 deletes the leases of shards 2 and 3. Then sharding off: the
    active (unsharded) operator deletes the rest of the group's leases, a member lease left by a replica killed long
    ago among them, and leaves one renewed a moment ago (a replica of the old configuration still running)."""
    from datetime import UTC, datetime, timedelta

    from lightkube.models.coordination_v1 import LeaseSpec
    from lightkube.models.meta_v1 import ObjectMeta

    group = ns

    def names() -> set[str]:
        return {le.metadata.name for le in kube.list(Lease, namespace=ns, labels={"corral.dev/shards": group})}

    def held(n: int):
        shards, _ = holders(kube, ns, group)
        return shards if len(shards) >= n and all(shards.get(s) for s in range(n)) else None

    operator.stop()  # the session's standalone operator steps aside
    four = sharded(operator, kube_cluster, tmp_path, ns, "four", group=group)
    try:
        wait_until(lambda: held(SHARDS), 30, 0.25, "four shards held")
    finally:
        four.stop()  # releases its shards, deletes its member lease
    assert names() == {f"{group}-shard-{s}" for s in range(SHARDS)}
    two = sharded(operator, kube_cluster, tmp_path, ns, "two", group=group, shards=2)
    try:
        wait_until(lambda: names() if {f"{group}-shard-2", f"{group}-shard-3"}.isdisjoint(names()) and held(2)
                   else None, 30, 0.25, "the leases of shards 2 and 3 gone", dump=names)
    finally:
        two.stop()
    now = datetime.now(UTC)
    for name, holder, ago in ((f"{group}-replica-dead", "killed-long-ago", 3600),
                              (f"{group}-replica-live", "alive", 1)):
        kube.create(Lease(metadata=ObjectMeta(name=name, namespace=ns, labels={"corral.dev/shards": group}),
                          spec=LeaseSpec(holderIdentity=holder, leaseDurationSeconds=LEASE,
                                         renewTime=now - timedelta(seconds=ago))))
    unsharded = type(operator)(kube_cluster.kubeconfig, tmp_path / "unsharded")
    unsharded.log_dir.mkdir()
    unsharded.env = {"CORRAL_SHARD_GROUP": group, "CORRAL_NAMESPACE": ns}
    unsharded.start()
    try:
        wait_until(lambda: names() if names() == {f"{group}-replica-live"} else None, 30, 0.25,
                   "only the lease renewed a moment ago left", dump=names)
    finally:
        unsharded.stop()
        operator.start()
