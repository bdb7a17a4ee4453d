"""engine tier: examples/existing-stack with the real Pulumi CLI on the local cluster. Corral (operator, a sandbox
namespace, one template, one warm pool) comes up next to the host program's own namespace and ConfigMap, through the
host's own Kubernetes provider only; `pulumi destroy --target <Corral> --target-dependents` then removes exactly
Corral's resources: the host's objects stay, untouched, as the API server shows."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from engineutil import gone
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import ConfigMap, Namespace

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name
EXAMPLE = REPO / "examples" / "existing-stack"
PROJECT = "corral-example-existing-stack"
STACK = "dev"

pytestmark = pytest.mark.engine

SandboxTemplate = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxTemplate", "sandboxtemplates")
WarmPool = create_namespaced_resource("corral.dev", "v1alpha1", "WarmPool", "warmpools")
CORRAL_CRDS = {"sandboxtemplates.corral.dev", "sandboxes.corral.dev", "warmpools.corral.dev", "pools.corral.dev",
               "sandboxclaims.corral.dev", "sandboxbatches.corral.dev"}
CORRAL_NAMESPACES = ("corral-system", "agent-sandboxes")


def urn(typ: str, name: str) -> str:
    return f"urn:pulumi:{STACK}::{PROJECT}::{typ}::{name}"


def wait_gone(kube, res, name: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not gone(kube, res, name):
        assert time.monotonic() < deadline, f"{res.__name__} {name} still exists"
        time.sleep(0.5)


def test_existing_stack_example_up_and_removing_corral_leaves_the_host_program(pulumi_cli, kube_cluster, kube,
                                                                                tmp_path):
    leftovers = CORRAL_CRDS & {c.metadata.name for c in kube.list(CustomResourceDefinition)}
    assert not leftovers, f"Corral CRDs already on the cluster (left by another run?): {leftovers}"
    for ns in ("platform-apps", *CORRAL_NAMESPACES):
        assert gone(kube, Namespace, ns), f"namespace {ns} already exists"
    # A copy of the example (its stack config stays out of the repository), on the repository's venv as in a clone.
    work = tmp_path / "examples" / "existing-stack"
    shutil.copytree(EXAMPLE, work)
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    # The host program's provider gets the cluster from config; a default provider would find no cluster at all.
    env = {"KUBECONFIG": str(tmp_path / "no-such-kubeconfig")}
    run = lambda *a, **kw: pulumi_cli.run(*a, cwd=work, env=env, **kw)  # noqa: E731
    run("stack", "init", STACK, "--non-interactive")
    try:
        run("config", "set", "kubeconfig", kube_cluster.kubeconfig, "--stack", STACK)
        run("up", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview")
        out = json.loads(run("stack", "output", "--stack", STACK, "--json").stdout)
        assert out["corralNamespace"] == "corral-system" and out["warmPool"] == "python-warm"
        assert out["claimsApi"].startswith("http://corral-api.corral-system.svc:")  # the active replica only

        # Both programs' objects are on the cluster.
        settings = kube.get(ConfigMap, "platform-settings", namespace="platform-apps")
        assert settings.data == {"owner": "platform-team"}
        assert CORRAL_CRDS <= {c.metadata.name for c in kube.list(CustomResourceDefinition)}
        assert [d.metadata.name for d in kube.list(Deployment, namespace="corral-system")] == ["corral"]
        assert kube.get(WarmPool, "python-warm", namespace="agent-sandboxes")["spec"]["templateRef"] == {
            "name": "python"}
        assert kube.get(SandboxTemplate, "python", namespace="agent-sandboxes")

        # Remove Corral only: its operator component and its sandbox namespace, with everything depending on them.
        run("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview", "--target-dependents",
            "--target", urn("corral:index:ControllerDeployment", "corral"),
            "--target", urn("kubernetes:core/v1:Namespace", "agent-sandboxes"))
        for ns in CORRAL_NAMESPACES:
            wait_gone(kube, Namespace, ns)
        assert not (CORRAL_CRDS & {c.metadata.name for c in kube.list(CustomResourceDefinition)})
        assert not [c.metadata.name for c in kube.list(CustomResourceDefinition) if "kopf" in c.metadata.name]

        # The host program's objects are still there, the very same objects (not recreated), not terminating.
        apps = kube.get(Namespace, "platform-apps")
        assert apps.metadata.deletionTimestamp is None and apps.status.phase == "Active"
        still = kube.get(ConfigMap, "platform-settings", namespace="platform-apps")
        assert (still.metadata.uid, still.data) == (settings.metadata.uid, {"owner": "platform-team"})
        # ... and the stack holds exactly them (plus default providers of no Kubernetes kind, which own nothing).
        state = json.loads(run("stack", "export", "--stack", STACK).stdout)
        kept = {r["urn"] for r in state["deployment"]["resources"] if r["type"] != "pulumi:pulumi:Stack"
                and not (r["type"].startswith("pulumi:providers:pulumi") and "::default" in r["urn"])}
        assert kept == {urn("pulumi:providers:kubernetes", "platform-cluster"),
                        urn("kubernetes:core/v1:Namespace", "platform-apps"),
                        urn("kubernetes:core/v1:ConfigMap", "platform-settings")}, kept
    finally:
        run("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview", check=False)
        run("stack", "rm", STACK, "--yes", "--force", "--non-interactive", check=False)
    wait_gone(kube, Namespace, "platform-apps")


def test_docker_only_example_serves_claims_and_destroy_leaves_nothing(pulumi_cli, docker_client, tmp_path):
    """examples/docker-only with the real CLI on the real Docker Engine: its own stack label and port, a warm claim
    runs a command, destroy removes every container, network and volume of its stack."""
    import httpx

    from corral.operator.docker.image import ensure_image

    ensure_image()  # what scripts/setup.sh did; a cache hit normally
    label = "corral.dev/stack=example-dev"

    def leftovers() -> list[str]:
        return ([c.name for c in docker_client.containers.list(all=True, filters={"label": label})]
                + [n.name for n in docker_client.networks.list(filters={"label": label})]
                + [v.name for v in docker_client.volumes.list(filters={"label": label})])

    assert not leftovers(), f"stack example-dev already has Docker objects: {leftovers()}"
    work = tmp_path / "examples" / "docker-only"
    shutil.copytree(REPO / "examples" / "docker-only", work)
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    env = {"CORRAL_CACHE": str(tmp_path / "cache")}  # the pools file goes under here
    run = lambda *a, **kw: pulumi_cli.run(*a, cwd=work, env=env, **kw)  # noqa: E731
    run("stack", "init", STACK, "--non-interactive")
    try:
        run("up", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview")  # no config: the defaults
        out = json.loads(run("stack", "output", "--stack", STACK, "--json", "--show-secrets").stdout)
        assert out["apiUrl"] == "http://127.0.0.1:7790"
        with httpx.Client(base_url=out["apiUrl"], headers={"Authorization": f"Bearer {out['apiToken']}"},
                          timeout=120) as http:
            claim = http.post("/v1/claims", json={"pool": "shell", "name": "hello"})
            assert claim.status_code == 201, claim.text
            r = http.post("/v1/claims/hello/execd/v1/command", json={"command": "echo $((6*7))"})
            assert r.status_code == 200 and r.json()["stdout"] == "42\n", r.text
        run("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview")
        assert not leftovers(), leftovers()
    finally:
        run("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview", check=False)
        run("stack", "rm", STACK, "--yes", "--force", "--non-interactive", check=False)
