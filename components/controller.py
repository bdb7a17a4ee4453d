"""ControllerDeployment: Corral's operator on a Kubernetes cluster - namespace, CRDs, token Secret and the
`charts/corral` chart (RBAC, Deployment, Service, NetworkPolicies, PodDisruptionBudget, ServiceMonitor) rendered by
pulumi-kubernetes' Helm support with typed, validated values.

The CRDs are Pulumi resources of their own (a schema change is a readable diff, and they are never deleted by a
chart upgrade); the chart is rendered with `skipCrds`. Values are `OperatorValues` spelled out in full, so changing
one field shows exactly that field's resources in `pulumi preview --diff`.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from ._token import ApiToken
from .controller_values import CHART_DIR, OperatorValues, ValuesError, deep_merge

PART_OF = {"app.kubernetes.io/part-of": "corral", "app.kubernetes.io/managed-by": "pulumi"}


def fullname(release: str, name_override: str = "") -> str:
    """The chart's `corral.fullname` (kept in step with charts/corral/templates/_helpers.tpl)."""
    name = name_override or "corral"
    return release[:63].rstrip("-") if name in release else f"{release}-{name}"[:63].rstrip("-")


def chart_crds() -> list[dict[str, Any]]:
    """The chart's crds/ (Corral's six kinds and kopf's peering kinds), as dicts."""
    return [yaml.safe_load(p.read_text()) for p in sorted((CHART_DIR / "crds").glob("*.yaml"))]


@dataclass
class ControllerDeploymentArgs:
    """Arguments of a ControllerDeployment component."""

    namespace: str = "corral-system"
    """Namespace of the operator."""
    create_namespace: bool = True
    """Create the namespace (False: it must exist)."""
    values: OperatorValues = field(default_factory=OperatorValues)
    """Typed chart values (image, resources, replicas and peering, metrics, claims API, NetworkPolicies, ...)."""
    raw_values: dict[str, Any] = field(default_factory=dict)
    """Escape hatch: wire-form (camelCase) chart values merged over `values`, e.g. a values file shared with plain
    Helm installs. Validated like `values`; a bad key fails the program with the key's path."""
    install_crds: bool = True
    """Install the CRDs (Corral's and kopf's peering) as Pulumi resources."""
    release_name: str = "corral"
    """Helm release name (resource names derive from it)."""


class ControllerDeployment(pulumi.ComponentResource):
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

    def __init__(self, name: str, args: ControllerDeploymentArgs | None = None,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        args = args or ControllerDeploymentArgs()
        values = merged_values(args.values, args.raw_values)  # before registering: bad values leave nothing behind
        super().__init__("corral:index:ControllerDeployment", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        depends: list[pulumi.Resource] = []

        namespace: pulumi.Input[str] = args.namespace
        if args.create_namespace:
            ns = k8s.core.v1.Namespace(
                f"{name}-namespace", metadata={"name": args.namespace, "labels": dict(PART_OF)}, opts=child)
            namespace = ns.metadata.name
            depends.append(ns)

        self.crds: list[k8s.apiextensions.v1.CustomResourceDefinition] = []
        if args.install_crds:
            for crd in chart_crds():
                self.crds.append(k8s.apiextensions.v1.CustomResourceDefinition(
                    f"{name}-{crd['metadata']['name']}", metadata=crd["metadata"], spec=crd["spec"], opts=child))
        depends += self.crds

        service = fullname(args.release_name, values.name_override)
        secret_name = values.secrets.existing_secret
        if not secret_name:
            # The chart would make random tokens at every render (Pulumi renders without the cluster's state), so the
            # component owns the Secret: two tokens created once and kept in the stack's state.
            secret_name = f"{service}-tokens"
            hmac_key = ApiToken(f"{name}-token-secret", opts=child)
            api_token = ApiToken(f"{name}-api-token", opts=child)
            secret = k8s.core.v1.Secret(
                f"{name}-tokens",
                metadata={"name": secret_name, "namespace": namespace, "labels": dict(PART_OF)},
                string_data={"token-secret": hmac_key.token, "api-token": api_token.token},
                opts=pulumi.ResourceOptions(parent=self, depends_on=depends[:1]))
            depends.append(secret)
            self.api_token = pulumi.Output.secret(api_token.token)
            values = values.model_copy(update={"secrets": values.secrets.model_copy(
                update={"existing_secret": secret_name})})
        else:
            existing = k8s.core.v1.Secret.get(
                f"{name}-existing-tokens", pulumi.Output.concat(namespace, "/", secret_name), opts=child)
            self.api_token = pulumi.Output.secret(existing.data.apply(
                lambda d: base64.b64decode((d or {}).get("api-token", "")).decode()))

        self.chart = k8s.helm.v4.Chart(
            f"{name}-chart",
            chart=str(CHART_DIR),
            name=args.release_name,
            namespace=namespace,
            values=values.to_values(),
            skip_crds=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends),
        )
        self.namespace = pulumi.Output.from_input(namespace)
        self.service_name = pulumi.Output.from_input(service)
        self.metrics_endpoint = self.namespace.apply(
            lambda ns: f"http://{service}.{ns}.svc:{values.metrics.port}/metrics")
        self.api_endpoint = self.namespace.apply(
            lambda ns: f"http://{service}-api.{ns}.svc:{values.api.port}" if values.api.enabled else "")
        self.register_outputs({"namespace": self.namespace, "service_name": self.service_name,
                               "metrics_endpoint": self.metrics_endpoint, "api_endpoint": self.api_endpoint,
                               "api_token": self.api_token})


def merged_values(values: OperatorValues, raw: dict[str, Any] | None) -> OperatorValues:
    """`raw` (wire form) over `values`, validated; ValuesError names the bad field."""
    if not raw:
        return values
    if not isinstance(raw, dict):
        raise ValuesError(f"raw_values must be a mapping of chart values, not {type(raw).__name__}")
    return OperatorValues.parse(deep_merge(values.to_values(), raw))
