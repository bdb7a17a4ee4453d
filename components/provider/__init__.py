"""Corral's components for every Pulumi language: a component provider (package `corral`, type tokens
corral:index:<Name>) built on Pulumi's Python component-provider support.

Pulumi infers the provider's schema from the type annotations and docstrings of the classes below, and it understands
TypedDicts of plain types and `pulumi.Input`s, not dataclasses holding pydantic models. So this module is a thin,
provider-facing layer: each `*Args` TypedDict mirrors the args dataclass of the Python component of the same name
(same fields, same required ones, same docstrings), and each component subclasses the Python component, so what
runs is exactly the Python component (same type token, children and validation). tests/unit/test_provider.py fails
when a mirror drifts from its Python args. ControllerDeployment's chart values are generated from their pydantic
model instead (_schema.mirror_model).

No `from __future__ import annotations` here: the schema is read from evaluated annotations.

    pulumi package get-schema ./components/provider
    python -m corral.components.provider        # what the plugin host runs
"""

import json
import sys
from enum import Enum, StrEnum
from typing import Any, NotRequired, TypedDict

import pulumi

from .. import controller, docker_stack, resources
from .._version import __version__
from ..controller_values import OperatorValues as _OperatorValuesModel
from ._schema import MODEL_TYPES, describe, described, mirror_model

PACKAGE = "corral"
__all__ = ["COMPONENTS", "PYTHON_COMPONENTS", "ControllerDeployment", "SandboxTemplate", "WarmPool", "Pool",
           "DockerStack", "describe", "main", "provider", "schema"]


class UpdateStrategy(StrEnum):
    """What happens to a WarmPool's idle sandboxes when their template changes."""

    ON_REPLENISH = "OnReplenish"
    """Replaced one by one as sandboxes are claimed and replenished."""
    RECREATE = "Recreate"
    """Replaced now."""


class RecycleStrategy(StrEnum):
    """What happens to a Pool's sandbox when its claim releases it."""

    DELETE = "Delete"
    """The sandbox is deleted."""
    RESTART = "Restart"
    """Its pod restarts fresh and returns to the pool."""
    NOOP = "Noop"
    """It returns to the pool as is."""


def _plain(value: Any) -> Any:
    """Enum members to their values, recursively (the Python components take the plain strings)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


# The chart values: generated from their pydantic model (large, and changing with the chart), so they cannot drift.
OperatorValues = mirror_model(_OperatorValuesModel)


# --- ControllerDeployment ------------------------------------------------------------------------------------------
class ControllerDeploymentArgs(TypedDict):
    """Arguments of a ControllerDeployment component."""

    namespace: NotRequired[str]
    """Namespace of the operator."""
    create_namespace: NotRequired[bool]
    """Create the namespace (False: it must exist)."""
    values: NotRequired[OperatorValues]  # type: ignore[valid-type]
    """Typed chart values (image, resources, replicas and peering, metrics, claims API, NetworkPolicies, ...)."""
    raw_values: NotRequired[dict[str, Any]]
    """Escape hatch: wire-form (camelCase) chart values merged over `values`, e.g. a values file shared with plain
    Helm installs. Validated like `values`; a bad key fails the program with the key's path."""
    install_crds: NotRequired[bool]
    """Install the CRDs (Corral's and kopf's peering) as Pulumi resources."""
    release_name: NotRequired[str]
    """Helm release name (resource names derive from it)."""


class ControllerDeployment(controller.ControllerDeployment):
    """Corral's operator on a Kubernetes cluster."""

    namespace: pulumi.Output[str]
    """Namespace of the operator."""
    service_name: pulumi.Output[str]
    """Name of the operator's Service (metrics and the claims API)."""
    metrics_endpoint: pulumi.Output[str]
    """In-cluster URL of the Prometheus metrics."""
    api_endpoint: pulumi.Output[str]
    """In-cluster URL of the claims HTTP API ('' when the API is off)."""
    api_token: pulumi.Output[str]
    """Bearer token of the claims API (secret)."""

    def __init__(self, name: str, args: ControllerDeploymentArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        plain = _plain(args)
        if "values" in plain:
            plain["values"] = _OperatorValuesModel.parse(plain["values"])
        super().__init__(name, controller.ControllerDeploymentArgs(**plain), opts)


# --- SandboxTemplate -----------------------------------------------------------------------------------------------
class SandboxTemplateArgs(TypedDict):
    """Arguments of a SandboxTemplate component."""

    spec: dict[str, Any]
    """The blueprint and policy: a corral.api SandboxTemplateSpec or its Kubernetes form (camelCase keys, as in
    `kubectl get sbxt -o yaml`), validated before anything is created."""
    namespace: NotRequired[pulumi.Input[str]]
    """Namespace of the template and of every sandbox made from it."""
    resource_name: NotRequired[str | None]
    """Kubernetes name of the custom resource (default: the component's name)."""
    labels: NotRequired[dict[str, str]]
    """Extra labels on the custom resource."""


class SandboxTemplate(resources.SandboxTemplate):
    """A corral.dev/v1alpha1 SandboxTemplate."""

    name: pulumi.Output[str]
    """Kubernetes name of the template (what a WarmPool's or Pool's `template` takes)."""
    namespace: pulumi.Output[str]
    """Namespace of the template."""
    status: pulumi.Output[Any]
    """The template's status as last read (blueprintHash, conditions)."""

    def __init__(self, name: str, args: SandboxTemplateArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(name, resources.SandboxTemplateArgs(**_plain(args)), opts)


# --- WarmPool ------------------------------------------------------------------------------------------------------
class WarmPoolArgs(TypedDict):
    """Arguments of a WarmPool component."""

    template: pulumi.Input[str]
    """The SandboxTemplate component, or the name of a template in the same namespace (e.g. a SandboxTemplate's
    `name` output)."""
    replicas: NotRequired[int]
    """Ready, unclaimed sandboxes to keep (0 to 1000)."""
    update_strategy: NotRequired[UpdateStrategy]
    """What happens to idle sandboxes when the template changes: OnReplenish (replaced as they are claimed) or
    Recreate (replaced now)."""
    readiness_grace_seconds: NotRequired[int]
    """A sandbox unready for longer than this is replaced."""
    namespace: NotRequired[pulumi.Input[str]]
    """Namespace of the pool (the template's)."""
    resource_name: NotRequired[str | None]
    """Kubernetes name of the custom resource (default: the component's name)."""
    labels: NotRequired[dict[str, str]]
    """Extra labels on the custom resource."""


class WarmPool(resources.WarmPool):
    """A corral.dev/v1alpha1 WarmPool: keeps `replicas` ready sandboxes of a template."""

    name: pulumi.Output[str]
    """Kubernetes name of the warm pool (what a claim's poolRef names)."""
    namespace: pulumi.Output[str]
    """Namespace of the warm pool."""
    status: pulumi.Output[Any]
    """The pool's status as last read (replicas, readyReplicas, updatedReplicas, selector)."""

    def __init__(self, name: str, args: WarmPoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(name, resources.WarmPoolArgs(**_plain(args)), opts)


# --- Pool ----------------------------------------------------------------------------------------------------------
class Capacity(TypedDict):
    """Idle buffer kept in [bufferMin, bufferMax]; total (incl. pending and terminating) in [poolMin, poolMax]."""

    buffer_min: NotRequired[int]
    """Fewest idle sandboxes to keep."""
    buffer_max: NotRequired[int]
    """Most idle sandboxes to keep."""
    pool_min: NotRequired[int]
    """Fewest sandboxes in total."""
    pool_max: NotRequired[int]
    """Most sandboxes in total."""


class PoolArgs(TypedDict):
    """Arguments of a Pool component."""

    template: pulumi.Input[str]
    """The SandboxTemplate component, or the name of a template in the same namespace (e.g. a SandboxTemplate's
    `name` output)."""
    capacity: NotRequired[Capacity]
    """Idle buffer [bufferMin, bufferMax] and total bounds [poolMin, poolMax]."""
    recycle_strategy: NotRequired[RecycleStrategy]
    """What happens to a released sandbox: Delete it, Restart its pod fresh, or Noop (back to the pool as is)."""
    max_unavailable: NotRequired[int]
    """Most sandboxes deleted at once on scale-down."""
    readiness_grace_seconds: NotRequired[int]
    """An idle sandbox unready for longer than this is replaced (10 to 86400)."""
    namespace: NotRequired[pulumi.Input[str]]
    """Namespace of the pool (the template's)."""
    resource_name: NotRequired[str | None]
    """Kubernetes name of the custom resource (default: the component's name)."""
    labels: NotRequired[dict[str, str]]
    """Extra labels on the custom resource."""


class Pool(resources.Pool):
    """A corral.dev/v1alpha1 Pool: elastic capacity with an idle buffer and recycling."""

    name: pulumi.Output[str]
    """Kubernetes name of the pool (what a claim's poolRef names)."""
    namespace: pulumi.Output[str]
    """Namespace of the pool."""
    status: pulumi.Output[Any]
    """The pool's status as last read (total, allocated, available, updated, revision)."""

    def __init__(self, name: str, args: PoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(name, resources.PoolArgs(**_plain(args)), opts)


# --- DockerStack ---------------------------------------------------------------------------------------------------
class DockerWarmPool(TypedDict):
    """A warm pool of a DockerStack."""

    name: str
    """Name of the warm pool (what a claim's `pool` names)."""
    template: str
    """Name of one of the stack's templates."""
    replicas: int
    """Ready, unclaimed sandboxes to keep (0 to 1000)."""
    update_strategy: NotRequired[UpdateStrategy]
    """OnReplenish or Recreate: what happens to idle sandboxes when the template changes."""
    readiness_grace_seconds: NotRequired[int]
    """A sandbox unready for longer than this is replaced (10 to 86400; default 300, as a WarmPool's)."""


class DockerPool(TypedDict):
    """An elastic pool of a DockerStack."""

    name: str
    """Name of the pool (what a claim's `pool` names)."""
    template: str
    """Name of one of the stack's templates."""
    buffer_min: NotRequired[int]
    """Fewest idle sandboxes to keep."""
    buffer_max: NotRequired[int]
    """Most idle sandboxes to keep."""
    pool_min: NotRequired[int]
    """Fewest sandboxes in total."""
    pool_max: NotRequired[int]
    """Most sandboxes in total."""
    recycle_strategy: NotRequired[RecycleStrategy]
    """Delete, Restart or Noop: what happens to a released sandbox."""
    max_unavailable: NotRequired[int]
    """Most sandboxes deleted at once on scale-down."""
    readiness_grace_seconds: NotRequired[int]
    """An idle sandbox unready for longer than this is replaced (10 to 86400; default 300, as a Pool's)."""


class DockerStackArgs(TypedDict):
    """Arguments of a DockerStack component."""

    stack: str
    """Name of this Corral on the Docker host: every container, network and volume carries
    corral.dev/stack=<stack>, and destroy removes exactly those."""
    templates: dict[str, dict[str, Any]]
    """Sandbox templates by name, each a SandboxTemplate spec in its Kubernetes form (camelCase keys)."""
    warm_pools: NotRequired[list[DockerWarmPool]]
    """Warm pools: each {name, template, replicas, update_strategy (OnReplenish or Recreate),
    readiness_grace_seconds}."""
    pools: NotRequired[list[DockerPool]]
    """Elastic pools: each {name, template, buffer_min, buffer_max, pool_min, pool_max, recycle_strategy
    (Delete, Restart or Noop), max_unavailable, readiness_grace_seconds}."""
    api_port: NotRequired[int]
    """Port of the claims API on the host's 127.0.0.1."""
    host: NotRequired[str | None]
    """Docker Engine to use (e.g. unix:///var/run/docker.sock; default: the environment's DOCKER_HOST)."""
    internal_networks: NotRequired[list[str]]
    """Templates whose sandbox network has no route out (Docker internal networks)."""
    operator_image: NotRequired[str | None]
    """Operator image to run; it must exist on the engine (default: corral/operator:<sources key>, built offline
    from this checkout when missing)."""
    pools_dir: NotRequired[str | None]
    """Host folder of the pools file the operator reads (default: $CORRAL_CACHE/run/docker-stacks/<stack>)."""
    log_level: NotRequired[str]
    """The operator's log level (debug, info, warning, error)."""


class DockerStack(docker_stack.DockerStack):
    """Corral on one Docker host: the operator container (claims API, warm pools and pools of hardened sandbox
    containers) with its networks, state volume and pools file."""

    api_url: pulumi.Output[str]
    """Base URL of the claims API (http://127.0.0.1:<api_port>), known once the operator answers."""
    api_token: pulumi.Output[str]
    """Bearer token of the claims API (secret)."""
    operator_image: pulumi.Output[str]
    """The operator image that runs."""
    networks: pulumi.Output[list[str]]
    """Docker networks of the templates' sandboxes."""

    def __init__(self, name: str, args: DockerStackArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(name, docker_stack.DockerStackArgs(**_plain(args)), opts)


# The provider's components: each mirrors the Python component it subclasses (PYTHON_COMPONENTS).
COMPONENTS: list[type[pulumi.ComponentResource]] = [ControllerDeployment, SandboxTemplate, WarmPool, Pool, DockerStack]
PYTHON_COMPONENTS = {c.__name__: (c.__mro__[1], a) for c, a in [
    (ControllerDeployment, controller.ControllerDeploymentArgs), (SandboxTemplate, resources.SandboxTemplateArgs),
    (WarmPool, resources.WarmPoolArgs), (Pool, resources.PoolArgs), (DockerStack, docker_stack.DockerStackArgs)]}


def provider():
    """The component provider: Pulumi's ComponentProvider over COMPONENTS, descriptions tidied."""
    from pulumi.provider.experimental.component import ComponentProvider

    p = ComponentProvider(COMPONENTS, PACKAGE, None, __version__)
    schema = json.loads(p.schema)
    for name, model in MODEL_TYPES.items():
        props = schema["types"][f"{PACKAGE}:index:{name}"]["properties"]
        for field, info in model.model_fields.items():
            props[info.alias or field]["description"] = info.description or field
    p.schema = json.dumps(described(schema))
    return p


def schema() -> dict[str, Any]:
    """The provider's package schema (what `pulumi package get-schema` prints)."""
    return json.loads(provider().schema)


def main() -> None:
    """Serve the provider; the plugin host runs this with the engine's address as argument. The components' dynamic
    resources are served here too, by this interpreter (corral.components._dynamic)."""
    from .. import _dynamic
    from ._crud import serve

    _dynamic.serve_here()
    serve(provider(), sys.argv[1:])
