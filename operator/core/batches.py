"""Batch rules, the same in both runtimes: what each replica runs, how a task's end is judged, what a batch's phase
and counts are, and how a batch's sandboxes are marked as taken.

A batch is N claims in one object: its sandboxes are bound warm first then cold (the claims' adoption order and
adoption write, `corral.operator.planning`), each index's task runs as one background command in execd with the
index in `CORRAL_BATCH_INDEX`, and its end is judged by `task_outcome`.

Phases of an index: Pending (no sandbox yet) -> Bound (sandbox, task not started; the final state of an index of a
batch without a task) -> Running -> Succeeded | Failed. Failed can also come straight from Pending or Bound (the task
could not be started, the sandbox was lost).

Phases of the batch (`batch_phase`): Pending until an index is bound; Running while any task has not ended;
Succeeded when every task exited 0, Failed when every index ended and any failed; a batch without a task is Finished
once every index is bound (Failed if an index could not be).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from corral.api.batch import BATCH_INDEX_ENV, BatchTask

from .vocabulary import FAILED, FINISHED, PENDING

# --- phases -----------------------------------------------------------------------------------------------------------
BOUND: Final = "Bound"          # an index with a sandbox and no task running (yet)
RUNNING: Final = "Running"
SUCCEEDED: Final = "Succeeded"
INDEX_PHASES: Final = (PENDING, BOUND, RUNNING, SUCCEEDED, FAILED)
INDEX_ENDED: Final = (SUCCEEDED, FAILED)
BATCH_PHASES: Final = (PENDING, RUNNING, SUCCEEDED, FAILED, FINISHED)
FINAL_BATCH_PHASES: Final = (SUCCEEDED, FAILED, FINISHED)

# --- reasons an index ends (status `reason`, the task outcome metric label) -------------------------------------------
R_COMPLETED: Final = "Completed"            # exit code 0
R_EXIT_CODE: Final = "NonZeroExit"          # the task exited non-zero (or was killed by a signal)
R_TASK_TIMEOUT: Final = "TaskTimeout"       # timeoutSeconds passed: execd killed its process tree
R_TASK_INTERRUPTED: Final = "TaskInterrupted"  # someone interrupted the command through execd
R_TASK_LOST: Final = "TaskLost"             # execd no longer knows the command (its execd restarted)
R_EXECD_UNREACHABLE: Final = "ExecdUnreachable"  # the sandbox's execd did not answer for the follower's patience
# SandboxLost, StartFailed and the waiting reasons (PoolNotFound, ...) are the claims' (vocabulary.REASONS).

# A batch's sandboxes carry the claim label `<batch>_<index>`: taken like a claim's in every pool rule, and never
# a claim's name ('_' is not allowed in object names), so a claim and a batch of the same name never mix.
SEPARATOR: Final = "_"
MAX_NAME: Final = 63 - 1 - 3  # a label value is at most 63 characters; indexes have at most 3 digits (MAX_REPLICAS)


def claim_label(batch: str, index: int) -> str:
    """The claim label of the sandbox of index `index` of batch `batch`."""
    return f"{batch}{SEPARATOR}{index}"


def parse_claim_label(value: str | None) -> tuple[str, int] | None:
    """(batch, index) of a batch sandbox's claim label; None for a claim's (or no) label."""
    if not value or SEPARATOR not in value:
        return None
    batch, _, index = value.rpartition(SEPARATOR)
    return (batch, int(index)) if batch and index.isdigit() else None


def claim_ref(label: str | None) -> dict[str, str] | None:
    """A sandbox status's claimRef from its claim label: the claim, or the SandboxBatch that holds it."""
    if not label:
        return None
    batch = parse_claim_label(label)
    return {"name": batch[0] if batch else label}


def name_problem(name: str) -> str | None:
    """Why a batch's name cannot be used (its sandboxes' labels carry it), or None."""
    if len(name) > MAX_NAME:
        return f"a SandboxBatch name is at most {MAX_NAME} characters (it is part of its sandboxes' labels)"
    return None


def task_request(task: BatchTask, index: int) -> dict[str, Any]:
    """The body of execd's POST /v1/command that starts index `index`'s task in the background."""
    body: dict[str, Any] = {"background": True,
                            "env": {**{e.name: e.value for e in task.env}, BATCH_INDEX_ENV: str(index)}}
    if task.argv is not None:
        body["argv"] = list(task.argv)
    else:
        body["command"] = task.command
    if task.working_dir:
        body["cwd"] = task.working_dir
    if task.timeout_seconds:
        body["timeout"] = task.timeout_seconds
    return body


@dataclass(frozen=True)
class Outcome:
    phase: str      # SUCCEEDED or FAILED
    reason: str
    message: str
    exit_code: int | None


def task_outcome(exit_code: int | None, *, signal: str | None = None, timed_out: bool = False,
                 interrupted: bool = False) -> Outcome:
    """How an index ended, from execd's final status of its command."""
    if timed_out:
        return Outcome(FAILED, R_TASK_TIMEOUT, "the task ran past timeoutSeconds and was killed", exit_code)
    if interrupted:
        return Outcome(FAILED, R_TASK_INTERRUPTED, "the task was interrupted through execd", exit_code)
    if exit_code == 0:
        return Outcome(SUCCEEDED, R_COMPLETED, "the task exited 0", 0)
    what = f"signal {signal}" if signal else f"exit code {exit_code}"
    return Outcome(FAILED, R_EXIT_CODE, f"the task ended with {what}", exit_code)


@dataclass(frozen=True)
class Counts:
    bound: int = 0       # indexes that have (or had, until their task ended) a sandbox
    running: int = 0
    succeeded: int = 0
    failed: int = 0

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed


def count(indexes: Iterable[Mapping[str, Any]]) -> Counts:
    """The counts of a batch's status from its per-index entries (wire form: `phase`, `sandbox`)."""
    bound = running = succeeded = failed = 0
    for entry in indexes:
        phase = entry.get("phase") or PENDING
        bound += bool(entry.get("sandbox"))
        running += phase == RUNNING
        succeeded += phase == SUCCEEDED
        failed += phase == FAILED
    return Counts(bound, running, succeeded, failed)


def batch_phase(replicas: int, has_task: bool, counts: Counts) -> str:
    """The batch's phase from its counts (see the module docstring)."""
    if has_task:
        if counts.ended >= replicas:
            return FAILED if counts.failed else SUCCEEDED
        return RUNNING if counts.bound or counts.ended else PENDING
    if counts.bound + counts.failed >= replicas and counts.failed:
        return FAILED
    return FINISHED if counts.bound >= replicas else PENDING


def empty_indexes(replicas: int) -> list[dict[str, Any]]:
    """The per-index entries of a batch nothing has happened to yet."""
    return [{"index": i, "phase": PENDING} for i in range(replicas)]
