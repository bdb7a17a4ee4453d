"""SandboxTemplate: the blueprint of a sandbox plus the policy for what claims may change."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from .common import DNS_LABEL, PRESERVE_UNKNOWN, Condition, CorralObject, Model, TemplateMetadata

EXECD_DEFAULT_PORT = 44772  # corral.execd.wire.PORT (corral.api imports no other Corral package; a unit test)

Policy = Literal["Disallowed", "Allowed", "Overrides"]


class PodTemplate(Model):
    """A pod template: metadata plus a Kubernetes PodSpec (kept as given; Kubernetes validates it)."""

    metadata: TemplateMetadata = Field(
        default_factory=TemplateMetadata, description="Labels and annotations of the pod."
    )
    spec: dict[str, Any] = Field(
        description="A Kubernetes PodSpec. Corral adds execd, the secure defaults and its labels on top.",
        json_schema_extra=PRESERVE_UNKNOWN,
    )

    @field_validator("spec")
    @classmethod
    def _has_containers(cls, spec: dict[str, Any]) -> dict[str, Any]:
        containers = spec.get("containers")
        if not isinstance(containers, list) or not containers:
            raise ValueError("a pod spec needs at least one container in spec.containers")
        for i, c in enumerate(containers):
            if not isinstance(c, dict) or not c.get("name") or not c.get("image"):
                raise ValueError(f"containers[{i}] needs a name and an image")
        return spec


class VolumeClaimTemplate(Model):
    """A PersistentVolumeClaim created per sandbox and mounted by name."""

    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    name: str = Field(
        pattern=DNS_LABEL, max_length=63, description="Volume name; pod containers mount it by this name."
    )
    spec: dict[str, Any] = Field(
        description="A Kubernetes PersistentVolumeClaimSpec.", json_schema_extra=PRESERVE_UNKNOWN
    )


class ServicePort(Model):
    name: str = Field(pattern=DNS_LABEL, max_length=15, description="Port name.")
    port: int = Field(ge=1, le=65535, description="Port the Service exposes.")
    target_port: int | None = Field(default=None, ge=1, le=65535, description="Container port (default: port).")
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"


class ServiceSpec(Model):
    """An optional per-sandbox Service (headless by default) for clients that address sandboxes by DNS."""

    ports: list[ServicePort] = Field(min_length=1, description="Ports the Service exposes.")
    headless: bool = Field(default=True, description="clusterIP: None (no virtual IP).")


class Resources(Model):
    requests: dict[str, str] = Field(default_factory=dict, description="e.g. {cpu: 10m, memory: 32Mi}")
    limits: dict[str, str] = Field(default_factory=dict, description="e.g. {memory: 256Mi}")


class ExecdSpec(Model):
    """How execd, the in-sandbox daemon, is injected and exposed."""

    port: int = Field(default=EXECD_DEFAULT_PORT, ge=1024, le=65535, description="Port execd listens on in the pod.")
    image: str | None = Field(default=None, description="Image carrying the execd bundle (default: the operator's).")
    resources: Resources = Field(
        default=Resources(requests={"cpu": "10m", "memory": "32Mi"}, limits={"memory": "128Mi"}),
        description="Resources of the execd init container.",
    )


class NetworkPolicySpec(Model):
    """Custom ingress/egress rules (Kubernetes NetworkPolicy rule lists). Corral forces the pod selector."""

    ingress: list[dict[str, Any]] = Field(default_factory=list, json_schema_extra={"items": PRESERVE_UNKNOWN})
    egress: list[dict[str, Any]] = Field(default_factory=list, json_schema_extra={"items": PRESERVE_UNKNOWN})


class SandboxBlueprint(Model):
    """What a sandbox is made of. Its hash (status.blueprintHash) decides whether a sandbox is stale."""

    pod_template: PodTemplate = Field(description="The sandbox pod.")
    volume_claim_templates: list[VolumeClaimTemplate] = Field(
        default_factory=list, max_length=16, description="PVCs created per sandbox; a sandbox with volumes starts cold."
    )
    service: ServiceSpec | None = Field(default=None, description="Optional per-sandbox Service.")
    execd: ExecdSpec = Field(default_factory=ExecdSpec, description="execd injection settings.")


class SandboxTemplateSpec(SandboxBlueprint):
    network_policy_management: Literal["Managed", "Unmanaged"] = Field(
        default="Managed",
        description=(
            "Managed: Corral keeps one NetworkPolicy per template (the secure default, or networkPolicy if given). "
            "Unmanaged: Corral creates none and removes only the one it created."
        ),
    )
    network_policy: NetworkPolicySpec | None = Field(
        default=None, description="Custom rules used instead of the secure default (Managed only)."
    )
    dns: Literal["Allowed", "Disallowed"] = Field(
        default="Allowed",
        description=(
            "Allowed: the default policy lets sandboxes reach the cluster DNS (kube-system, port 53), which the "
            "private-range egress exclusion would otherwise block. Disallowed: no DNS; only literal public IPs."
        ),
    )
    env_vars_injection_policy: Policy = Field(
        default="Disallowed",
        description="Whether a claim's env may be applied: Disallowed, Allowed (add new names), "
        "Overrides (also replace).",
    )
    volume_claim_templates_policy: Policy = Field(
        default="Disallowed",
        description="Whether a claim may add (Allowed) or replace (Overrides) volume claim templates.",
    )


class SandboxTemplateStatus(Model):
    blueprint_hash: str | None = Field(
        default=None, description="Hash of the blueprint; sandboxes with another are stale."
    )
    observed_generation: int | None = None
    network_policy: str | None = Field(default=None, description="Name of the NetworkPolicy Corral manages, if any.")
    conditions: list[Condition] = Field(default_factory=list)


class SandboxTemplate(CorralObject):
    """A blueprint and policy that warm pools, pools and claims start sandboxes from."""

    kind: Literal["SandboxTemplate"] = "SandboxTemplate"
    spec: SandboxTemplateSpec
    status: SandboxTemplateStatus | None = None
