"""Every stack file parses into the typed config, bad keys are named, and each stack's program builds under mocks."""

import json
from pathlib import Path

import pulumi
import pytest
import yaml
from pulumi_mocks import MOCKS as mocks
from pulumi_mocks import install

from corral.components.config import ConfigError, StackConfig, parse_stack_config
from corral.components.stack import build

REPO = Path(__file__).resolve().parents[2]  # not `from conftest import`: several conftest.py shadow each other
STACKS = sorted((REPO / "stacks").glob("Pulumi.*.yaml"))


def stack_config(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["config"]


def test_there_are_local_dev_and_prod_stacks():
    assert {p.name for p in STACKS} >= {"Pulumi.local.yaml", "Pulumi.dev.yaml", "Pulumi.prod.yaml"}


@pytest.mark.parametrize("path", STACKS, ids=lambda p: p.name)
def test_stack_file_parses(path):
    cfg = parse_stack_config(stack_config(path))
    assert isinstance(cfg, StackConfig) and cfg.templates


def test_local_is_docker_and_dev_is_kubernetes():
    assert parse_stack_config(stack_config(REPO / "stacks/Pulumi.local.yaml")).mode == "docker"
    assert parse_stack_config(stack_config(REPO / "stacks/Pulumi.dev.yaml")).mode == "kubernetes"


def test_misspelled_key_is_named_with_a_suggestion():
    raw = {**stack_config(REPO / "stacks/Pulumi.dev.yaml")}
    raw["corral:warmPool"] = raw.pop("corral:warmPools")
    with pytest.raises(ConfigError) as exc:
        parse_stack_config(raw)
    assert "corral:warmPool: unknown config key (did you mean corral:warmPools?)" in str(exc.value)


def test_nested_errors_name_the_path():
    raw = {**stack_config(REPO / "stacks/Pulumi.dev.yaml")}
    raw["corral:warmPools"] = [{"name": "p", "template": "python", "replicas": 5000}]
    with pytest.raises(ConfigError, match=r"corral:warmPools\[0\]\.replicas"):
        parse_stack_config(raw)
    raw["corral:warmPools"] = [{"name": "p", "template": "nope"}]
    with pytest.raises(ConfigError, match=r"no template named 'nope'"):
        parse_stack_config(raw)
    with pytest.raises(ConfigError, match=r"corral:kubernetes\.namspace: unknown key"):
        parse_stack_config({"corral:kubernetes": {"namspace": "x"}})


def test_values_from_the_engine_arrive_as_json_strings():
    import json

    dev = stack_config(REPO / "stacks/Pulumi.dev.yaml")
    raw = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in dev.items()}
    assert parse_stack_config(raw).warm_pools[0].replicas == 2


def test_other_namespaces_are_ignored():
    assert parse_stack_config({"kubernetes:context": "kind"}).mode == "docker"


@pytest.fixture(autouse=True)
def fresh_mocks():
    install()


def run_program(cfg):
    """Run the stack's program under mocks until every registration has finished."""

    @pulumi.runtime.test
    def program():
        build(cfg)

    program()
    return mocks


def test_dev_stack_program_builds():
    cfg = parse_stack_config(stack_config(REPO / "stacks/Pulumi.dev.yaml"))
    run_program(cfg)
    types = [r.typ for r in mocks.resources]
    assert types.count("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition") == 8  # Corral's 6 + kopf's 2
    assert types.count("corral:index:ControllerDeployment") == 1
    (chart,) = mocks.of_type("kubernetes:helm.sh/v4:Chart")
    assert chart.inputs["values"]["sandboxNamespaces"] == ["corral-sandboxes"]
    assert chart.inputs["values"]["resources"]["limits"]["memory"] == cfg.controller.values.resources.limits.memory
    assert types.count("kubernetes:corral.dev/v1alpha1:SandboxTemplate") == len(cfg.templates)
    assert types.count("kubernetes:corral.dev/v1alpha1:WarmPool") == len(cfg.warm_pools)
    assert types.count("kubernetes:corral.dev/v1alpha1:Pool") == len(cfg.pools)
    assert types.count("kubernetes:core/v1:Namespace") == 2  # sandboxes' and the operator's
    (node,) = [r for r in mocks.of_type("kubernetes:corral.dev/v1alpha1:WarmPool") if r.name == "node-warmpool"]
    assert node.inputs["spec"]["updateStrategy"] == {"type": "Recreate"}
    assert node.inputs["metadata"]["namespace"] == "corral-sandboxes"


def test_prod_stack_program_builds_with_an_explicit_provider():
    cfg = parse_stack_config(stack_config(REPO / "stacks/Pulumi.prod.yaml"))
    run_program(cfg)
    (provider,) = mocks.of_type("pulumi:providers:kubernetes")
    assert provider.inputs.get("context") == "prod"
    k8s_resources = [r for r in mocks.resources if r.custom and r.typ.startswith("kubernetes:")]
    assert len(k8s_resources) >= 8
    for r in k8s_resources:
        assert r.provider and "pulumi:providers:kubernetes::kubernetes" in r.provider, r.name
    (wp,) = mocks.of_type("kubernetes:corral.dev/v1alpha1:WarmPool")
    assert wp.inputs["spec"]["replicas"] == 50


def test_local_stack_program_builds():
    cfg = parse_stack_config(stack_config(REPO / "stacks/Pulumi.local.yaml"))
    run_program(cfg)
    (component,) = mocks.of_type("corral:index:DockerStack")
    dynamic = mocks.of_type("pulumi-python:dynamic:Resource")
    names = {r.name for r in dynamic}
    assert {"corral-operator", "corral-operator-image", "corral-state", "corral-pools-file", "corral-sweeper",
            "corral-api-token"} <= names
    assert {f"corral-net-{t.name}" for t in cfg.templates} <= names
    (operator,) = [r for r in dynamic if r.name == "corral-operator"]
    assert operator.inputs["api_port"] == cfg.docker.api_port
    assert operator.inputs["image"].startswith("corral/operator:")
    (pools_file,) = [r for r in dynamic if r.name == "corral-pools-file"]
    desired = json.loads(pools_file.inputs["content"])
    assert [(p["kind"], p["metadata"]["name"], p["spec"]["replicas"]) for p in desired["warm_pools"]] == \
        [("WarmPool", "python", 2)]  # the resource model's own objects (corral.api)
    assert [t["name"] for t in desired["templates"]] == [t.name for t in cfg.templates]
    assert all(t["user"] != "0:0" and t["pids_limit"] > 0 for t in desired["templates"])


def test_docker_config_knows_internal_networks():
    cfg = parse_stack_config({"corral:templates": '[{"name": "shell", "catalogue": "shell"}]',
                              "corral:docker": '{"apiPort": 7781, "internalNetworks": ["shell"]}'})
    assert cfg.docker.internal_networks == ["shell"]
    with pytest.raises(ConfigError, match="internalNetworks"):
        parse_stack_config({"corral:docker": '{"internalNetworks": ["nope"]}'})
    with pytest.raises(ConfigError, match="corral:docker.bogus"):
        parse_stack_config({"corral:docker": '{"bogus": 1}'})
