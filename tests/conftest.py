"""Tier fixtures: each brings up exactly what its tier needs, once per session, and tears down what it started.

A tier whose tool is missing fails with the command that builds it; nothing is skipped silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


TIER_ORDER = ["unit", "package", "execd", "docker", "engine", "kube", "cluster"]


def pytest_collection_modifyitems(config, items):
    """Run tiers from fast to slow (unit first), keeping each file's own order."""

    def tier(item):
        for i, name in enumerate(TIER_ORDER[1:], start=1):
            if item.get_closest_marker(name):
                return i
        return 0

    items.sort(key=tier)


def run_script(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """Run a scripts/ command; on failure, fail the test with its output and the command to rerun by hand."""
    proc = subprocess.run([str(SCRIPTS / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(
            f"`scripts/{' '.join(args)}` failed (exit {proc.returncode}); run it by hand to see why.\n"
            f"--- stderr (tail) ---\n{proc.stderr[-4000:]}",
            pytrace=False,
        )
    return proc


def tool_env() -> dict[str, str]:
    """os.environ plus what scripts/env.sh sets (the test bed's tools first on PATH, Pulumi offline)."""
    out = subprocess.run(["bash", "-c", f'eval "$({SCRIPTS}/env.sh)" && env -0'], capture_output=True, check=True)
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


@pytest.fixture(scope="session")
def docker_client():
    """A client of a real Docker Engine with Corral's base images loaded (starts dockerd if none answers)."""
    import docker

    run_script("docker.sh", "all")
    client = docker.from_env()
    yield client
    client.close()


@dataclass
class Cluster:
    kubeconfig: str

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.kubeconfig}


@pytest.fixture(scope="session")
def kube_cluster():
    """A local control plane (etcd, kube-apiserver, kcm, scheduler, kwok) on loopback; started if not running,
    and stopped at the end only if this session started it."""
    status = subprocess.run([str(SCRIPTS / "cluster.sh"), "status"], capture_output=True, text=True)
    was_running = "kube-apiserver: running" in status.stdout
    if not was_running:
        run_script("cluster.sh", "reset")  # a cluster this session starts, starts empty (no state of earlier runs)
    proc = run_script("cluster.sh", "up", timeout=600)
    cluster = Cluster(kubeconfig=proc.stdout.strip().splitlines()[-1])
    yield cluster
    if not was_running:
        run_script("cluster.sh", "down")


@pytest.fixture(scope="session")
def kube(kube_cluster):
    """A lightkube client of the local cluster, as its admin."""
    from lightkube import Client, KubeConfig

    client = Client(config=KubeConfig.from_file(kube_cluster.kubeconfig), field_manager="corral-tests", timeout=60)
    yield client
    client.close() if hasattr(client, "close") else None


@pytest.fixture(scope="session")
def corral_crds(kube):
    """Corral's committed CRDs applied to the local cluster and Established."""
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    from corral.api.crd import load_committed

    names = []
    for crd in load_committed():
        kube.apply(CustomResourceDefinition.from_dict(crd), force=True)  # type: ignore[attr-defined]
        names.append(crd["metadata"]["name"])
    for name in names:
        kube.wait(CustomResourceDefinition, name, for_conditions=["Established"])
    yield names
    # Leave the cluster as the engine tier expects it: no Corral CRDs, and none of kopf's peering CRDs that kube
    # tests (the chart's, peering) applied - removed only here, at the end: a CRD deleted and re-created mid-session
    # leaves watches on it silent.
    present = {c.metadata.name for c in kube.list(CustomResourceDefinition)}
    for name in names + [n for n in ("clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev") if n in present]:
        kube.delete(CustomResourceDefinition, name)


@dataclass
class PulumiCLI:
    env: dict[str, str]
    backend: Path

    def run(self, *args: str, cwd: Path | str = REPO, check: bool = True, timeout: float = 900,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["pulumi", *args], cwd=cwd, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} exited {proc.returncode}\n--- stdout ---\n"
                                 f"{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
        return proc


@pytest.fixture(scope="session")
def pulumi_cli(tmp_path_factory):
    """The real Pulumi CLI (built by scripts/toolchain.sh), offline, with a throwaway file backend."""
    env = tool_env()
    backend = tmp_path_factory.mktemp("pulumi-state")
    env.update(PULUMI_BACKEND_URL=f"file://{backend}", PULUMI_CONFIG_PASSPHRASE="corral-tests")
    found = subprocess.run(["bash", "-c", "command -v pulumi pulumi-language-python pulumi-resource-kubernetes"],
                           env=env, capture_output=True, text=True)
    if found.returncode != 0:
        pytest.fail("the Pulumi CLI, its Python language host or the kubernetes provider is missing: "
                    "run scripts/toolchain.sh pulumi k8s-provider (or scripts/setup.sh)", pytrace=False)
    return PulumiCLI(env=env, backend=backend)


@pytest.fixture
def project(tmp_path):
    """A copy of the project's Pulumi files, so an engine test's stack state never touches the repository."""
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "stacks", tmp_path / "stacks")
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    return tmp_path
