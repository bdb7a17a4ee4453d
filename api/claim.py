"""SandboxClaim: "give me a sandbox" from a WarmPool or a Pool."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, field_validator

from .common import (
    ENV_NAME,
    EXECD_ENV_PREFIX,
    MAX_ENV_NAME,
    MAX_ENV_VALUE,
    MAX_ENV_VARS,
    NO_NUL,
    RESERVED_DOMAINS,
    Condition,
    CorralObject,
    Model,
    Name,
    immutable,
)
from .sandbox import LaunchType
from .template import VolumeClaimTemplate

ShutdownPolicy = Literal["Delete", "DeleteForeground", "Retain"]


class PoolRef(Model):
    kind: Literal["WarmPool", "Pool"] = Field(default="WarmPool", description="WarmPool or Pool.")
    name: Name = Field(description="Name of the pool (same namespace).")


class Lifecycle(Model):
    shutdown_time: datetime | None = Field(default=None, description="When the sandbox is shut down (RFC 3339).")
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=30 * 86400, description="Delete the claim this long after it finished."
    )
    shutdown_policy: ShutdownPolicy = Field(
        default="Delete",
        description=(
            "At shutdownTime: Delete (the sandbox, in the background), DeleteForeground (wait until the sandbox "
            "is gone before the claim finishes) or Retain (keep the sandbox, release the claim)."
        ),
    )


class EnvVar(Model):
    name: str = Field(pattern=ENV_NAME, max_length=MAX_ENV_NAME, json_schema_extra={"x-kubernetes-validations": [
        {"rule": f"!self.matches('^(?i:{EXECD_ENV_PREFIX})')",
         "message": f"names starting with {EXECD_ENV_PREFIX} are reserved for the sandbox's execd"}]})
    value: str = Field(default="", max_length=MAX_ENV_VALUE, pattern=NO_NUL, description="No NUL character.")

    @field_validator("name")
    @classmethod
    def _not_execd(cls, name: str) -> str:
        if name.upper().startswith(EXECD_ENV_PREFIX):
            raise ValueError(f"names starting with {EXECD_ENV_PREFIX} are reserved for the sandbox's execd")
        return name


class PodMetadata(Model):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels", "annotations")
    @classmethod
    def _no_reserved(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            domain = key.split("/", 1)[0] if "/" in key else ""
            if any(domain == d or domain.endswith("." + d) for d in RESERVED_DOMAINS):
                raise ValueError(f"key {key!r} is in a reserved domain ({', '.join(RESERVED_DOMAINS)})")
        return value


class SandboxClaimSpec(Model):
    pool_ref: PoolRef = Field(description="The pool to claim from. Immutable.", json_schema_extra=immutable("poolRef"))
    lifecycle: Lifecycle = Field(default_factory=Lifecycle)
    env: list[EnvVar] = Field(
        default_factory=list, max_length=MAX_ENV_VARS,
        description="Env for the sandbox; needs the template's policy to allow it.",
    )
    volume_claim_templates: list[VolumeClaimTemplate] = Field(
        default_factory=list, max_length=16, description="Extra PVCs; forces a cold start; needs the template's policy."
    )
    additional_pod_metadata: PodMetadata = Field(
        default_factory=PodMetadata, description="Labels/annotations for the pod (reserved domains refused)."
    )
    timeout_seconds: int = Field(
        default=300, ge=1, le=3600, description="The claim becomes Failed if it is not Bound within this time."
    )


class ClaimedSandbox(Model):
    name: str
    pod_ips: list[str] = Field(default_factory=list, alias="podIPs")
    endpoint: str | None = None


class SandboxClaimStatus(Model):
    phase: Literal["Pending", "Bound", "Failed", "Finished"] | None = None
    sandbox: ClaimedSandbox | None = None
    launch_type: LaunchType | None = None
    bound_time: datetime | None = None
    finished_time: datetime | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


class SandboxClaim(CorralObject):
    """A request for one sandbox, served warm from a pool when one is ready, else cold."""

    kind: Literal["SandboxClaim"] = "SandboxClaim"
    spec: SandboxClaimSpec
    status: SandboxClaimStatus | None = None
