"""engine tier: examples/yaml, a Pulumi YAML program (`runtime: yaml`, pulumi-language-yaml v1.25.0) that reuses
Corral through the component provider: a ControllerDeployment, a SandboxTemplate and a WarmPool on the local
cluster, through preview, up, a second preview with no changes, and destroy.

Run as the README sets a machine up and nothing more: the test bed's tools on PATH, but neither the repository's venv
on PATH nor PULUMI_PYTHON_CMD, and the PATH's `python3` has no Corral (asserted first). The provider runs on the
Python named by its own PulumiPlugin.yaml, and so must the components' dynamic resources (ControllerDeployment's
tokens): they are served by the `corral` provider as `corral:dynamic:Resource`, not by the engine's
`pulumi-python` plugin, which would start that `python3`."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from engineutil import wait_namespace_gone
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Secret

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name
EXAMPLE = REPO / "examples" / "yaml"
STACK = "dev"

pytestmark = pytest.mark.engine

SandboxTemplate = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxTemplate", "sandboxtemplates")
WarmPool = create_namespaced_resource("corral.dev", "v1alpha1", "WarmPool", "warmpools")


def without_corral_python(env: dict[str, str]) -> dict[str, str]:
    """The test bed's environment minus every hint of the repository's Python: its venv off PATH, no
    PULUMI_PYTHON_CMD, no VIRTUAL_ENV."""
    venv_bin = str(REPO / ".venv" / "bin")
    env = {k: v for k, v in env.items() if k not in ("PULUMI_PYTHON_CMD", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p.rstrip("/") != venv_bin)
    return env


def types_of(state: list[dict]) -> list[str]:
    return [r["type"] for r in state]


def test_yaml_program_preview_up_no_change_destroy_through_the_provider(pulumi_cli, kube_cluster, kube, tmp_path):
    assert not ({"warmpools.corral.dev"} & {c.metadata.name for c in kube.list(CustomResourceDefinition)}), \
        "Corral CRDs already on the cluster (left by another run?)"
    env = without_corral_python(pulumi_cli.env)
    env["KUBECONFIG"] = kube_cluster.kubeconfig
    # Only the provider's own interpreter can run Corral here: `python3` on this PATH has neither it nor pulumi.
    probe = subprocess.run(["python3", "-c", "import corral.components, pulumi"], env=env, capture_output=True,
                           check=False)
    assert probe.returncode != 0, "python3 on PATH imports Corral: this test would not show which Python ran"
    cli = dataclasses.replace(pulumi_cli, env=env)

    # The example as checked in, beside a link to this checkout's components/ and .venv (its `packages` path and the
    # provider's `virtualenv` are relative), so its stack file stays out of the repository.
    work = tmp_path / "examples" / "yaml"
    shutil.copytree(EXAMPLE, work)
    (tmp_path / "components").symlink_to(REPO / "components")
    (tmp_path / ".venv").symlink_to(REPO / ".venv")

    def run(*a: str, **kw: Any) -> Any:
        return cli.run(*a, cwd=work, **kw)

    run("stack", "init", STACK, "--non-interactive")
    try:
        steps = json.loads(run("preview", "--stack", STACK, "--non-interactive", "--json").stdout)["steps"]
        created = [s["urn"].split("::")[-2].split("$")[-1] for s in steps if s["op"] == "create"]
        assert {"corral:index:ControllerDeployment", "corral:index:SandboxTemplate", "corral:index:WarmPool",
                "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition",
                "kubernetes:corral.dev/v1alpha1:WarmPool"} <= set(created), created
        # The two tokens, planned in the provider: no `pulumi-python` plugin is involved.
        assert created.count("corral:dynamic:Resource") == 2, created
        assert not [t for t in created if t.startswith("pulumi-python:")], created

        run("up", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview")
        out = json.loads(run("stack", "output", "--stack", STACK, "--json", "--show-secrets").stdout)
        assert out["warmPool"] == "python-warm"
        assert out["claimsApi"] == "http://corral-api.corral-system.svc:7780"
        assert json.loads(run("stack", "output", "--stack", STACK, "--json").stdout)["apiToken"] == "[secret]"
        state = json.loads(run("stack", "export", "--stack", STACK).stdout)["deployment"]["resources"]
        assert types_of(state).count("corral:dynamic:Resource") == 2
        assert not [t for t in types_of(state) if t.startswith("pulumi-python:")]
        tokens = [r for r in state if r["type"] == "corral:dynamic:Resource"]
        assert all(r["parent"].endswith("corral:index:ControllerDeployment::corral") for r in tokens), tokens
        assert all("ciphertext" in json.dumps(r["outputs"]["token"]) for r in tokens), "a token in plain text"

        # What the components made, read back from the API server: the token the provider generated is the one in
        # the operator's Secret, and the typed chart value reached the operator.
        secret = kube.get(Secret, "corral-tokens", namespace="corral-system")
        assert base64.b64decode(secret.data["api-token"]).decode() == out["apiToken"] and len(out["apiToken"]) >= 32
        (operator,) = kube.list(Deployment, namespace="corral-system")
        assert "--debug" in operator.spec.template.spec.containers[0].args
        warm = kube.get(WarmPool, "python-warm", namespace="yaml-sandboxes")
        assert warm["spec"]["templateRef"] == {"name": "python"} and warm["spec"]["replicas"] == 2
        assert warm["spec"]["updateStrategy"] == {"type": "Recreate"}
        template = kube.get(SandboxTemplate, "python", namespace="yaml-sandboxes")
        assert template["spec"]["podTemplate"]["spec"]["containers"][0]["image"] == "corral/python:bookworm"
        assert template["spec"]["envVarsInjectionPolicy"] == "Allowed"

        # Nothing drifts: the tokens keep their values, the chart renders the same.
        run("preview", "--stack", STACK, "--non-interactive", "--expect-no-changes", "--diff")

        run("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview")
        assert "warmpools.corral.dev" not in {c.metadata.name for c in kube.list(CustomResourceDefinition)}
        assert json.loads(run("stack", "export", "--stack", STACK).stdout)["deployment"].get("resources") in (None, [])
        wait_namespace_gone(kube, "corral-system", 120)
        wait_namespace_gone(kube, "yaml-sandboxes", 120)
    finally:
        run("destroy", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview", check=False)
        run("stack", "rm", STACK, "--yes", "--force", "--non-interactive", check=False)
