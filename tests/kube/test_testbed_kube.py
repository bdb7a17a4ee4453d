"""kube tier: Corral's CRDs on a real kube-apiserver, which enforces their schemas and CEL rules itself; kwok nodes
run pods to Ready with loopback IPs."""

import ipaddress
import time
import uuid

import pytest
from lightkube import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod
from lightkube.types import PatchType

pytestmark = pytest.mark.kube

WarmPool = create_namespaced_resource("corral.dev", "v1alpha1", "WarmPool", "warmpools")
Pool = create_namespaced_resource("corral.dev", "v1alpha1", "Pool", "pools")
SandboxClaim = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxClaim", "sandboxclaims")


@pytest.fixture
def ns(kube):
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


def warm_pool(name, replicas=2, template="python"):
    return WarmPool(metadata=ObjectMeta(name=name), spec={"replicas": replicas, "templateRef": {"name": template}})


def test_valid_objects_are_accepted_and_defaulted(kube, corral_crds, ns):
    created = kube.create(warm_pool("wp"), namespace=ns)
    assert created.spec["replicas"] == 2
    assert created.spec["updateStrategy"] == {"type": "OnReplenish"}  # the CRD's default, applied by the server
    pool = kube.create(Pool(metadata=ObjectMeta(name="p"), spec={"templateRef": {"name": "python"},
                            "capacity": {"bufferMin": 1, "bufferMax": 2, "poolMin": 0, "poolMax": 5}}), namespace=ns)
    assert pool.spec["recycleStrategy"] == "Delete"


def test_template_ref_is_immutable(kube, corral_crds, ns):
    kube.create(warm_pool("wp"), namespace=ns)
    with pytest.raises(ApiError) as exc:
        kube.patch(WarmPool, "wp", {"spec": {"templateRef": {"name": "other"}}}, namespace=ns,
                   patch_type=PatchType.MERGE)
    assert exc.value.status.code == 422
    assert "templateRef is immutable" in exc.value.status.message
    # Other fields stay mutable.
    kube.patch(WarmPool, "wp", {"spec": {"replicas": 3}}, namespace=ns, patch_type=PatchType.MERGE)


def test_pool_ref_is_immutable(kube, corral_crds, ns):
    kube.create(SandboxClaim(metadata=ObjectMeta(name="c"), spec={"poolRef": {"name": "a"}}), namespace=ns)
    with pytest.raises(ApiError) as exc:
        kube.patch(SandboxClaim, "c", {"spec": {"poolRef": {"name": "b"}}}, namespace=ns, patch_type=PatchType.MERGE)
    assert "poolRef is immutable" in exc.value.status.message


def test_buffer_min_above_max_is_rejected(kube, corral_crds, ns):
    bad = Pool(metadata=ObjectMeta(name="p"), spec={"templateRef": {"name": "python"},
               "capacity": {"bufferMin": 3, "bufferMax": 2, "poolMin": 0, "poolMax": 5}})
    with pytest.raises(ApiError) as exc:
        kube.create(bad, namespace=ns)
    assert exc.value.status.code == 422
    assert "bufferMin must be <= bufferMax" in exc.value.status.message


def test_replicas_over_the_maximum_is_rejected(kube, corral_crds, ns):
    with pytest.raises(ApiError) as exc:
        kube.create(warm_pool("big", replicas=1001), namespace=ns)
    assert exc.value.status.code == 422
    assert "spec.replicas" in exc.value.status.message


def test_scale_subresource(kube, corral_crds, ns):
    kube.create(warm_pool("wp", replicas=1), namespace=ns)
    kube.patch(WarmPool.Scale, "wp", {"spec": {"replicas": 4}}, namespace=ns, patch_type=PatchType.MERGE)
    assert kube.get(WarmPool, "wp", namespace=ns).spec["replicas"] == 4


def test_pod_on_a_kwok_node_becomes_running_and_ready_with_a_loopback_ip(kube, ns):
    nodes = [n for n in kube.list(Node) if (n.metadata.annotations or {}).get("kwok.x-k8s.io/node") == "fake"]
    assert nodes, "no kwok nodes"
    pod = Pod.from_dict({
        "metadata": {"name": "hello"},
        "spec": {"containers": [{"name": "c", "image": "corral/python:bookworm"}],
                 "automountServiceAccountToken": False},
    })
    kube.create(pod, namespace=ns)
    deadline = time.monotonic() + 60
    while True:
        p = kube.get(Pod, "hello", namespace=ns)
        ready = any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
        if p.status.phase == "Running" and ready:
            break
        assert time.monotonic() < deadline, f"pod not Running/Ready: {p.status}"
        time.sleep(0.5)
    assert p.spec.nodeName in {n.metadata.name for n in nodes}
    assert ipaddress.ip_address(p.status.podIP).is_loopback, p.status.podIP
