"""SandboxTemplate, WarmPool and Pool as Pulumi components: typed args from corral.api, one custom resource each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi

from corral.api import Capacity, PoolSpec, SandboxTemplateSpec, UpdateStrategy, WarmPoolSpec
from corral.api.common import LocalRef

from ._k8s import CorralResource

TOKEN = "corral:index:{}"
PART_OF = {"app.kubernetes.io/part-of": "corral", "app.kubernetes.io/managed-by": "pulumi"}


def _metadata(name: pulumi.Input[str], namespace: pulumi.Input[str], labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {**PART_OF, **labels}}


@dataclass
class SandboxTemplateArgs:
    """Arguments of a SandboxTemplate component."""

    spec: SandboxTemplateSpec
    """The blueprint and policy (validated by corral.api)."""
    namespace: pulumi.Input[str] = "default"
    """Namespace of the template and of every sandbox made from it."""
    resource_name: str | None = None
    """Kubernetes name (default: the component's name)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels on the custom resource."""


class SandboxTemplate(pulumi.ComponentResource):
    """A corral.dev/v1alpha1 SandboxTemplate."""

    name: pulumi.Output[str]
    """Kubernetes name of the template."""
    namespace: pulumi.Output[str]
    """Namespace of the template."""
    status: pulumi.Output[Any]
    """The template's status as last read (blueprintHash, conditions)."""

    def __init__(self, name: str, args: SandboxTemplateArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TOKEN.format("SandboxTemplate"), name, None, opts)
        spec = SandboxTemplateSpec.model_validate(args.spec)
        self.resource = CorralResource(
            f"{name}-template",
            kind="SandboxTemplate",
            metadata=_metadata(args.resource_name or name, args.namespace, args.labels),
            spec=spec.to_k8s(),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.name = self.resource.metadata.apply(lambda m: m["name"])
        self.namespace = self.resource.metadata.apply(lambda m: m["namespace"])
        self.status = self.resource.status
        self.register_outputs({"name": self.name, "namespace": self.namespace, "status": self.status})


def _template_name(template: SandboxTemplate | str) -> pulumi.Input[str]:
    return template.name if isinstance(template, SandboxTemplate) else template


@dataclass
class WarmPoolArgs:
    """Arguments of a WarmPool component."""

    template: SandboxTemplate | str
    """The SandboxTemplate component, or the name of an existing template (same namespace)."""
    replicas: int = 1
    """Ready, unclaimed sandboxes to keep."""
    update_strategy: str = "OnReplenish"
    """OnReplenish or Recreate: what happens to idle sandboxes when the template changes."""
    readiness_grace_seconds: int = 300
    """A sandbox unready for longer than this is replaced."""
    namespace: pulumi.Input[str] = "default"
    """Namespace of the pool (the template's)."""
    resource_name: str | None = None
    """Kubernetes name (default: the component's name)."""
    labels: dict[str, str] = field(default_factory=dict)


class WarmPool(pulumi.ComponentResource):
    """A corral.dev/v1alpha1 WarmPool: keeps `replicas` ready sandboxes of a template."""

    name: pulumi.Output[str]
    namespace: pulumi.Output[str]
    status: pulumi.Output[Any]
    """replicas / readyReplicas / updatedReplicas as last read."""

    def __init__(self, name: str, args: WarmPoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TOKEN.format("WarmPool"), name, None, opts)
        # Validate everything but the (possibly unknown) template name now, with the field named on error.
        spec = WarmPoolSpec(
            replicas=args.replicas,
            template_ref=LocalRef(name="placeholder"),
            update_strategy=UpdateStrategy(type=args.update_strategy),
            readiness_grace_seconds=args.readiness_grace_seconds,
        ).to_k8s()
        template_name = _template_name(args.template)
        self.resource = CorralResource(
            f"{name}-warmpool",
            kind="WarmPool",
            metadata=_metadata(args.resource_name or name, args.namespace, args.labels),
            spec=pulumi.Output.from_input(template_name).apply(lambda t: {**spec, "templateRef": {"name": t}}),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.name = self.resource.metadata.apply(lambda m: m["name"])
        self.namespace = self.resource.metadata.apply(lambda m: m["namespace"])
        self.status = self.resource.status
        self.register_outputs({"name": self.name, "namespace": self.namespace, "status": self.status})


@dataclass
class PoolArgs:
    """Arguments of a Pool component."""

    template: SandboxTemplate | str
    """The SandboxTemplate component, or the name of an existing template (same namespace)."""
    capacity: Capacity = field(default_factory=Capacity)
    """Idle buffer and total bounds."""
    recycle_strategy: str = "Delete"
    """Delete, Restart or Noop on release."""
    max_unavailable: int = 1
    """Most sandboxes deleted at once on scale-down."""
    namespace: pulumi.Input[str] = "default"
    resource_name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


class Pool(pulumi.ComponentResource):
    """A corral.dev/v1alpha1 Pool: elastic capacity with an idle buffer and recycling."""

    name: pulumi.Output[str]
    namespace: pulumi.Output[str]
    status: pulumi.Output[Any]

    def __init__(self, name: str, args: PoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TOKEN.format("Pool"), name, None, opts)
        spec = PoolSpec(
            template_ref=LocalRef(name="placeholder"),
            capacity=Capacity.model_validate(args.capacity),
            recycle_strategy=args.recycle_strategy,
            max_unavailable=args.max_unavailable,
        ).to_k8s()
        self.resource = CorralResource(
            f"{name}-pool",
            kind="Pool",
            metadata=_metadata(args.resource_name or name, args.namespace, args.labels),
            spec=pulumi.Output.from_input(_template_name(args.template)).apply(
                lambda t: {**spec, "templateRef": {"name": t}}
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.name = self.resource.metadata.apply(lambda m: m["name"])
        self.namespace = self.resource.metadata.apply(lambda m: m["namespace"])
        self.status = self.resource.status
        self.register_outputs({"name": self.name, "namespace": self.namespace, "status": self.status})
