"""Wire models of the claims HTTP API (camelCase on the wire, like the resource model).

One module for both ends: the server (corral.operator.claimsapi) serves these and the SDK (corral.client) reads
them, so the SDK never imports the operator. Like the rest of corral.api it imports no other Corral package.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonDict, SkipJsonSchema

from .batch import BATCH_INDEX_ENV, MAX_ARGV, MAX_COMMAND
from .common import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    EXECD_ENV_PREFIX,
    MAX_ENV_NAME,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    MAX_REPLICAS,
    NO_NUL,
    env_var_problem,
)

Phase = Literal["Pending", "Ready", "Paused", "Expired", "Failed"]

# The claims API's own health endpoint (no token): the operator's, not a sandbox's execd (that one is
# corral.execd.wire.HEALTH_PATH, which happens to read the same).
API_HEALTH_PATH = "/v1/health"

# What the edge accepts. A claim or pool name is a Kubernetes object name (DNS subdomain, at most 253 characters):
# the same pattern checks the names in URL paths and queries.
NAME_MAX = 253
MAX_ENV_BYTES = 128 << 10  # one claim's env, names and values together: far below execve's limits
MAX_TTL_SECONDS = 30 * 86400
# An image reference as Docker parses it ([registry[:port]/]path[:tag][@digest]) or an image ID. ASCII only.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-fA-F:]+\])(?::[0-9]{{1,5}})?"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,128}"
IMAGE_REF = (rf"^(?:(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?"
             r"|(?:sha256:)?[0-9a-f]{12,64})$")


# The env rules of env_var_problem as JSON Schema, so the document says what the validator enforces.
ENV_NAME_SCHEMA: JsonDict = {"pattern": ENV_NAME, "maxLength": MAX_ENV_NAME, "not": {
    "pattern": "^" + "".join(f"[{c}{c.lower()}]" if c.isalpha() else c for c in EXECD_ENV_PREFIX)}}


def whole_number(v: object) -> object:
    """60.0 is the integer 60 in JSON (and JSON Schema); true, "60" and 60.5 stay what they are (strict refuses
    them)."""
    return int(v) if type(v) is float and v.is_integer() else v


def checked_env(env: dict[str, str]) -> dict[str, str]:
    """A request's env as the schema describes it (names, values, total size); the first problems as one error."""
    problems = [p for k, v in env.items() if (p := env_var_problem(k, v))]
    if problems:
        raise ValueError("; ".join(problems[:5]))
    size = sum(len(k.encode()) + len(v.encode()) for k, v in env.items())
    if size > MAX_ENV_BYTES:
        raise ValueError(f"env is {size} bytes; at most {MAX_ENV_BYTES}")
    return env


class _M(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Error(_M):
    code: str = Field(description="Machine-readable error code, e.g. not_found.")
    message: str = Field(description="What went wrong, for humans.")


class ClaimRequest(_M):
    name: str | None = Field(default=None, pattern=DNS_LABEL, max_length=63,
                             description="Claim name (default: generated). Creating an existing name returns it: "
                                         "a retry is safe.")
    pool: str = Field(min_length=1, max_length=NAME_MAX, pattern=DNS_SUBDOMAIN,
                      description="The WarmPool or Pool to claim from.")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_VARS,
                                description="Env for the sandbox's commands, if the template's envVarsInjectionPolicy "
                                "allows it (injected into a warm sandbox). Names as Kubernetes takes them (letters, "
                                "digits, '-', '.', '_', not starting with a digit; CORRAL_EXECD_* reserved), values "
                                f"without NUL; at most {MAX_ENV_VARS} variables and {MAX_ENV_BYTES} bytes in all.",
                                json_schema_extra={"propertyNames": ENV_NAME_SCHEMA, "additionalProperties": {
                                    "type": "string", "maxLength": MAX_ENV_VALUE, "pattern": NO_NUL}})
    ttl_seconds: int | None = Field(default=None, ge=1, le=MAX_TTL_SECONDS, strict=True,
                                    description="Lease: the claim expires (and its sandbox is released) this long "
                                                "after creation or the last renew. None: no expiry.")
    shutdown_policy: Literal["Delete", "Retain"] = Field(default="Delete", description="What happens to the sandbox "
                                                         "when the claim ends: Delete (or recycle into its Pool) or "
                                                         "Retain the container.")
    snapshot: str | None = Field(default=None, max_length=512, pattern=IMAGE_REF,
                                 description="Start a new sandbox from this snapshot image (always a cold start, with "
                                 "the pool's template for everything else).")
    timeout_seconds: float = Field(default=120, ge=0, le=3600, strict=True, allow_inf_nan=False,
                                   description="How long the create call waits for the sandbox to be ready; 0 answers "
                                   "at once (202 while Pending).")

    _ttl = field_validator("ttl_seconds", mode="before")(whole_number)

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        return checked_env(env)


class SandboxRef(_M):
    name: str
    endpoint: str = Field(description="Path of the execd proxy on this API.")


class Claim(_M):
    name: str
    pool: str
    pool_kind: Literal["WarmPool", "Pool"]
    phase: Phase
    launch_type: Literal["warm", "cold"] | None = None
    sandbox: SandboxRef | None = None
    created: datetime
    ready_at: datetime | None = None
    expires_at: datetime | None = None
    shutdown_policy: Literal["Delete", "Retain"] = "Delete"
    snapshot: str | None = None
    message: str | None = None


class ClaimList(_M):
    items: list[Claim]


class RenewRequest(_M):
    ttl_seconds: int = Field(ge=1, le=MAX_TTL_SECONDS, strict=True, description="New lease, counted from now "
                             "(an integer: true, \"60\" and 60.5 are refused).")

    _ttl = field_validator("ttl_seconds", mode="before")(whole_number)


class SnapshotRequest(_M):
    tag: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127}$",
                            description="Image tag (default: <claim>-<unix time>).")


class Snapshot(_M):
    claim: str | None = Field(description="The claim it was taken from.")
    image: str = Field(
        description="Local image reference; pass it as `snapshot` of a new claim or as a template image."
    )
    id: str
    created: datetime | None = Field(default=None, description="When it was taken.")
    size: int | None = Field(default=None, description="The image's size in bytes (its layers shared with the "
                                                       "template's image included).")


class SnapshotList(_M):
    items: list[Snapshot]


class RetainedSandbox(_M):
    """A sandbox kept after its claim ended (shutdownPolicy Retain): it belongs to no pool and no claim, and lives
    until it is deleted (DELETE /v1/retained/{name}). The claims API does not proxy to it."""

    name: str
    template: str
    pool: str | None = Field(default=None, description="The pool of the claim it was retained from.")
    claim: str | None = Field(default=None, description="The claim it was retained from.")
    retained_at: datetime | None = Field(default=None, description="When the claim ended.")
    created: datetime | None = Field(default=None, description="When the sandbox was created.")
    state: str = Field(description="Docker: the container's state (running, paused, exited, ..., or missing). "
                                   "Kubernetes: the Sandbox's phase (Running, Pending, ...).")
    ready: bool = Field(description="Its execd answers (Docker: its health endpoint, asked now; Kubernetes: the "
                                    "pod's readiness probe on it).")


class RetainedSandboxList(_M):
    items: list[RetainedSandbox]


class PoolStatus(_M):
    name: str
    kind: Literal["WarmPool", "Pool"]
    template: str
    desired: int = Field(description="Sandboxes the pool wants now: a WarmPool's replicas (idle), a Pool's "
                                     "allocated + bufferMin clamped to [poolMin, poolMax] (total).")
    ready: int = Field(description="Idle and ready: claimable warm right now.")
    idle: int = Field(description="Not bound to a claim: ready + still starting.")
    allocated: int = Field(description="Bound to a claim (or being released/recycled).")


class PoolList(_M):
    items: list[PoolStatus]


# --- batches: N sandboxes of a pool and one task in each (the SandboxBatch kind, api/batch.py) ------------------------
BATCH_NAME_MAX = 59       # a batch's sandboxes carry `<batch>_<index>` in a 63-character label (core.batches.MAX_NAME)
OUTPUT_TAIL_BYTES = 4096  # the tail of a task's output that results carry
BATCH_KEEPALIVE_SECONDS = 15.0  # the events stream repeats a progress line after this long without a line

BatchIndexPhase = Literal["Pending", "Bound", "Running", "Succeeded", "Failed"]
BatchPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Finished"]


class BatchTaskRequest(_M):
    """What every replica runs: `argv` (no shell) or `command` (a `/bin/sh -c` line), exactly one."""

    # exactly one of argv and command, in the document too (neither may be null: absent is how one is left out)
    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["argv"]}, {"required": ["command"]}]})

    argv: Annotated[list[Annotated[str, Field(max_length=MAX_ENV_VALUE, pattern=NO_NUL)]],
                    Field(min_length=1, max_length=MAX_ARGV)] | SkipJsonSchema[None] = Field(
        default=None, description="Program and arguments, run without a shell.")
    command: Annotated[str, Field(min_length=1, max_length=MAX_COMMAND, pattern=NO_NUL)] | SkipJsonSchema[None] = \
        Field(default=None, description="Shell command line (/bin/sh -c).")
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV_VARS,
                                description=f"Env of the task, beside the sandbox's; {BATCH_INDEX_ENV} is set to the "
                                "replica's index and may not be given. Names and values as a claim's env.",
                                json_schema_extra={"propertyNames": ENV_NAME_SCHEMA, "additionalProperties": {
                                    "type": "string", "maxLength": MAX_ENV_VALUE, "pattern": NO_NUL}})
    working_dir: str | None = Field(default=None, min_length=1, max_length=4096, pattern=NO_NUL,
                                    description="Working directory (default: execd's workspace).")
    timeout_seconds: int | None = Field(default=None, ge=1, le=7 * 86400, strict=True,
                                        description="The task's process tree is killed after this long; its index "
                                                    "then fails with reason TaskTimeout.")

    _timeout = field_validator("timeout_seconds", mode="before")(whole_number)

    @field_validator("argv", "command", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("leave it out instead of null")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        if BATCH_INDEX_ENV in env:
            raise ValueError(f"{BATCH_INDEX_ENV} is set by Corral (the replica's index)")
        return checked_env(env)

    @model_validator(mode="after")
    def _one_of(self) -> BatchTaskRequest:
        if (self.argv is None) == (self.command is None):
            raise ValueError("set exactly one of argv and command")
        return self


class BatchRequest(_M):
    name: str | None = Field(default=None, pattern=DNS_LABEL, max_length=BATCH_NAME_MAX,
                             description="Batch name (default: generated). Creating an existing name with the same "
                                         "pool returns it: a retry is safe.")
    pool: str = Field(min_length=1, max_length=NAME_MAX, pattern=DNS_SUBDOMAIN,
                      description="The WarmPool or Pool to take the sandboxes from (warm first, cold for the rest).")
    replicas: int = Field(ge=1, le=MAX_REPLICAS, strict=True,
                          description=f"Sandboxes, and tasks, in the batch (1..{MAX_REPLICAS}).")
    task: BatchTaskRequest
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0, le=MAX_TTL_SECONDS, strict=True,
                                                   description="Delete the batch this long after it finished "
                                                               "(None: when you DELETE it).")
    shutdown_policy: Literal["Delete", "Retain"] = Field(default="Delete", description="What happens to a replica's "
                                                         "sandbox once its task ended: Delete (or recycle into its "
                                                         "Pool) or Retain it until the batch is deleted.")

    _ints = field_validator("replicas", "ttl_seconds_after_finished", mode="before")(whole_number)


class BatchTaskResult(_M):
    """One index of a batch: its sandbox and what became of its task."""

    index: int = Field(description=f"The replica's index (its task's {BATCH_INDEX_ENV}).")
    sandbox: str | None = Field(default=None, description="The sandbox bound to this index.")
    launch_type: Literal["warm", "cold"] | None = None
    phase: BatchIndexPhase
    exit_code: int | None = Field(default=None, description="The task's exit code, once it ended.")
    reason: str | None = Field(default=None, description="How the index ended (Completed, NonZeroExit, TaskTimeout, "
                                                         "SandboxLost, ...) or why it waits.")
    message: str | None = None
    output: str | None = Field(default=None, description=f"Once the task ended: the last {OUTPUT_TAIL_BYTES} bytes "
                               "of its output (stdout and stderr as they were written, UTF-8, undecodable bytes "
                               "replaced). None while it runs, when output is not asked for, or when the sandbox "
                               "could not tell (gone, execd restarted).")
    output_truncated: bool = Field(default=False, description="The task wrote more than `output` holds.")

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def ok(self) -> bool:
        return self.phase == "Succeeded"


class Batch(_M):
    name: str
    pool: str
    pool_kind: Literal["WarmPool", "Pool"]
    phase: BatchPhase = Field(description="Pending until an index is bound; Running while a task has not ended; "
                                          "Succeeded when every task exited 0; Failed when every index ended and "
                                          "any failed.")
    replicas: int
    bound: int = Field(description="Indexes with a sandbox.")
    running: int = Field(description="Tasks running.")
    succeeded: int = Field(description="Tasks that exited 0.")
    failed: int = Field(description="Indexes that failed (non-zero exit, timeout, lost sandbox, ...).")
    created: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    shutdown_policy: Literal["Delete", "Retain"] = "Delete"
    message: str | None = Field(default=None, description="Why the batch waits or failed (e.g. its pool is missing).")
    results: list[BatchTaskResult] = Field(default_factory=list, description="One entry per index, by index.")

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed", "Finished")


class BatchList(_M):
    items: list[Batch] = Field(description="Batches, oldest first; their results carry no output.")


class BatchEvent(_M):
    """One line of `GET /v1/batches/{name}/events` (NDJSON: one JSON object per line).

    The stream starts with a `progress` line, then carries one `task` line per index whose task has ended (those
    that ended before the stream opened first, each index once), a `progress` line whenever the counts change (and
    every BATCH_KEEPALIVE_SECONDS without another line), and ends after the `end` line, sent once the batch is
    finished and every `task` line was sent. `error` (e.g. the batch was deleted) also ends it. Every line carries
    the batch's phase and counts. A client that reconnects gets every ended index again: dedupe by index."""

    type: Literal["progress", "task", "end", "error"]
    batch: str
    phase: BatchPhase
    replicas: int
    bound: int
    running: int
    succeeded: int
    failed: int
    task: BatchTaskResult | None = Field(default=None, description="The ended index (type `task`).")
    error: Error | None = Field(default=None, description="What ended the stream (type `error`).")
