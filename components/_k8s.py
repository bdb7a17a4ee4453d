"""A Kubernetes custom resource of Corral's, registered through pulumi-kubernetes, with `status` as an output."""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi_kubernetes import _utilities as k8s_utilities

from corral.api.common import API_VERSION


class CorralResource(pulumi.CustomResource):
    """Like pulumi_kubernetes.apiextensions.CustomResource (same type token, same provider), but typed to Corral's
    group and with the object's `status` as an output, so components can expose what the operator reports."""

    metadata: pulumi.Output[dict[str, Any]]
    spec: pulumi.Output[dict[str, Any]]
    status: pulumi.Output[dict[str, Any] | None]

    def __init__(
        self,
        resource_name: str,
        kind: str,
        metadata: pulumi.Input[dict[str, Any]],
        spec: pulumi.Input[dict[str, Any]],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(version=k8s_utilities.get_version()))
        props = {"apiVersion": API_VERSION, "kind": kind, "metadata": metadata, "spec": spec, "status": None}
        super().__init__(f"kubernetes:{API_VERSION}:{kind}", resource_name, props, opts)
