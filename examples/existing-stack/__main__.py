"""An existing platform program adds Corral in a few lines.

The program already has its own Kubernetes provider (a cluster it made, or a kubeconfig) and its own resources: an
application namespace with a settings ConfigMap. Corral joins through the same provider, passed in `opts`, which every
Kubernetes resource Corral creates inherits: the operator (ControllerDeployment, in its own namespace `corral-system`),
a namespace for sandboxes, one SandboxTemplate from the catalogue and one WarmPool of it.

Remove Corral again, leaving the rest as it is:
    pulumi destroy --target 'urn:...::corral:index:ControllerDeployment::corral' \
                   --target 'urn:...::kubernetes:core/v1:Namespace::agent-sandboxes' --target-dependents
"""

import pulumi
import pulumi_kubernetes as k8s

from corral.components import (
                               ControllerDeployment,
                               ControllerDeploymentArgs,
                               SandboxTemplate,
                               SandboxTemplateArgs,
                               WarmPool,
                               WarmPoolArgs,
)
from corral.components.catalogue import render

config = pulumi.Config()

# --- what the program had before Corral ----------------------------------------------------------------------------
cluster = k8s.Provider("platform-cluster", kubeconfig=config.get("kubeconfig") or None,
                       context=config.get("context") or None)
on_cluster = pulumi.ResourceOptions(provider=cluster)
apps = k8s.core.v1.Namespace("platform-apps", metadata={"name": "platform-apps"}, opts=on_cluster)
settings = k8s.core.v1.ConfigMap("platform-settings", metadata={"name": "platform-settings",
                                                                "namespace": apps.metadata.name},
                                 data={"owner": "platform-team"}, opts=on_cluster)

# --- Corral --------------------------------------------------------------------------------------------------------
controller = ControllerDeployment("corral", ControllerDeploymentArgs(namespace="corral-system"), opts=on_cluster)
sandboxes = k8s.core.v1.Namespace("agent-sandboxes", metadata={"name": "agent-sandboxes"}, opts=on_cluster)
after_controller = pulumi.ResourceOptions(provider=cluster, depends_on=[controller])  # its CRDs come first
template = SandboxTemplate("python", SandboxTemplateArgs(spec=render("python"), namespace=sandboxes.metadata.name),
                           opts=after_controller)
warm = WarmPool("python-warm", WarmPoolArgs(template=template, replicas=2, namespace=template.namespace),
                opts=after_controller)

pulumi.export("appNamespace", apps.metadata.name)
pulumi.export("corralNamespace", controller.namespace)
pulumi.export("claimsApi", controller.api_endpoint)
pulumi.export("warmPool", warm.name)
