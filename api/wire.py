"""Wire models of the claims HTTP API (camelCase on the wire, like the resource model).

One module for both ends: the server (corral.operator.claimsapi) serves these and the SDK (corral.client) reads
them, so the SDK never imports the operator. Like the rest of corral.api it imports no other Corral package.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonDict

from .common import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    ENV_NAME,
    EXECD_ENV_PREFIX,
    MAX_ENV_NAME,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
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
        problems = [p for k, v in env.items() if (p := env_var_problem(k, v))]
        if problems:
            raise ValueError("; ".join(problems[:5]))
        size = sum(len(k.encode()) + len(v.encode()) for k, v in env.items())
        if size > MAX_ENV_BYTES:
            raise ValueError(f"env is {size} bytes; at most {MAX_ENV_BYTES}")
        return env


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
