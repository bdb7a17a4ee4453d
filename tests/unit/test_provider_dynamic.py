"""Corral's dynamic resources inside the component provider (corral.components._dynamic, provider/_crud.py): renamed
to `corral:dynamic:Resource` only there, and their CRUD served by the provider's own servicer, secrets kept secret.
The engine tier runs the whole path from a YAML program (tests/engine/test_yaml_program.py)."""

from __future__ import annotations

import asyncio

import pulumi
import pytest
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import proto, rpc
from pulumi_mocks import install

from corral.components import _dynamic
from corral.components._token import ApiToken
from corral.components._version import __version__
from corral.components.provider import _crud


@pytest.fixture
def served_here():
    _dynamic.serve_here()
    yield
    _dynamic._served_here = False


def registered_tokens() -> list:
    mocks = install()

    @pulumi.runtime.test
    def program():
        ApiToken("t")

    program()
    return [r for r in mocks.resources if r.name == "t"]


def test_a_python_program_keeps_the_sdks_dynamic_type():
    (token,) = registered_tokens()
    assert token.typ == "pulumi-python:dynamic:Resource" and "__provider" in token.inputs


def test_inside_the_provider_the_type_is_corrals(served_here):
    (token,) = registered_tokens()
    assert token.typ == "corral:dynamic:Resource" and "__provider" in token.inputs


def test_inside_the_provider_the_version_is_the_components(served_here, monkeypatch):
    seen = []
    init = pulumi.CustomResource.__init__
    monkeypatch.setattr(pulumi.CustomResource, "__init__",
                        lambda self, t, name, props=None, opts=None, **kw: (seen.append((t, opts.version)),
                                                                             init(self, t, name, props, opts, **kw)))
    registered_tokens()
    assert ("corral:dynamic:Resource", __version__) in seen


class Echo(ResourceProvider):
    """Outputs its inputs (minus the pickled provider) and an id; diff says what changed."""

    serialize_as_secret_always = False

    def create(self, props):
        return CreateResult("echo-1", {k: v for k, v in props.items() if k != "__provider"})

    def diff(self, _id, olds, news):
        return DiffResult(changes=olds["greeting"] != news["greeting"], replaces=["greeting"])


class Context:
    def __init__(self):
        self.aborted = None

    async def abort(self, code, details):
        self.aborted = (code, details)
        raise RuntimeError(details)


def struct(values: dict):
    return asyncio.run(rpc.serialize_properties(values, {}))


def servicer() -> _crud.Servicer:
    return _crud.Servicer(None, [], engine_address="127.0.0.1:1")


def test_create_runs_the_pickled_provider_and_keeps_a_secret_input_secret():
    pickled = serialize_provider(Echo())
    request = proto.CreateRequest(urn="urn:pulumi:s::p::corral:dynamic:Resource::e", properties=struct({
        "__provider": pickled, "greeting": "hi", "password": rpc.wrap_rpc_secret("s3cret")}))
    response = asyncio.run(servicer().Create(request, Context()))
    assert response.id == "echo-1"
    outs = rpc.deserialize_properties(response.properties)
    assert outs["greeting"] == "hi" and outs["__provider"] == pickled
    assert rpc.is_rpc_secret(outs["password"]) and rpc.unwrap_rpc_secret(outs["password"]) == "s3cret"


def test_diff_reports_the_providers_answer():
    pickled = serialize_provider(Echo())
    request = proto.DiffRequest(id="echo-1", olds=struct({"__provider": pickled, "greeting": "hi"}),
                                news=struct({"__provider": pickled, "greeting": "hello"}))
    response = asyncio.run(servicer().Diff(request, Context()))
    assert response.changes == proto.DiffResponse.DIFF_SOME and list(response.replaces) == ["greeting"]
    same = proto.DiffRequest(id="echo-1", olds=struct({"__provider": pickled, "greeting": "hi"}),
                             news=struct({"__provider": pickled, "greeting": "hi"}))
    assert asyncio.run(servicer().Diff(same, Context())).changes == proto.DiffResponse.DIFF_NONE


def test_a_failing_provider_aborts_with_its_traceback():
    class Broken(Echo):
        def create(self, props):
            raise ValueError("no docker here")

    request = proto.CreateRequest(properties=struct({"__provider": serialize_provider(Broken())}))
    context = Context()
    with pytest.raises(RuntimeError):
        asyncio.run(servicer().Create(request, context))
    assert "ValueError: no docker here" in context.aborted[1]
