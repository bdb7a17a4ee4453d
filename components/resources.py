"""SandboxTemplate, WarmPool and Pool as Pulumi components: typed args from corral.api, one custom resource each.

Part of Corral's public API (`from corral.components import ...`, see CHANGELOG.md): every args field and output is
documented here, and the component provider (corral.components.provider) mirrors these args for other languages; a
unit test keeps the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import pulumi

from corral.api import Capacity, PoolSpec, SandboxTemplateSpec, UpdateStrategy, WarmPoolSpec
from corral.api.common import LocalRef

from ._k8s import CorralResource

TOKEN = "corral:index:{}"
PART_OF = {"app.kubernetes.io/part-of": "corral", "app.kubernetes.io/managed-by": "pulumi"}


def _metadata(name: pulumi.Input[str], namespace: pulumi.Input[str], labels: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {**PART_OF, **labels}}


def _register(component: Any, role: str, kind: str, name: str, namespace: pulumi.Input[str],
              labels: dict[str, str], spec: pulumi.Input[dict[str, Any]]) -> None:
    """Create the component's one custom resource and its outputs (name, namespace, status)."""
    component.resource = CorralResource(
        role, kind=kind, metadata=_metadata(name, namespace, labels), spec=spec,
        opts=pulumi.ResourceOptions(parent=component),
    )
    component.name = component.resource.metadata.apply(lambda m: m["name"])
    component.namespace = component.resource.metadata.apply(lambda m: m["namespace"])
    component.status = component.resource.status
    component.register_outputs({"name": component.name, "namespace": component.namespace, "status": component.status})


def _with_template(spec: dict[str, Any],
                   template: SandboxTemplate | pulumi.Input[str]) -> pulumi.Output[dict[str, Any]]:
    """The spec with templateRef set from a template component (or name), which may not be known yet."""
    name = template.name if isinstance(template, SandboxTemplate) else template
    return pulumi.Output.from_input(name).apply(lambda t: {**spec, "templateRef": {"name": t}})


@dataclass
class SandboxTemplateArgs:
    """Arguments of a SandboxTemplate component."""

    spec: SandboxTemplateSpec | dict[str, Any]
    """The blueprint and policy: a corral.api SandboxTemplateSpec or its Kubernetes form (camelCase keys, as in
    `kubectl get sbxt -o yaml`), validated before anything is created."""
    namespace: pulumi.Input[str] = "default"
    """Namespace of the template and of every sandbox made from it."""
    resource_name: str | None = None
    """Kubernetes name of the custom resource (default: the component's name)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels on the custom resource."""


class SandboxTemplate(pulumi.ComponentResource):
    """A corral.dev/v1alpha1 SandboxTemplate."""

    name: pulumi.Output[str]
    """Kubernetes name of the template (what a WarmPool's or Pool's `template` takes)."""
    namespace: pulumi.Output[str]
    """Namespace of the template."""
    status: pulumi.Output[Any]
    """The template's status as last read (blueprintHash, conditions)."""

    def __init__(self, name: str, args: SandboxTemplateArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TOKEN.format("SandboxTemplate"), name, None, opts)
        spec = SandboxTemplateSpec.model_validate(args.spec)
        _register(self, f"{name}-template", "SandboxTemplate", args.resource_name or name, args.namespace,
                  args.labels, spec.to_k8s())


@dataclass
class WarmPoolArgs:
    """Arguments of a WarmPool component."""

    template: SandboxTemplate | pulumi.Input[str]
    """The SandboxTemplate component, or the name of a template in the same namespace (e.g. a SandboxTemplate's
    `name` output)."""
    replicas: int = 1
    """Ready, unclaimed sandboxes to keep (0 to 1000)."""
    update_strategy: Literal["OnReplenish", "Recreate"] = "OnReplenish"
    """What happens to idle sandboxes when the template changes: OnReplenish (replaced as they are claimed) or
    Recreate (replaced now)."""
    readiness_grace_seconds: int = 300
    """A sandbox unready for longer than this is replaced."""
    namespace: pulumi.Input[str] = "default"
    """Namespace of the pool (the template's)."""
    resource_name: str | None = None
    """Kubernetes name of the custom resource (default: the component's name)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels on the custom resource."""


class WarmPool(pulumi.ComponentResource):
    """A corral.dev/v1alpha1 WarmPool: keeps `replicas` ready sandboxes of a template."""

    name: pulumi.Output[str]
    """Kubernetes name of the warm pool (what a claim's poolRef names)."""
    namespace: pulumi.Output[str]
    """Namespace of the warm pool."""
    status: pulumi.Output[Any]
    """The pool's status as last read (replicas, readyReplicas, updatedReplicas, selector)."""

    def __init__(self, name: str, args: WarmPoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TOKEN.format("WarmPool"), name, None, opts)
        # Validate everything but the (possibly unknown) template name now, with the field named on error.
        spec = WarmPoolSpec(
            replicas=args.replicas,
            template_ref=LocalRef(name="placeholder"),
            update_strategy=UpdateStrategy(type=args.update_strategy),
            readiness_grace_seconds=args.readiness_grace_seconds,
        ).to_k8s()
        _register(self, f"{name}-warmpool", "WarmPool", args.resource_name or name, args.namespace, args.labels,
                  _with_template(spec, args.template))


@dataclass
class PoolArgs:
    """Arguments of a Pool component."""

    template: SandboxTemplate | pulumi.Input[str]
    """The SandboxTemplate component, or the name of a template in the same namespace (e.g. a SandboxTemplate's
    `name` output)."""
    capacity: Capacity | dict[str, int] = field(default_factory=Capacity)
    """Idle buffer [bufferMin, bufferMax] and total bounds [poolMin, poolMax]."""
    recycle_strategy: Literal["Delete", "Restart", "Noop"] = "Delete"
    """What happens to a released sandbox: Delete it, Restart its pod fresh, or Noop (back to the pool as is)."""
    max_unavailable: int = 1
    """Most sandboxes deleted at once on scale-down."""
    readiness_grace_seconds: int = 300
    """An idle sandbox unready for longer than this is replaced (10 to 86400)."""
    namespace: pulumi.Input[str] = "default"
    """Namespace of the pool (the template's)."""
    resource_name: str | None = None
    """Kubernetes name of the custom resource (default: the component's name)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Extra labels on the custom resource."""


class Pool(pulumi.ComponentResource):
    """A corral.dev/v1alpha1 Pool: elastic capacity with an idle buffer and recycling."""

    name: pulumi.Output[str]
    """Kubernetes name of the pool (what a claim's poolRef names)."""
    namespace: pulumi.Output[str]
    """Namespace of the pool."""
    status: pulumi.Output[Any]
    """The pool's status as last read (total, allocated, available, updated, revision)."""

    def __init__(self, name: str, args: PoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TOKEN.format("Pool"), name, None, opts)
        spec = PoolSpec(
            template_ref=LocalRef(name="placeholder"),
            capacity=Capacity.model_validate(args.capacity),
            recycle_strategy=args.recycle_strategy,
            max_unavailable=args.max_unavailable,
            readiness_grace_seconds=args.readiness_grace_seconds,
        ).to_k8s()
        _register(self, f"{name}-pool", "Pool", args.resource_name or name, args.namespace, args.labels,
                  _with_template(spec, args.template))
