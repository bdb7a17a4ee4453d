"""unit: the batch rules of the domain core (corral.operator.core.batches)."""

import pytest

from corral.api import SandboxBatchSpec, validate
from corral.operator.core import batches as b


def task(**fields):
    return validate(SandboxBatchSpec, {"poolRef": {"name": "wp"}, "replicas": 2, "task": fields}).task


def test_task_request_carries_the_index_env_and_the_limits():
    body = b.task_request(task(argv=["python", "-c", "x"], env=[{"name": "A", "value": "1"}], workingDir="w",
                               timeoutSeconds=5), 7)
    assert body == {"background": True, "env": {"A": "1", "CORRAL_BATCH_INDEX": "7"},
                    "argv": ["python", "-c", "x"], "cwd": "w", "timeout": 5}
    shell = b.task_request(task(command="echo $CORRAL_BATCH_INDEX"), 0)
    assert shell == {"background": True, "env": {"CORRAL_BATCH_INDEX": "0"}, "command": "echo $CORRAL_BATCH_INDEX"}


@pytest.mark.parametrize("kwargs, phase, reason", [
    ({"exit_code": 0}, "Succeeded", "Completed"),
    ({"exit_code": 3}, "Failed", "NonZeroExit"),
    ({"exit_code": None, "signal": "SIGKILL"}, "Failed", "NonZeroExit"),
    ({"exit_code": None, "signal": "SIGKILL", "timed_out": True}, "Failed", "TaskTimeout"),
    ({"exit_code": 0, "interrupted": True}, "Failed", "TaskInterrupted"),
])
def test_task_outcome(kwargs, phase, reason):
    exit_code = kwargs.pop("exit_code")
    outcome = b.task_outcome(exit_code, **kwargs)
    assert (outcome.phase, outcome.reason, outcome.exit_code) == (phase, reason, exit_code)


def test_an_exit_code_names_itself_and_a_signal_too():
    assert "exit code 3" in b.task_outcome(3).message
    assert "signal SIGTERM" in b.task_outcome(None, signal="SIGTERM").message


def entries(*phases):
    return [{"index": i, "phase": p, **({"sandbox": f"s{i}"} if p != "Pending" else {})}
            for i, p in enumerate(phases)]


def test_counts():
    c = b.count(entries("Pending", "Bound", "Running", "Succeeded", "Failed", "Running"))
    assert c == b.Counts(bound=5, running=2, succeeded=1, failed=1) and c.ended == 2
    lost_before_bind = [{"index": 0, "phase": "Failed", "reason": "StartFailed"}]
    assert b.count(lost_before_bind) == b.Counts(failed=1)


@pytest.mark.parametrize("phases, has_task, phase", [
    (("Pending", "Pending"), True, "Pending"),
    (("Bound", "Pending"), True, "Running"),
    (("Running", "Succeeded"), True, "Running"),
    (("Succeeded", "Succeeded"), True, "Succeeded"),
    (("Succeeded", "Failed"), True, "Failed"),
    (("Pending", "Pending"), False, "Pending"),
    (("Bound", "Pending"), False, "Pending"),
    (("Bound", "Bound"), False, "Finished"),
    (("Bound", "Failed"), False, "Failed"),
])
def test_batch_phase(phases, has_task, phase):
    assert b.batch_phase(len(phases), has_task, b.count(entries(*phases))) == phase
    assert phase in b.BATCH_PHASES


def test_claim_labels_never_name_a_claim_and_round_trip():
    assert b.claim_label("job", 12) == "job_12"
    assert b.parse_claim_label("job_12") == ("job", 12)
    assert b.parse_claim_label("my-claim") is None and b.parse_claim_label(None) is None
    assert b.parse_claim_label("a_b_3") == ("a_b", 3)  # only the last separator counts
    assert b.parse_claim_label("job_x") is None
    longest = "x" * b.MAX_NAME
    assert len(b.claim_label(longest, 999)) == 63 and b.name_problem(longest) is None
    assert "at most" in (b.name_problem(longest + "x") or "")


def test_empty_indexes():
    assert b.empty_indexes(3) == [{"index": 0, "phase": "Pending"}, {"index": 1, "phase": "Pending"},
                                  {"index": 2, "phase": "Pending"}]


def test_claim_ref_names_the_batch_for_a_batch_sandbox():
    assert b.claim_ref("job_3") == {"name": "job"}
    assert b.claim_ref("my-claim") == {"name": "my-claim"}
    assert b.claim_ref(None) is None
