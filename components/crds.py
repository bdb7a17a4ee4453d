"""Corral's CustomResourceDefinitions as Pulumi resources, so a schema change shows up as a readable diff."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from corral.api.crd import load_committed


class CorralCRDs(pulumi.ComponentResource):
    """The five corral.dev CRDs, from the committed, generated YAML in api/crds/."""

    names: pulumi.Output[list[str]]
    """Names of the installed CRDs."""

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("corral:index:CorralCRDs", name, None, opts)
        self.crds: list[k8s.apiextensions.v1.CustomResourceDefinition] = []
        for crd in load_committed():
            plural = crd["spec"]["names"]["plural"]
            self.crds.append(
                k8s.apiextensions.v1.CustomResourceDefinition(
                    f"{name}-{plural}",
                    metadata=crd["metadata"],
                    spec=crd["spec"],
                    opts=pulumi.ResourceOptions(parent=self),
                )
            )
        self.names = pulumi.Output.all(*[c.metadata.name for c in self.crds])
        self.register_outputs({"names": self.names})
