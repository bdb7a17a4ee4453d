"""Each kind rejects bad input with the offending field named: a wrong type, a value out of range and a broken
cross-field rule (at least three invalid objects per kind)."""

import copy

import pytest

from corral.api import MAX_REPLICAS, CorralValidationError, parse

POD = {"spec": {"containers": [{"name": "sandbox", "image": "corral/python:bookworm"}]}}

VALID = {
    "SandboxTemplate": {"spec": {"podTemplate": POD}},
    "Sandbox": {"spec": {"podTemplate": POD, "operatingMode": "Running"}},
    "WarmPool": {"spec": {"replicas": 3, "templateRef": {"name": "python"}}},
    "Pool": {"spec": {"templateRef": {"name": "python"},
                      "capacity": {"bufferMin": 1, "bufferMax": 2, "poolMin": 0, "poolMax": 5}}},
    "SandboxClaim": {"spec": {"poolRef": {"kind": "WarmPool", "name": "python"}}},
}


def obj(kind, patch=None):
    o = {"apiVersion": "corral.dev/v1alpha1", "kind": kind, "metadata": {"name": "x"}, **copy.deepcopy(VALID[kind])}
    if patch:
        patch(o)
    return o


def set_path(path, value):
    def patch(o):
        *parents, last = path.split(".")
        node = o
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return patch


@pytest.mark.parametrize("kind", sorted(VALID))
def test_valid_objects_parse(kind):
    parsed = parse(obj(kind))
    assert parsed.kind == kind
    # The wire form round-trips.
    assert parse(parsed.to_k8s()).to_k8s() == parsed.to_k8s()


INVALID = [
    # SandboxTemplate
    ("SandboxTemplate", "spec.podTemplate.spec", "not-a-dict", "spec.podTemplate.spec"),
    ("SandboxTemplate", "spec.execd.port", 80, "spec.execd.port"),
    ("SandboxTemplate", "spec.podTemplate.spec", {"containers": []}, "spec.podTemplate.spec"),
    ("SandboxTemplate", "spec.envVarsInjectionPolicy", "Sometimes", "spec.envVarsInjectionPolicy"),
    # Sandbox
    ("Sandbox", "spec.shutdownTime", "tomorrow", "spec.shutdownTime"),
    ("Sandbox", "spec.operatingMode", "Paused", "spec.operatingMode"),
    ("Sandbox", "spec.podTemplate.spec", {"containers": [{"name": "c"}]}, "spec.podTemplate.spec"),
    # WarmPool
    ("WarmPool", "spec.replicas", "three", "spec.replicas"),
    ("WarmPool", "spec.replicas", MAX_REPLICAS + 1, "spec.replicas"),
    ("WarmPool", "spec.replicas", -1, "spec.replicas"),
    ("WarmPool", "spec.templateRef.name", "Not_A_DNS_Name", "spec.templateRef.name"),
    ("WarmPool", "spec.updateStrategy.type", "Rolling", "spec.updateStrategy.type"),
    # Pool
    ("Pool", "spec.capacity.poolMax", "ten", "spec.capacity.poolMax"),
    ("Pool", "spec.capacity.bufferMax", MAX_REPLICAS + 1, "spec.capacity.bufferMax"),
    ("Pool", "spec.capacity", {"bufferMin": 3, "bufferMax": 2}, "spec.capacity"),
    ("Pool", "spec.capacity", {"poolMin": 9, "poolMax": 5}, "spec.capacity"),
    ("Pool", "spec.recycleStrategy", "Reuse", "spec.recycleStrategy"),
    # SandboxClaim
    ("SandboxClaim", "spec.timeoutSeconds", "soon", "spec.timeoutSeconds"),
    ("SandboxClaim", "spec.timeoutSeconds", 0, "spec.timeoutSeconds"),
    ("SandboxClaim", "spec.poolRef.kind", "Deployment", "spec.poolRef.kind"),
    ("SandboxClaim", "spec.env", [{"name": "1BAD=NAME", "value": "x"}], "spec.env.0.name"),
    ("SandboxClaim", "spec.additionalPodMetadata.labels", {"corral.dev/pool": "x"},
     "spec.additionalPodMetadata.labels"),
    ("SandboxClaim", "spec.lifecycle.shutdownPolicy", "Keep", "spec.lifecycle.shutdownPolicy"),
]


@pytest.mark.parametrize("kind,path,value,named", INVALID, ids=[f"{k}:{p}={v!r}" for k, p, v, _ in INVALID])
def test_invalid_objects_name_the_field(kind, path, value, named):
    with pytest.raises(CorralValidationError) as exc:
        parse(obj(kind, set_path(path, value)))
    paths = [p for p, _ in exc.value.errors]
    assert named in paths, paths
    assert named in str(exc.value)


def test_each_kind_has_at_least_three_invalid_cases():
    counts = {k: sum(1 for c in INVALID if c[0] == k) for k in VALID}
    assert all(n >= 3 for n in counts.values()), counts


def test_unknown_fields_are_rejected_with_their_name():
    with pytest.raises(CorralValidationError) as exc:
        parse(obj("WarmPool", set_path("spec.replica", 3)))
    assert "spec.replica" in str(exc.value)


def test_unknown_kind_and_api_version():
    with pytest.raises(CorralValidationError, match="kind"):
        parse({"apiVersion": "corral.dev/v1alpha1", "kind": "Nope", "spec": {}})
    with pytest.raises(CorralValidationError, match="apiVersion"):
        parse({**obj("WarmPool"), "apiVersion": "corral.dev/v2"})


def test_reserved_annotation_domains_refused_but_others_allowed():
    ok = parse(obj("SandboxClaim", set_path("spec.additionalPodMetadata.annotations", {"example.com/team": "a"})))
    assert ok.spec.additional_pod_metadata.annotations == {"example.com/team": "a"}
    with pytest.raises(CorralValidationError, match="reserved"):
        parse(obj("SandboxClaim", set_path("spec.additionalPodMetadata.annotations", {"x.kubernetes.io/a": "b"})))


def test_defaults_follow_the_anchors():
    t = parse(obj("SandboxTemplate")).spec
    assert (t.network_policy_management, t.env_vars_injection_policy, t.volume_claim_templates_policy) == (
        "Managed", "Disallowed", "Disallowed")
    assert parse(obj("WarmPool")).spec.update_strategy.type == "OnReplenish"
    assert parse(obj("Pool")).spec.recycle_strategy == "Delete"
    assert parse(obj("SandboxClaim")).spec.lifecycle.shutdown_policy == "Delete"
