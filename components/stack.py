"""What a stack is made of, from its typed config. __main__.py calls build() and nothing else."""

from __future__ import annotations

import os

import pulumi
import pulumi_kubernetes as k8s

from . import catalogue
from .config import StackConfig
from .crds import CorralCRDs
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
    if kc.install_crds:
        depends.append(CorralCRDs("corral-crds", opts=base))
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
        "templates": [t.name for t in templates.values()],
        "warmPools": [p.name for p in warm_pools],
        "pools": [p.name for p in pools],
    }


def build_docker(config: StackConfig) -> dict[str, pulumi.Input]:
    # The DockerStack component (operator container, networks, pools file) is not built yet. Until it is, the local
    # stack validates its templates and pools and reports what it would run, and creates nothing.
    rendered = {t.name: catalogue.render(t.catalogue, t.params).to_k8s() for t in config.templates}
    pulumi.log.warn("mode docker: the DockerStack component is not built yet; nothing is started on the Docker host")
    return {
        "mode": "docker",
        "templates": sorted(rendered),
        "warmPools": {p.name: {"template": p.template, "replicas": p.replicas} for p in config.warm_pools},
        "pools": {p.name: {"template": p.template, **p.capacity.to_k8s()} for p in config.pools},
    }
