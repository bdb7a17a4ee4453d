"""engine tier: `pulumi package get-schema` (the real CLI, through the Python language host's RunPlugin) on Corral's
component provider returns the five components with their inputs, outputs and descriptions, exactly as the Python
components' args dataclasses and docstrings define them: the provider cannot drift from the Python API."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
from pathlib import Path

import pytest

import corral.components as components
from corral.components.provider import describe
from pulumi.provider.experimental.util import camel_case

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name
PROVIDER = REPO / "components" / "provider"
FIVE = ["ControllerDeployment", "DockerStack", "Pool", "SandboxTemplate", "WarmPool"]

pytestmark = pytest.mark.engine


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstrings under a class's annotated attributes, as the schema words them."""
    (node,) = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls))).body
    return {a.target.id: describe(b.value.value) for a, b in zip(node.body, node.body[1:])
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
