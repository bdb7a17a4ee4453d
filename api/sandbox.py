"""Sandbox: one isolated pod (+ PVCs, + optional Service) with execd."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from .common import Condition, CorralObject, LocalRef, Model
from .template import SandboxBlueprint

LaunchType = Literal["Warm", "Cold"]
SandboxPhase = Literal["Pending", "Running", "Suspended", "Succeeded", "Failed", "Terminating"]


class SandboxSpec(SandboxBlueprint):
    template_ref: LocalRef | None = Field(default=None, description="The template this sandbox was made from, if any.")
    shutdown_time: datetime | None = Field(default=None, description="When the sandbox is shut down (RFC 3339).")
    operating_mode: Literal["Running", "Suspended"] = Field(
        default="Running", description="Suspended deletes the pod and keeps the PVCs; Running brings it back."
    )


class SandboxStatus(Model):
    phase: SandboxPhase | None = None
    pod_ips: list[str] = Field(default_factory=list, alias="podIPs", description="The pod's IPs.")
    endpoint: str | None = Field(default=None, description="host:port of execd.")
    node_name: str | None = Field(default=None, description="The node the pod runs on.")
    launch_type: LaunchType | None = Field(default=None, description="Warm (adopted from a pool) or Cold.")
    blueprint_hash: str | None = None
    claim_ref: LocalRef | None = Field(default=None, description="The claim this sandbox is bound to.")
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


class Sandbox(CorralObject):
    """One isolated sandbox pod with execd injected."""

    kind: Literal["Sandbox"] = "Sandbox"
    spec: SandboxSpec
    status: SandboxStatus | None = None
