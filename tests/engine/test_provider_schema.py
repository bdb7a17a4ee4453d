"""engine tier: Corral's component provider with the real Pulumi CLI.

`pulumi package get-schema` (through the Python language host's RunPlugin) returns the five components with their
inputs, outputs and descriptions, exactly as the Python components' args dataclasses and docstrings define them: the
provider cannot drift from the Python API. And the path every other language takes: `pulumi package add` generates
an SDK from that schema and records the provider in Pulumi.yaml; a program using the SDK runs `pulumi up` on the
local cluster, the engine constructs the components in the provider, and the objects appear on the API server."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from engineutil import wait_namespace_gone
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from pulumi.provider.experimental.util import camel_case

import corral.components as components
from corral.components.provider import describe

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name
PROVIDER = REPO / "components" / "provider"
FIVE = ["ControllerDeployment", "DockerStack", "Pool", "SandboxTemplate", "WarmPool"]

pytestmark = pytest.mark.engine


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under a class's annotated attributes, as the schema words them."""
    (node,) = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls))).body
    return {a.target.id: describe(b.value.value) for a, b in zip(node.body, node.body[1:], strict=False)
            if isinstance(a, ast.AnnAssign) and isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)}


def python_args(component: type) -> type:
    """The args dataclass of a Python component (its __init__'s `args` annotation, resolved in its module)."""
    annotation = inspect.signature(component.__init__).parameters["args"].annotation
    name = annotation if isinstance(annotation, str) else annotation.__name__
    return vars(inspect.getmodule(component))[name.split(" ")[0]]


def test_get_schema_lists_the_five_components_as_the_python_api_defines_them(pulumi_cli, tmp_path):
    proc = pulumi_cli.run("package", "get-schema", str(PROVIDER), cwd=tmp_path)
    schema = json.loads(proc.stdout)
    assert (schema["name"], schema["version"]) == ("corral", components.__version__)
    assert sorted(schema["resources"]) == [f"corral:index:{n}" for n in FIVE]
    for name in FIVE:
        component = getattr(components, name)
        args = python_args(component)
        fields = {camel_case(f.name): f for f in dataclasses.fields(args)}
        docs = attribute_docs(args)
        res = schema["resources"][f"corral:index:{name}"]
        assert res["isComponent"] is True
        assert res["description"] == describe(component.__doc__)
        # Inputs: every field of the args dataclass, typed, with its docstring; required exactly when it has no default.
        assert sorted(res["inputProperties"]) == sorted(fields), name
        for key, f in fields.items():
            prop = res["inputProperties"][key]
            assert prop["description"] == docs[f.name], (name, key)
            assert "type" in prop or "$ref" in prop, (name, key)
        required = [k for k, f in fields.items()
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        assert sorted(res.get("requiredInputs", [])) == sorted(required), name
        # Outputs: the component's annotated outputs, with their docstrings.
        outputs = attribute_docs(component)
        assert {k: v["description"] for k, v in res["properties"].items()} == {
            camel_case(k): v for k, v in outputs.items()}, name
    # A few types as another language sees them.
    types = schema["types"]
    assert [e["value"] for e in types["corral:index:RecycleStrategy"]["enum"]] == ["Delete", "Restart", "Noop"]
    pool = schema["resources"]["corral:index:Pool"]["inputProperties"]
    assert pool["capacity"]["$ref"] == "#/types/corral:index:Capacity"
    assert types["corral:index:Capacity"]["properties"]["bufferMin"]["type"] == "integer"
    assert schema["resources"]["corral:index:WarmPool"]["inputProperties"]["replicas"]["type"] == "integer"


SandboxTemplate = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxTemplate", "sandboxtemplates")
WarmPool = create_namespaced_resource("corral.dev", "v1alpha1", "WarmPool", "warmpools")

# A program that knows Corral only through the SDK generated from the provider's schema (as a TypeScript or Go
# program would), with typed args: nested types, enums, and one component's output feeding another.
CONSUMER = """
import pulumi
import pulumi_corral as corral
import pulumi_kubernetes as k8s

sandboxes = k8s.core.v1.Namespace("remote-sandboxes", metadata={"name": "remote-sandboxes"})
controller = corral.ControllerDeployment("corral", namespace="remote-system",
                                         values=corral.OperatorValuesArgs(log_level=corral.LogLevel.DEBUG))
after = pulumi.ResourceOptions(depends_on=[controller])
template = corral.SandboxTemplate("shell", namespace=sandboxes.metadata.name, spec={
    "podTemplate": {"spec": {"containers": [{"name": "sandbox", "image": "corral/shell:bookworm"}]}}}, opts=after)
warm = corral.WarmPool("shell-warm", template=template.name, namespace=template.namespace, replicas=3,
                       update_strategy=corral.UpdateStrategy.RECREATE, opts=after)
pulumi.export("warmPool", warm.name)
pulumi.export("metrics", controller.metrics_endpoint)
"""


def test_package_add_then_a_program_uses_the_components_through_the_provider(pulumi_cli, kube_cluster, kube,
                                                                             tmp_path):
    assert not ({"warmpools.corral.dev"} & {c.metadata.name for c in kube.list(CustomResourceDefinition)}), \
        "Corral CRDs already on the cluster (left by another run?)"
    work = tmp_path / "consumer"
    work.mkdir()
    (work / "Pulumi.yaml").write_text(yaml.safe_dump({
        "name": "corral-consumer", "runtime": {"name": "python", "options": {"virtualenv": str(REPO / ".venv")}}}))
    (work / "requirements.txt").write_text("pulumi\n")
    (work / "__main__.py").write_text(CONSUMER)
    env = {"KUBECONFIG": kube_cluster.kubeconfig}
    run = lambda *a, **kw: pulumi_cli.run(*a, cwd=work, env=env, **kw)  # noqa: E731

    added = run("package", "add", str(PROVIDER))
    assert "import pulumi_corral as corral" in added.stdout, added.stdout
    assert yaml.safe_load((work / "Pulumi.yaml").read_text())["packages"] == {"corral": str(PROVIDER)}
    assert (work / "requirements.txt").read_text().splitlines() == ["pulumi", "-e sdks/corral"]
    sdk = work / "sdks" / "corral"
    assert {"controller_deployment.py", "sandbox_template.py", "warm_pool.py", "pool.py", "docker_stack.py"} <= {
        p.name for p in (sdk / "pulumi_corral").iterdir()}
    # The SDK reads its version from package metadata: write it next to the sources instead of installing the SDK
    # into the repository's shared venv.
    subprocess.run([str(REPO / ".venv" / "bin" / "python"), "setup.py", "-q", "egg_info"], cwd=sdk, check=True,
                   capture_output=True)
    env["PYTHONPATH"] = str(sdk)

    run("stack", "init", "dev", "--non-interactive")
    try:
        run("up", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview")
        out = json.loads(run("stack", "output", "--stack", "dev", "--json").stdout)
        assert out == {"warmPool": "shell-warm", "metrics": "http://corral.remote-system.svc:9090/metrics"}
        state = json.loads(run("stack", "export", "--stack", "dev").stdout)["deployment"]["resources"]
        assert {r["type"] for r in state if r["type"].startswith("corral:index:")} == {
            "corral:index:ControllerDeployment", "corral:index:SandboxTemplate", "corral:index:WarmPool"}
        # What the components made, read back from the API server.
        (operator,) = kube.list(Deployment, namespace="remote-system")
        assert "--debug" in operator.spec.template.spec.containers[0].args
        warm = kube.get(WarmPool, "shell-warm", namespace="remote-sandboxes")
        assert warm["spec"]["templateRef"] == {"name": "shell"} and warm["spec"]["replicas"] == 3
        assert warm["spec"]["updateStrategy"] == {"type": "Recreate"}
        assert kube.get(SandboxTemplate, "shell", namespace="remote-sandboxes")["spec"]["podTemplate"]["spec"][
            "containers"][0]["image"] == "corral/shell:bookworm"

        run("destroy", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview")
        assert "warmpools.corral.dev" not in {c.metadata.name for c in kube.list(CustomResourceDefinition)}
        wait_namespace_gone(kube, "remote-system", 120)
    finally:
        run("destroy", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview", check=False)
        run("stack", "rm", "dev", "--yes", "--force", "--non-interactive", check=False)
