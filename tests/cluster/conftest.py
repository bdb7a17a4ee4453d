"""cluster tier: a real single-node kind cluster (kubelet, containerd, real pods, kube-router enforcing
NetworkPolicies), brought up by `scripts/kind.sh` under a name of its own, with Corral installed the way a user
installs it: `pulumi up --stack dev` with the controller image loaded into the node."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from clusterutil import CLUSTER, REPO, STACK, STACK_CONFIG, DevStack, KindCluster, host_sysctls, script, tool_env


@pytest.fixture(scope="session")
def kind_cluster() -> Iterator[KindCluster]:
    """A fresh kind cluster of the tier's own; the host's kernel settings are read before it starts. Deleted at
    the end (kind delete)."""
    before = host_sysctls()
    script("kind.sh", "down", CLUSTER)                      # a cluster left by an interrupted run starts over
    kubeconfig = script("kind.sh", "up", CLUSTER, timeout=3600)
    controller = script("controller-image.sh")
    script("kind.sh", "load", controller, "corral/controller:0.1.0", "corral/python:bookworm", "corral/base:bookworm",
           timeout=1200)
    yield KindCluster(CLUSTER, kubeconfig, before)
    script("kind.sh", "down", CLUSTER)


@pytest.fixture(scope="session")
def dev_stack(kind_cluster, tmp_path_factory) -> Iterator[DevStack]:
    """`pulumi up --stack dev` against the kind cluster, from a copy of the project (state of its own)."""
    project = tmp_path_factory.mktemp("project")
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(REPO / "stacks", project / "stacks")
    (project / ".venv").symlink_to(REPO / ".venv")
    backend = tmp_path_factory.mktemp("pulumi-state")
    env = {**tool_env(), "KUBECONFIG": kind_cluster.kubeconfig, "PULUMI_BACKEND_URL": f"file://{backend}",
           "PULUMI_CONFIG_PASSPHRASE": "corral-cluster-tests"}
    stack = DevStack(project, env, {})
    stack.pulumi("stack", "init", STACK, "--non-interactive")
    stack.configure(STACK_CONFIG)
    try:
        stack.up()
        yield stack
    finally:
        stack.pulumi("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview", check=False)
        stack.pulumi("stack", "rm", STACK, "--yes", "--force", "--non-interactive", check=False)


