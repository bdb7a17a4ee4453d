"""Wire models of the claims API (camelCase on the wire, like the resource model)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
Phase = Literal["Pending", "Ready", "Paused", "Expired", "Failed"]


class _M(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Error(_M):
    code: str = Field(description="Machine-readable error code, e.g. not_found.")
    message: str = Field(description="What went wrong, for humans.")


class ClaimRequest(_M):
    name: str | None = Field(default=None, pattern=DNS_LABEL, max_length=63,
                             description="Claim name (default: generated). Creating an existing name returns it: "
                                         "a retry is safe.")
    pool: str = Field(description="The WarmPool or Pool to claim from.")
    env: dict[str, str] = Field(default_factory=dict, description="Env for the sandbox's commands, if the "
                                "template's envVarsInjectionPolicy allows it (injected into a warm sandbox).")
    ttl_seconds: int | None = Field(default=None, ge=1, le=30 * 86400,
                                    description="Lease: the claim expires (and its sandbox is released) this long "
                                                "after creation or the last renew. None: no expiry.")
    shutdown_policy: Literal["Delete", "Retain"] = Field(default="Delete", description="What happens to the sandbox "
                                                         "when the claim ends: Delete (or recycle into its Pool) or "
                                                         "Retain the container.")
    snapshot: str | None = Field(default=None, description="Start a new sandbox from this snapshot image (always "
                                 "a cold start, with the pool's template for everything else).")
    timeout_seconds: float = Field(default=120, ge=0, le=3600, description="How long the create call waits for the "
                                   "sandbox to be ready; 0 answers at once (202 while Pending).")


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
    ttl_seconds: int = Field(ge=1, le=30 * 86400, description="New lease, counted from now.")


class SnapshotRequest(_M):
    tag: str | None = Field(default=None, pattern=r"^[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127}$",
                            description="Image tag (default: <claim>-<unix time>).")


class Snapshot(_M):
    claim: str
    image: str = Field(description="Local image reference; pass it as `snapshot` of a new claim or as a template image.")
    id: str


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
