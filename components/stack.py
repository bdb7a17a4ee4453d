"""What a stack is made of, from its typed config. __main__.py calls build() and nothing else."""

from __future__ import annotations

import os

import pulumi
import pulumi_kubernetes as k8s

from . import catalogue
from .config import StackConfig
from .controller import ControllerDeployment, ControllerDeploymentArgs
from .docker_stack import DockerStack, DockerStackArgs
from .resources import Pool, PoolArgs, SandboxTemplate, SandboxTemplateArgs, WarmPool, WarmPoolArgs


def build(config: StackConfig) -> dict[str, pulumi.Input]:
    """Create the stack's resources and return its exports."""
    exports = build_kubernetes(config) if config.mode == "kubernetes" else build_docker(config)
    for key, value in exports.items():
        pulumi.export(key, value)
    return exports


def build_kubernetes(config: StackConfig) -> dict[str, pulumi.Input]:
    kc = config.kubernetes
    provider = None
    if kc.kubeconfig or kc.context:
        provider = k8s.Provider(
            "kubernetes",
            kubeconfig=os.path.expanduser(kc.kubeconfig) if kc.kubeconfig else None,
            context=kc.context,
        )
    base = pulumi.ResourceOptions(provider=provider)
    depends: list[pulumi.Resource] = []
    namespace: pulumi.Input[str] = kc.namespace
    if kc.create_namespace:
        ns = k8s.core.v1.Namespace(
            "sandbox-namespace",
            metadata={"name": kc.namespace, "labels": {"app.kubernetes.io/part-of": "corral"}},
            opts=base,
        )
        namespace = ns.metadata.name
        depends.append(ns)
    controller = None
    if config.controller.enabled:
        cc = config.controller
        values = cc.values
        if not values.sandbox_namespaces:  # the stack's sandbox namespace gets the default-deny policy
            values = values.model_copy(update={"sandbox_namespaces": [kc.namespace]})
        controller = ControllerDeployment(
            "corral",
            ControllerDeploymentArgs(namespace=cc.namespace, create_namespace=cc.create_namespace, values=values,
                                     raw_values=cc.raw_values, install_crds=cc.install_crds),
            opts=pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=list(depends))),
        )
        depends.append(controller)
    opts = pulumi.ResourceOptions.merge(base, pulumi.ResourceOptions(depends_on=depends))

    templates = {
        t.name: SandboxTemplate(
            t.name,
            SandboxTemplateArgs(spec=catalogue.render(t.catalogue, t.params), namespace=namespace),
            opts=opts,
        )
        for t in config.templates
    }
    warm_pools = [
        WarmPool(
            p.name,
            WarmPoolArgs(
                template=templates[p.template], replicas=p.replicas, update_strategy=p.update_strategy,
                namespace=namespace,
            ),
            opts=opts,
        )
        for p in config.warm_pools
    ]
    pools = [
        Pool(
            p.name,
            PoolArgs(
                template=templates[p.template], capacity=p.capacity, recycle_strategy=p.recycle_strategy,
                max_unavailable=p.max_unavailable, namespace=namespace,
            ),
            opts=opts,
        )
        for p in config.pools
    ]
    return {
        "mode": "kubernetes",
        "namespace": namespace,
        **({"controllerNamespace": controller.namespace, "controllerService": controller.service_name,
            "metricsEndpoint": controller.metrics_endpoint, "apiEndpoint": controller.api_endpoint,
            "apiToken": controller.api_token} if controller else {}),
        "templates": [t.name for t in templates.values()],
        "warmPools": [p.name for p in warm_pools],
        "pools": [p.name for p in pools],
    }


def build_docker(config: StackConfig) -> dict[str, pulumi.Input]:
    """The local Docker host: the DockerStack component (networks, the operator image and container with the
    Docker socket and its state volume, the pools file from the templates and pools of the config)."""
    dc = config.docker
    templates = {t.name: catalogue.render(t.catalogue, t.params).to_k8s() for t in config.templates}
    stack = DockerStack(
        "corral",
        DockerStackArgs(
            stack=pulumi.get_stack(),
            templates=templates,
            warm_pools=[{"name": p.name, "template": p.template, "replicas": p.replicas,
                         "update_strategy": p.update_strategy} for p in config.warm_pools],
            pools=[{"name": p.name, "template": p.template, "buffer_min": p.capacity.buffer_min,
                    "buffer_max": p.capacity.buffer_max, "pool_min": p.capacity.pool_min,
                    "pool_max": p.capacity.pool_max, "recycle_strategy": p.recycle_strategy,
                    "max_unavailable": p.max_unavailable} for p in config.pools],
            api_port=dc.api_port,
            host=dc.host,
            internal_networks=list(dc.internal_networks),
            operator_image=dc.operator_image,
            log_level=dc.log_level,
        ),
    )
    return {
        "mode": "docker",
        "apiUrl": stack.api_url,
        "apiToken": stack.api_token,
        "operatorImage": stack.operator_image,
        "networks": stack.networks,
        "templates": sorted(templates),
        "warmPools": {p.name: {"template": p.template, "replicas": p.replicas} for p in config.warm_pools},
        "pools": {p.name: {"template": p.template, **p.capacity.to_k8s()} for p in config.pools},
    }
