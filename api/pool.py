"""Pool: elastic capacity with reuse (OpenSandbox's Pool semantics)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, JsonValue, model_validator

from .common import MAX_REPLICAS, Condition, CorralObject, LocalRef, Model, immutable

CAPACITY_RULES: list[JsonValue] = [
    {"rule": "self.bufferMin <= self.bufferMax", "message": "bufferMin must be <= bufferMax"},
    {"rule": "self.poolMin <= self.poolMax", "message": "poolMin must be <= poolMax"},
]


class Capacity(Model):
    """Idle buffer kept in [bufferMin, bufferMax]; total (incl. pending and terminating) in [poolMin, poolMax]."""

    model_config = ConfigDict(**Model.model_config, json_schema_extra={"x-kubernetes-validations": CAPACITY_RULES})

    buffer_min: int = Field(default=0, ge=0, le=MAX_REPLICAS, description="Fewest idle sandboxes to keep.")
    buffer_max: int = Field(default=1, ge=0, le=MAX_REPLICAS, description="Most idle sandboxes to keep.")
    pool_min: int = Field(default=0, ge=0, le=MAX_REPLICAS, description="Fewest sandboxes in total.")
    pool_max: int = Field(default=10, ge=0, le=MAX_REPLICAS, description="Most sandboxes in total.")

    @model_validator(mode="after")
    def _ordered(self) -> Capacity:
        if self.buffer_min > self.buffer_max:
            raise ValueError(f"bufferMin ({self.buffer_min}) must be <= bufferMax ({self.buffer_max})")
        if self.pool_min > self.pool_max:
            raise ValueError(f"poolMin ({self.pool_min}) must be <= poolMax ({self.pool_max})")
        return self


class PoolSpec(Model):
    template_ref: LocalRef = Field(
        description="The SandboxTemplate to start sandboxes from. Immutable.",
        json_schema_extra=immutable("templateRef"),
    )
    capacity: Capacity = Field(default_factory=Capacity)
    recycle_strategy: Literal["Delete", "Restart", "Noop"] = Field(
        default="Delete",
        description="On release: Delete the sandbox, Restart its pod fresh, or Noop (return it to the pool as is).",
    )
    max_unavailable: int = Field(
        default=1, ge=1, le=MAX_REPLICAS, description="Most sandboxes deleted at once on scale-down."
    )
    readiness_grace_seconds: int = Field(
        default=300, ge=10, le=86400,
        description="An idle sandbox unready for longer than this (since it was made, or since it turned unready) "
                    "is replaced.",
    )


class PoolStatus(Model):
    total: int = 0
    allocated: int = 0
    available: int = 0
    updated: int = 0
    revision: str | None = Field(default=None, description="Blueprint hash the pool is converging to.")
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


class Pool(CorralObject):
    """Elastic sandbox capacity with an idle buffer and recycling on release."""

    kind: Literal["Pool"] = "Pool"
    spec: PoolSpec
    status: PoolStatus | None = None
