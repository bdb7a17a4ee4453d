"""WarmPool: keep exactly `replicas` ready, unclaimed sandboxes of a template."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .common import MAX_REPLICAS, Condition, CorralObject, LocalRef, Model, immutable


class UpdateStrategy(Model):
    type: Literal["OnReplenish", "Recreate"] = Field(
        default="OnReplenish",
        description=(
            "When the template changes: OnReplenish lets stale idle sandboxes be claimed and makes fresh ones as "
            "they go; Recreate deletes stale idle sandboxes at once (in slow-start batches)."
        ),
    )


class WarmPoolSpec(Model):
    replicas: int = Field(
        default=1, ge=0, le=MAX_REPLICAS, description=f"Ready, unclaimed sandboxes to keep (0..{MAX_REPLICAS})."
    )
    template_ref: LocalRef = Field(
        description="The SandboxTemplate to start sandboxes from. Immutable.",
        json_schema_extra=immutable("templateRef"),
    )
    update_strategy: UpdateStrategy = Field(default_factory=UpdateStrategy)
    readiness_grace_seconds: int = Field(
        default=300, ge=10, le=86400, description="A sandbox unready for longer than this is replaced."
    )


class WarmPoolStatus(Model):
    replicas: int = Field(default=0, description="Unclaimed sandboxes that exist (any state).")
    ready_replicas: int = Field(default=0, description="Unclaimed sandboxes that are ready.")
    updated_replicas: int = Field(default=0, description="Unclaimed sandboxes with the current blueprint.")
    selector: str | None = Field(
        default=None, description="Label selector of the pool's sandboxes (scale subresource)."
    )
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


class WarmPool(CorralObject):
    """A pool of ready sandboxes that claims adopt in milliseconds."""

    kind: Literal["WarmPool"] = "WarmPool"
    spec: WarmPoolSpec
    status: WarmPoolStatus | None = None
