"""unit: the SandboxBatch model and its CRD: task is argv xor command, the index env is Corral's, replicas bounded
and immutable like the other refs, printer columns with the counts."""

import pytest

from corral.api import BY_KIND, CorralValidationError, SandboxBatch, SandboxBatchSpec, parse, validate
from corral.api.batch import BATCH_INDEX_ENV
from corral.api.crd import crd_for


def batch(**spec):
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "SandboxBatch", "metadata": {"name": "b"},
            "spec": {"poolRef": {"name": "wp"}, "replicas": 3, **spec}}


def test_a_batch_parses_with_defaults():
    obj = parse(batch(task={"argv": ["python", "-c", "print(1)"], "timeoutSeconds": 30}))
    assert isinstance(obj, SandboxBatch)
    assert obj.spec.pool_ref.kind == "WarmPool" and obj.spec.replicas == 3
    assert obj.spec.task is not None and obj.spec.task.timeout_seconds == 30
    assert obj.spec.lifecycle.shutdown_policy == "Delete" and obj.spec.lifecycle.ttl_seconds_after_finished is None
    assert parse(batch()).spec.task is None  # no task: the batch only binds


@pytest.mark.parametrize("task, field", [
    ({}, "task"),
    ({"argv": ["a"], "command": "a"}, "task"),
    ({"argv": []}, "task.argv"),
    ({"command": "x", "env": [{"name": BATCH_INDEX_ENV, "value": "7"}]}, "task.env"),
    ({"command": "x", "env": [{"name": "CORRAL_EXECD_TOKEN", "value": "t"}]}, "task.env.0.name"),
    ({"command": "x", "timeoutSeconds": 0}, "task.timeoutSeconds"),
    ({"command": "x", "workingDir": "a\x00b"}, "task.workingDir"),
])
def test_bad_tasks_name_the_field(task, field):
    with pytest.raises(CorralValidationError) as exc:
        validate(SandboxBatchSpec, {"poolRef": {"name": "wp"}, "replicas": 1, "task": task})
    assert any(path.startswith(field) for path, _ in exc.value.errors), exc.value.errors


@pytest.mark.parametrize("replicas", [0, 1001, -1])
def test_replicas_are_bounded_like_a_warmpools(replicas):
    with pytest.raises(CorralValidationError) as exc:
        validate(SandboxBatchSpec, {"poolRef": {"name": "wp"}, "replicas": replicas})
    assert exc.value.errors[0][0] == "replicas"


def test_crd_names_columns_and_rules():
    crd = crd_for(BY_KIND["SandboxBatch"])
    assert crd["metadata"]["name"] == "sandboxbatches.corral.dev"
    assert crd["spec"]["names"]["shortNames"] == ["sbxb"]
    version = crd["spec"]["versions"][0]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Pool", "Phase", "Replicas", "Bound", "Running", "Succeeded", "Failed", "Age"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["poolRef"]["x-kubernetes-validations"] == [{"rule": "self == oldSelf",
                                                            "message": "poolRef is immutable"}]
    assert spec["replicas"]["minimum"] == 1 and spec["replicas"]["maximum"] == 1000
    task_rules = [r["rule"] for r in spec["task"]["x-kubernetes-validations"]]
    assert task_rules[0] == "has(self.argv) != has(self.command)" and BATCH_INDEX_ENV in task_rules[1]
    assert "default" not in spec["task"]  # absent means "no task", never an empty one
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"phase", "bound", "running", "succeeded", "failed", "indexes"} <= set(status)
    assert status["phase"]["enum"] == ["Pending", "Running", "Succeeded", "Failed", "Finished"]
    assert set(status["indexes"]["items"]["properties"]) >= {"index", "sandbox", "phase", "exitCode", "reason",
                                                             "commandId"}
