"""SandboxBatch: N sandboxes from one pool and one task in each, followed to its end (OpenSandbox's BatchSandbox).

A batch binds its sandboxes the way claims do (warm first, cold for the rest, bounded by the pool), starts its task
in each through execd as a background command with the replica's index in `CORRAL_BATCH_INDEX`, and reports one
entry per index plus the counts. The rules that decide phases and outcomes live in `corral.operator.core.batches`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator

from .claim import EnvVar, PoolRef, ShutdownPolicy
from .common import MAX_ENV_VARS, MAX_REPLICAS, NO_NUL, Condition, CorralObject, Model, immutable
from .sandbox import LaunchType

# The env variable that carries a replica's index (0 .. replicas-1) into its task. A task's own env may not set it.
BATCH_INDEX_ENV = "CORRAL_BATCH_INDEX"
MAX_ARGV = 1024
MAX_COMMAND = 65536

TASK_RULES: list[JsonValue] = [
    {"rule": "has(self.argv) != has(self.command)", "message": "set exactly one of argv and command"},
    {"rule": f"!has(self.env) || !self.env.exists(e, e.name == '{BATCH_INDEX_ENV}')",
     "message": f"{BATCH_INDEX_ENV} is set by Corral (the replica's index)"},
]


class BatchTask(Model):
    """What each replica runs: `argv` (no shell) or `command` (a `/bin/sh -c` line), exactly one."""

    model_config = ConfigDict(**Model.model_config, json_schema_extra={"x-kubernetes-validations": TASK_RULES})

    argv: list[str] | None = Field(
        default=None, min_length=1, max_length=MAX_ARGV, description="Program and arguments, run without a shell.")
    command: str | None = Field(
        default=None, min_length=1, max_length=MAX_COMMAND, pattern=NO_NUL, description="Shell command line.")
    env: list[EnvVar] = Field(
        default_factory=list, max_length=MAX_ENV_VARS,
        description=f"Env of the task (beside the sandbox's). {BATCH_INDEX_ENV} is set by Corral to the index.",
    )
    working_dir: str | None = Field(
        default=None, max_length=4096, pattern=NO_NUL,
        description="Working directory (default: execd's workspace; relative paths are relative to it).")
    timeout_seconds: int | None = Field(
        default=None, ge=1, le=7 * 86400,
        description="The task's whole process tree is killed after this long; the index then fails (TaskTimeout).")

    @model_validator(mode="after")
    def _one_of(self) -> BatchTask:
        if (self.argv is None) == (self.command is None):
            raise ValueError("set exactly one of argv and command")
        return self

    @field_validator("env")
    @classmethod
    def _no_index(cls, env: list[EnvVar]) -> list[EnvVar]:
        if any(e.name == BATCH_INDEX_ENV for e in env):
            raise ValueError(f"{BATCH_INDEX_ENV} is set by Corral (the replica's index)")
        return env


class BatchLifecycle(Model):
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=30 * 86400, description="Delete the batch this long after it finished.")
    shutdown_policy: ShutdownPolicy = Field(
        default="Delete",
        description=(
            "What happens to a replica's sandbox when its task has ended: Delete it (in the background), "
            "DeleteForeground (the batch finishes once the sandboxes are gone) or Retain (keep it until the batch "
            "is deleted)."
        ),
    )


class SandboxBatchSpec(Model):
    pool_ref: PoolRef = Field(description="The pool to take sandboxes from. Immutable.",
                              json_schema_extra=immutable("poolRef"))
    replicas: int = Field(
        ge=1, le=MAX_REPLICAS, description=f"Sandboxes (and tasks) in the batch (1..{MAX_REPLICAS}). Immutable.",
        json_schema_extra=immutable("replicas"),
    )
    task: BatchTask | None = Field(
        default=None, description="The task each replica runs; without one the batch only binds its sandboxes.")
    lifecycle: BatchLifecycle = Field(default_factory=BatchLifecycle)


ReplicaPhase = Literal["Pending", "Bound", "Running", "Succeeded", "Failed"]
BatchPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Finished"]


class BatchReplicaStatus(Model):
    """One index of the batch: its sandbox and what became of its task."""

    index: int = Field(ge=0, description="The replica's index (its task's CORRAL_BATCH_INDEX).")
    sandbox: str | None = Field(default=None, description="The sandbox bound to this index.")
    launch_type: LaunchType | None = None
    phase: ReplicaPhase = "Pending"
    command_id: str | None = Field(default=None, description="execd's id of the task's background command.")
    exit_code: int | None = None
    reason: str | None = Field(default=None, description="Why the index failed (or how it ended).")
    message: str | None = None


class SandboxBatchStatus(Model):
    phase: BatchPhase | None = None
    replicas: int = Field(default=0, description="Indexes in the batch.")
    bound: int = Field(default=0, description="Indexes with a sandbox.")
    running: int = Field(default=0, description="Tasks running.")
    succeeded: int = Field(default=0, description="Tasks that exited 0.")
    failed: int = Field(default=0, description="Indexes that failed (non-zero exit, timeout, lost sandbox, ...).")
    indexes: list[BatchReplicaStatus] = Field(default_factory=list, max_length=MAX_REPLICAS,
                                              description="One entry per index.")
    start_time: datetime | None = None
    completion_time: datetime | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


class SandboxBatch(CorralObject):
    """N sandboxes from a pool and one task in each, followed to its end through execd."""

    kind: Literal["SandboxBatch"] = "SandboxBatch"
    spec: SandboxBatchSpec
    status: SandboxBatchStatus | None = None
