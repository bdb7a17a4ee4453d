"""The component provider (corral.components.provider) mirrors the Python components: same components, same args
(names, required ones, plain or Input, enum values, docstrings), same outputs; its schema says so; it constructs
the Python components themselves. A change to one side without the other fails here."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import typing
from enum import Enum

import pulumi
import pytest
from pulumi.provider.experimental.analyzer import is_input
from pulumi.provider.experimental.util import camel_case
from pulumi_mocks import MOCKS as mocks
from pulumi_mocks import install

import corral.components as components
from corral.api import Capacity
from corral.components import provider as P
from corral.components import resources
from corral.components.provider import describe
from corral.operator.docker import desired as docker_desired

NAMES = sorted(P.PYTHON_COMPONENTS)


def docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a class (the string right after an annotated attribute), tidied like the schema's."""
    out: dict[str, str] = {}
    (node,) = ast.parse(inspect.cleandoc("\n" + inspect.getsource(cls))).body
    body = node.body
    for stmt, nxt in zip(body, body[1:], strict=False):
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr) \
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            out[stmt.target.id] = describe(nxt.value.value)
    return out


def own_annotations(cls: type) -> list[str]:
    return [k for k in inspect.get_annotations(cls) if not k.startswith("_")]


def unwrapped(annotation):
    """A mirror's annotation without NotRequired/Optional."""
    while typing.get_origin(annotation) in (typing.NotRequired, typing.Union) and not is_input(annotation):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return annotation


def mirror_args(name: str) -> type:
    return inspect.get_annotations(getattr(P, name).__init__)["args"]


def required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def test_every_public_component_is_in_the_provider():
    public = {n for n in components.__all__ if isinstance(getattr(components, n), type)
              and issubclass(getattr(components, n), pulumi.ComponentResource)}
    assert {c.__name__ for c in P.COMPONENTS} == public == set(NAMES)
    for c in P.COMPONENTS:
        core, _ = P.PYTHON_COMPONENTS[c.__name__]
        assert c.__mro__[1] is core and core is getattr(components, c.__name__)


@pytest.mark.parametrize("name", NAMES)
def test_args_mirror_the_python_args(name):
    core, core_args = P.PYTHON_COMPONENTS[name]
    mirror = mirror_args(name)
    fields = dataclasses.fields(core_args)
    assert list(mirror.__annotations__) == [f.name for f in fields]
    assert set(mirror.__required_keys__) == {f.name for f in fields if required(f)}
    # Every field is documented, and the same way on both sides.
    core_docs = docs(core_args)
    assert set(core_docs) == {f.name for f in fields}, f"undocumented: {set(f.name for f in fields) - set(core_docs)}"
    assert docs(mirror) == core_docs
    assert describe(mirror.__doc__) == describe(core_args.__doc__)
    # Plain in Python is plain in the schema; an Input stays an Input; a Literal is an enum of the same values.
    for f in fields:
        ours = unwrapped(mirror.__annotations__[f.name])
        assert ("pulumi.Input" in str(f.type)) == is_input(ours), f.name
        if str(f.type).startswith("Literal["):
            assert issubclass(ours, Enum), f.name
            assert [m.value for m in ours] == list(typing.get_args(eval(f.type, vars(typing)))), f.name


@pytest.mark.parametrize("name", NAMES)
def test_outputs_and_descriptions_mirror_the_python_component(name):
    core, _ = P.PYTHON_COMPONENTS[name]
    mirror = getattr(P, name)
    assert own_annotations(mirror) == own_annotations(core)
    assert set(docs(core)) == set(own_annotations(core)), "every output has a docstring"
    assert docs(mirror) == docs(core)
    assert describe(mirror.__doc__) == describe(core.__doc__)


def test_nested_types_mirror_the_models():
    fields = Capacity.model_fields
    assert list(P.Capacity.__annotations__) == list(fields)
    assert set(P.Capacity.__required_keys__) == {k for k, f in fields.items() if f.is_required()}
    # The DockerStack's flat pools: the pools file builds corral.api WarmPool/Pool objects from these arguments.
    for mirror, build in ((P.DockerWarmPool, docker_desired.warm_pool), (P.DockerPool, docker_desired.pool)):
        params = inspect.signature(build).parameters
        hints = typing.get_type_hints(build)
        assert list(mirror.__annotations__) == list(params), mirror.__name__
        assert set(mirror.__required_keys__) == {k for k, p in params.items() if p.default is p.empty}, mirror.__name__
        for key in params:
            literal = [a for a in typing.get_args(hints[key]) if typing.get_origin(a) is typing.Literal]
            if literal:
                ours = unwrapped(mirror.__annotations__[key])
                assert [m.value for m in ours] == list(typing.get_args(literal[0])), key
    assert docs(P.Capacity) == {k: f.description for k, f in Capacity.model_fields.items()}
    assert describe(P.Capacity.__doc__) == describe(Capacity.__doc__)


def test_schema_lists_each_component_with_typed_inputs_outputs_and_descriptions():
    schema = P.schema()
    assert schema["name"] == "corral" and schema["version"] == components.__version__
    assert sorted(schema["resources"]) == [f"corral:index:{n}" for n in NAMES]
    for name in NAMES:
        core, core_args = P.PYTHON_COMPONENTS[name]
        res = schema["resources"][f"corral:index:{name}"]
        assert res["isComponent"] and res["description"] == describe(core.__doc__)
        fields = dataclasses.fields(core_args)
        core_docs = docs(core_args)
        assert res["inputProperties"] == {
            camel_case(f.name): {**res["inputProperties"][camel_case(f.name)], "description": core_docs[f.name]}
            for f in fields}
        assert sorted(res.get("requiredInputs", [])) == sorted(camel_case(f.name) for f in fields if required(f))
        assert all("type" in p or "$ref" in p for p in res["inputProperties"].values())
        assert {k: v["description"] for k, v in res["properties"].items()} == {
            camel_case(k): v for k, v in docs(core).items()}
    wp = schema["resources"]["corral:index:WarmPool"]["inputProperties"]
    assert wp["replicas"] == {"type": "integer", "plain": True, "description": docs(resources.WarmPoolArgs)["replicas"]}
    assert wp["template"]["type"] == "string" and "plain" not in wp["template"]  # takes a template's `name` output
    assert wp["updateStrategy"]["$ref"] == "#/types/corral:index:UpdateStrategy"
    assert [e["value"] for e in schema["types"]["corral:index:UpdateStrategy"]["enum"]] == ["OnReplenish", "Recreate"]
    pool = schema["resources"]["corral:index:Pool"]["inputProperties"]
    assert pool["capacity"]["$ref"] == "#/types/corral:index:Capacity"
    assert set(schema["types"]["corral:index:Capacity"]["properties"]) == {"bufferMin", "bufferMax", "poolMin",
                                                                            "poolMax"}
    stack = schema["resources"]["corral:index:DockerStack"]["inputProperties"]
    assert stack["warmPools"]["items"]["$ref"] == "#/types/corral:index:DockerWarmPool"


def constructed(name: str, typ: str, inputs: dict):
    """What the provider's Construct does with inputs from another language; returns once every child registered."""
    install()
    out: dict = {}

    @pulumi.runtime.test
    def program():
        out["result"] = P.provider().construct(name, typ, inputs, None)

    program()
    return out["result"]


def value(output):
    return pulumi.runtime.sync_await._sync_await(output.future())


def test_construct_builds_the_python_component_from_schema_inputs():
    """What another language sends (camelCase names, numbers as floats, enum values as strings) becomes the Python
    component itself: one corral:index:Pool, its Pool custom resource, and outputs named as in the schema."""
    result = constructed("elastic", "corral:index:Pool", {
        "template": "python", "namespace": "sbx", "recycleStrategy": "Restart", "maxUnavailable": 2.0,
        "capacity": {"bufferMin": 1.0, "bufferMax": 3.0, "poolMax": 5.0}})
    assert [r.typ for r in mocks.resources if r.typ.startswith("corral:index:")] == ["corral:index:Pool"]
    (cr,) = mocks.of_type("kubernetes:corral.dev/v1alpha1:Pool")
    assert cr.inputs["spec"] == {"templateRef": {"name": "python"}, "recycleStrategy": "Restart", "maxUnavailable": 2,
                                 "capacity": {"bufferMin": 1, "bufferMax": 3, "poolMin": 0, "poolMax": 5},
                                 "readinessGraceSeconds": 300}
    assert cr.inputs["metadata"]["namespace"] == "sbx"
    assert set(result.state) == {"name", "namespace", "status"}
    assert (value(result.state["name"]), value(result.state["namespace"])) == ("elastic", "sbx")


def test_construct_rejects_a_bad_enum_value_with_its_path():
    from pulumi.errors import InputPropertyError

    p = P.provider()
    with pytest.raises(InputPropertyError, match="UpdateStrategy"):
        p.construct("w", "corral:index:WarmPool", {"template": "t", "updateStrategy": "Sometimes"}, None)


def test_chart_values_are_typed_in_the_schema_from_the_values_model():
    """ControllerDeployment's `values` is OperatorValues, generated from the pydantic model: every field of every
    nested model, typed, with the model's description; Literals become enums."""
    from corral.components.controller_values import OperatorValues

    schema = P.schema()
    values = schema["resources"]["corral:index:ControllerDeployment"]["inputProperties"]["values"]
    assert values["$ref"] == "#/types/corral:index:OperatorValues"

    def check(model, type_name):
        props = schema["types"][f"corral:index:{type_name}"]["properties"]
        assert set(props) == {f.alias for f in model.model_fields.values()}, type_name
        for name, f in model.model_fields.items():
            assert props[f.alias]["description"] == describe(f.description), (type_name, name)
            annotation = typing.get_args(f.annotation)[0] if typing.get_origin(f.annotation) else f.annotation
            if isinstance(annotation, type) and issubclass(annotation, OperatorValues.__mro__[1]):
                assert props[f.alias]["$ref"] == f"#/types/corral:index:{annotation.__name__}"
                check(annotation, annotation.__name__)

    check(OperatorValues, "OperatorValues")
    assert [e["value"] for e in schema["types"]["corral:index:LogLevel"]["enum"]] == ["debug", "info", "warning",
                                                                                     "error"]


def test_controller_deployment_takes_schema_values_and_validates_them():
    result = constructed("corral", "corral:index:ControllerDeployment", {
        "namespace": "ops", "releaseName": "sandboxes", "installCrds": False,
        "values": {"replicas": 2.0, "logLevel": "debug", "peering": {"enabled": True},
                   "image": {"pullPolicy": "Never", "tag": "dev"}, "metrics": {"port": 9191.0}},
        "rawValues": {"workers": 8}})
    (chart,) = mocks.of_type("kubernetes:helm.sh/v4:Chart")
    values = chart.inputs["values"]
    assert (values["replicas"], values["logLevel"], values["workers"]) == (2, "debug", 8)
    assert values["image"]["pullPolicy"] == "Never" and values["image"]["tag"] == "dev"
    assert chart.inputs["namespace"] == "ops"
    assert not mocks.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
    assert [r.typ for r in mocks.resources if r.typ.startswith("corral:index:")] == [
        "corral:index:ControllerDeployment"]
    assert set(result.state) == {"namespace", "serviceName", "metricsEndpoint", "apiEndpoint", "apiToken"}
    assert value(result.state["metricsEndpoint"]) == "http://sandboxes-corral.ops.svc:9191/metrics"


def test_controller_deployment_rejects_bad_values_naming_the_field():
    p = P.provider()
    with pytest.raises(Exception, match="replicas"):
        p.construct("corral", "corral:index:ControllerDeployment", {"values": {"replicas": 3.0,
                                                                              "peering": {"enabled": False}}}, None)
