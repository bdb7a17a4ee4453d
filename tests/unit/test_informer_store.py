"""The informers' decode-and-apply path (operator/informer.py) without a stream: watch lines decoded into the values
the Cache serves, under the keys kopf's indices used; a listing that replaces the store reports what went meanwhile.
(The streams themselves, reconnects included, run against the real API server: tests/kube/test_operator_informer.py.)"""

from __future__ import annotations

import json
from types import SimpleNamespace

from corral.operator.cache import Cache
from corral.operator.informer import KINDS, Informer

SPECS = {s.kind: s for s in KINDS}
MANAGED = [{"manager": "corral", "operation": "Update", "fieldsV1": {"f:status": {"f:phase": {}}}}]


def sandbox(name: str, uid: str, rv: str, labels: dict[str, str], ready: bool = True) -> dict:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv, "labels": labels,
                         "creationTimestamp": "2026-01-02T03:04:05Z", "managedFields": MANAGED},
            "spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "python"}]}}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def line(event: str, obj: dict) -> bytes:
    return json.dumps({"type": event, "object": obj}).encode()


def informer(kind: str) -> tuple[Informer, list[tuple[str, str, str]], Cache]:
    requested: list[tuple[str, str, str]] = []
    cache = Cache()
    context = SimpleNamespace(cache=cache, request=lambda *key: requested.append(key),
                              claims=SimpleNamespace(adoption_seen=lambda ns, name: None))
    inf = Informer(SPECS[kind], context, transport=None)  # type: ignore[arg-type]
    cache.attach(inf.spec.index, inf.store.index)
    return inf, requested, cache


def apply(inf: Informer, raw: bytes) -> None:
    ev = inf.spec.event_decoder.decode(raw)
    inf._apply(ev.type, ev.object)


def test_a_sandbox_event_is_a_body_without_managed_fields_under_its_pool_and_claim_keys():
    inf, requested, cache = informer("Sandbox")
    pool = {"corral.dev/pool": "wp", "corral.dev/pool-kind": "WarmPool"}
    apply(inf, line("ADDED", sandbox("s1", "u1", "10", pool)))
    body = cache.sandbox("ns", "s1")
    assert "managedFields" not in body["metadata"] and "annotations" not in body["metadata"]
    assert body["spec"]["podTemplate"]["spec"]["containers"][0]["image"] == "python"
    (member,) = cache.members("ns", "WarmPool", "wp")
    assert member.name == "s1" and member.ready
    assert requested == [("Sandbox", "ns", "s1"), ("WarmPool", "ns", "wp")]
    # adopted by claim c1: the member moves, the claim is woken; no key keeps a stale value
    apply(inf, line("MODIFIED", sandbox("s1", "u1", "11", {**pool, "corral.dev/claim": "c1"})))
    assert cache.claim_sandbox("ns", "c1").resource_version == "11"
    assert cache.members("ns", "WarmPool", "wp")[0].claim == "c1"
    assert ("SandboxClaim", "ns", "c1") in requested
    apply(inf, line("MODIFIED", sandbox("s1", "u1", "12", {"corral.dev/claim": "c1"})))  # left the pool
    assert cache.members("ns", "WarmPool", "wp") == [] and ("WarmPool", "ns", "wp") not in inf.store.index
    apply(inf, line("DELETED", sandbox("s1", "u1", "13", {"corral.dev/claim": "c1"})))
    assert cache.sandbox("ns", "s1") is None and cache.claim_sandbox("ns", "c1") is None and not inf.store.index


def test_a_listing_reports_what_went_while_nobody_watched_as_deleted():
    inf, requested, cache = informer("SandboxClaim")
    claim = {"apiVersion": "corral.dev/v1alpha1", "kind": "SandboxClaim",
             "metadata": {"name": "c1", "namespace": "ns", "uid": "u-c1", "resourceVersion": "5"},
             "spec": {"poolRef": {"kind": "Pool", "name": "p"}}}
    kept = {**claim, "metadata": {**claim["metadata"], "name": "c2", "uid": "u-c2"}}
    apply(inf, line("ADDED", claim))
    apply(inf, line("ADDED", kept))
    assert len(cache.claims_for("ns", "Pool", "p")) == 2
    requested.clear()
    page = inf.spec.list_decoder.decode(json.dumps({"metadata": {"resourceVersion": "9"}, "items": [kept]}))
    inf.apply_listing(page.items)
    assert cache.claim("ns", "c1") is None and [c["metadata"]["name"] for c in cache.claims_for("ns", "Pool", "p")] \
        == ["c2"]
    # c1's synthesized DELETED does what a real one does: its Pool gets room back
    assert ("SandboxClaim", "ns", "c1") in requested and ("Pool", "ns", "p") in requested


def test_a_pod_event_is_a_pod_info_under_its_sandbox():
    inf, requested, cache = informer("Pod")
    pod = {"metadata": {"name": "s1-pod", "namespace": "ns", "uid": "p1", "resourceVersion": "3",
                        "labels": {"corral.dev/sandbox": "s1"}, "managedFields": MANAGED},
           "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "python", "env": [{"name": "A"}]}]},
           "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    apply(inf, line("ADDED", pod))
    info = cache.pod("ns", "s1")
    assert (info.name, info.ready, info.pod_ips, info.node, info.phase) == ("s1-pod", True, ("10.0.0.1",), "n1",
                                                                           "Running")
    assert requested == [("Sandbox", "ns", "s1")]


def test_an_error_event_carries_its_code():
    ev = SPECS["Pod"].event_decoder.decode(json.dumps({"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410, "reason": "Expired",
        "message": "too old resource version: 1 (200)"}}))
    assert (ev.type, ev.object.code) == ("ERROR", 410)


def test_cache_ready_needs_kopf_and_every_informer():
    cache = Cache()
    cache.bind({n: {} for n in ("templates_idx", "warmpools_idx", "pools_idx", "batches_idx")})
    assert not cache.ready
    for n in ("claims_idx", "sandboxes_idx"):
        cache.mark_synced(n)
    assert not cache.ready
    cache.mark_synced("pods_idx")
    assert cache.ready
