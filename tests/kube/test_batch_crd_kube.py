"""kube tier: the SandboxBatch CRD on a real kube-apiserver, which enforces its schema and CEL rules itself."""

import uuid

import pytest
from lightkube import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace
from lightkube.types import PatchType

pytestmark = pytest.mark.kube

SandboxBatch = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxBatch", "sandboxbatches")


@pytest.fixture
def ns(kube):
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


def batch(name="b", replicas=3, **spec):
    return SandboxBatch(metadata=ObjectMeta(name=name), spec={"poolRef": {"name": "wp"}, "replicas": replicas, **spec})


def rejected(kube, ns, obj) -> str:
    with pytest.raises(ApiError) as exc:
        kube.create(obj, namespace=ns)
    assert exc.value.status.code == 422
    return exc.value.status.message


def test_a_batch_is_accepted_and_defaulted(kube, corral_crds, ns):
    created = kube.create(batch(task={"argv": ["true"]}), namespace=ns)
    assert created.spec["poolRef"] == {"kind": "WarmPool", "name": "wp"}
    assert created.spec["lifecycle"] == {"shutdownPolicy": "Delete"}
    kube.create(batch("bare"), namespace=ns)
    assert "task" not in kube.get(SandboxBatch, "bare", namespace=ns).spec  # no task: none invented


def test_pool_ref_and_replicas_are_immutable(kube, corral_crds, ns):
    kube.create(batch(), namespace=ns)
    for change, what in (({"poolRef": {"name": "other"}}, "poolRef is immutable"),
                         ({"replicas": 4}, "replicas is immutable")):
        with pytest.raises(ApiError) as exc:
            kube.patch(SandboxBatch, "b", {"spec": change}, namespace=ns, patch_type=PatchType.MERGE)
        assert exc.value.status.code == 422 and what in exc.value.status.message


def test_replicas_are_bounded(kube, corral_crds, ns):
    assert "spec.replicas" in rejected(kube, ns, batch("big", replicas=1001))
    assert "spec.replicas" in rejected(kube, ns, batch("none", replicas=0))


def test_a_task_is_argv_or_command_and_the_index_env_is_corrals(kube, corral_crds, ns):
    assert "set exactly one of argv and command" in rejected(kube, ns, batch(task={"argv": ["a"], "command": "a"}))
    assert "set exactly one of argv and command" in rejected(kube, ns, batch(task={"workingDir": "/tmp"}))
    msg = rejected(kube, ns, batch(task={"command": "x", "env": [{"name": "CORRAL_BATCH_INDEX", "value": "1"}]}))
    assert "CORRAL_BATCH_INDEX is set by Corral" in msg
    msg = rejected(kube, ns, batch(task={"command": "x", "env": [{"name": "CORRAL_EXECD_TOKEN", "value": "t"}]}))
    assert "reserved for the sandbox's execd" in msg


def test_status_counts_are_written_through_the_status_subresource(kube, corral_crds, ns):
    kube.create(batch(replicas=2, task={"command": "exit 0"}), namespace=ns)
    status = {"phase": "Running", "replicas": 2, "bound": 2, "running": 1, "succeeded": 1, "failed": 0,
              "indexes": [{"index": 0, "sandbox": "s0", "phase": "Succeeded", "exitCode": 0},
                          {"index": 1, "sandbox": "s1", "phase": "Running", "commandId": "0123456789abcdef"}]}
    kube.patch(SandboxBatch.Status, "b", {"status": status}, namespace=ns, patch_type=PatchType.MERGE)
    got = kube.get(SandboxBatch, "b", namespace=ns).status
    assert got["succeeded"] == 1 and got["indexes"][1]["commandId"] == "0123456789abcdef"
    with pytest.raises(ApiError) as exc:
        kube.patch(SandboxBatch.Status, "b", {"status": {"phase": "Bound"}}, namespace=ns,
                   patch_type=PatchType.MERGE)
    assert exc.value.status.code == 422
