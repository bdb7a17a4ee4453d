"""The example programs in examples/ build under pulumi.runtime.Mocks; their resource graphs are asserted: types,
parents, and the host program's own Kubernetes provider reaching every Kubernetes resource Corral creates."""

from __future__ import annotations

import runpy
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pytest
import yaml
from pulumi_mocks import install

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name
EXAMPLES = REPO / "examples"


@dataclass
class Node:
    urn: str
    type: str
    name: str
    parent: str
    provider: str
    custom: bool


class Graph:
    """Every registration the program makes, with its parent and provider (the mock monitor's own view)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        monitor = pulumi.runtime.settings.get_monitor()
        register = monitor.RegisterResource

        def record(request):
            response = register(request)
            self.nodes.append(Node(response.urn, request.type, request.name, request.parent, request.provider,
                                   request.custom))
            return response

        monitor.RegisterResource = record

    def by_urn(self, urn: str) -> Node:
        return next(n for n in self.nodes if n.urn == urn)

    def named(self, typ: str, name: str) -> Node:
        (node,) = [n for n in self.nodes if n.type == typ and n.name == name]
        return node

    def ancestors(self, node: Node) -> list[Node]:
        out = []
        while node.parent and "::pulumi:pulumi:Stack::" not in node.parent:
            node = self.by_urn(node.parent)
            out.append(node)
        return out

    def under(self, component: Node) -> list[Node]:
        """Everything registered below a component (children, grandchildren, ...)."""
        return [n for n in self.nodes if component in self.ancestors(n)]


def run_example(name: str) -> tuple[Graph, dict]:
    """Run an example's __main__.py under mocks; returns once every registration (children included) is done."""
    project = yaml.safe_load((EXAMPLES / name / "Pulumi.yaml").read_text())["name"]
    install(stack="dev", project=project)
    graph = Graph()
    result: dict = {}

    @pulumi.runtime.test
    def program():
        result.update(runpy.run_path(str(EXAMPLES / name / "__main__.py"), run_name="__main__"))

    program()
    return graph, result


def value(output: pulumi.Output):
    """An output's value (after run_example, every resource has answered)."""
    return pulumi.runtime.sync_await._sync_await(output.future())


@pytest.mark.parametrize("name", ["existing-stack", "docker-only"])
def test_each_example_is_its_own_pulumi_project_on_the_repositorys_venv(name):
    project = yaml.safe_load((EXAMPLES / name / "Pulumi.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    venv = (EXAMPLES / name / project["runtime"]["options"]["virtualenv"]).resolve()
    assert venv == REPO / ".venv"
    assert project["name"] != yaml.safe_load((REPO / "Pulumi.yaml").read_text())["name"]


def test_existing_stack_example_corral_joins_through_the_programs_provider():
    graph, program = run_example("existing-stack")
    provider = graph.named("pulumi:providers:kubernetes", "platform-cluster")
    # The host's own resources are there, top level, on its provider.
    for typ, name in [("kubernetes:core/v1:Namespace", "platform-apps"),
                      ("kubernetes:core/v1:ConfigMap", "platform-settings")]:
        node = graph.named(typ, name)
        assert graph.ancestors(node) == [] and node.provider.startswith(provider.urn + "::")
    # Corral's components: the operator, one template, one warm pool, all top level in the host program.
    controller = graph.named("corral:index:ControllerDeployment", "corral")
    template = graph.named("corral:index:SandboxTemplate", "python")
    warm = graph.named("corral:index:WarmPool", "python-warm")
    assert [graph.ancestors(c) for c in (controller, template, warm)] == [[], [], []]
    assert not [n for n in graph.nodes if n.type in ("corral:index:Pool", "corral:index:DockerStack")]
    # Each component's Kubernetes resources are its children.
    assert [n.type for n in graph.under(template)] == ["kubernetes:corral.dev/v1alpha1:SandboxTemplate"]
    assert [n.type for n in graph.under(warm)] == ["kubernetes:corral.dev/v1alpha1:WarmPool"]
    under_controller = {n.type for n in graph.under(controller)}
    assert {"kubernetes:core/v1:Namespace", "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition",
            "kubernetes:helm.sh/v4:Chart"} <= under_controller
    # The program's provider reaches every Kubernetes resource (custom, or a remote component like the chart):
    # none falls back to a default provider.
    kube = [n for n in graph.nodes if n.type.startswith("kubernetes:")]
    assert len(kube) >= 9
    strays = [(n.type, n.name, n.provider) for n in kube if not n.provider.startswith(provider.urn + "::")]
    assert not strays, strays
    assert [n.name for n in graph.nodes if n.type == "pulumi:providers:kubernetes"] == ["platform-cluster"]
    # Outputs compose: the warm pool names the template's Kubernetes name, in the sandbox namespace.
    spec, meta = value(program["warm"].resource.spec), value(program["warm"].resource.metadata)
    assert spec["templateRef"] == {"name": "python"} and spec["replicas"] == 2
    assert meta["namespace"] == "agent-sandboxes"


def test_docker_only_example_is_one_docker_stack_and_nothing_of_kubernetes():
    graph, program = run_example("docker-only")
    (stack,) = [n for n in graph.nodes if n.type.startswith("corral:index:")]
    assert (stack.type, stack.name, graph.ancestors(stack)) == ("corral:index:DockerStack", "sandboxes", [])
    children = graph.under(stack)
    assert {n.type for n in children} == {"pulumi-python:dynamic:Resource"}
    assert {n.name for n in children} == {"sandboxes-net-shell", "sandboxes-operator", "sandboxes-operator-image",
                                          "sandboxes-pools-file", "sandboxes-state", "sandboxes-sweeper",
                                          "sandboxes-api-token"}
    assert all(graph.by_urn(n.parent) == stack for n in children)
    assert not [n for n in graph.nodes if n.type.startswith("kubernetes:") or "providers:kubernetes" in n.type]
    assert value(program["stack"].networks) == ["corral-example-dev-shell"]
