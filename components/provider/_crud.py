"""The component provider's gRPC server: Pulumi's ProviderServicer (construct, for the components) plus the CRUD of
Corral's dynamic resources, `corral:dynamic:Resource` (see corral.components._dynamic for why they come here).

Each call does what the SDK's own dynamic provider (`python -m pulumi.dynamic`) does: unpickle the ResourceProvider
from the `__provider` input and call its check/diff/create/read/update/delete. Two differences, both because this
server also constructs components:
- it accepts secrets (components need them), so a secret input arrives wrapped: it is unwrapped for the provider,
  and an output or checked input of the same name is wrapped again, so a secret stays a secret in the state;
- the provider methods block (Docker builds, API calls), so they run in a worker thread, never on the event loop
  that serves construct.
The engine calls create/update only on `pulumi up`: this server does not declare preview support.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys
import traceback
from collections.abc import Callable
from typing import Any

import dill
import grpc
import grpc.aio
from google.protobuf import empty_pb2
from pulumi.dynamic import ResourceProvider
from pulumi.provider.server import ProviderServicer
from pulumi.runtime import proto, rpc
from pulumi.runtime._grpc_settings import _GRPC_CHANNEL_OPTIONS
from pulumi.runtime._serialization import _deserialize
from pulumi.runtime.proto import provider_pb2_grpc

PROVIDER_KEY = "__provider"
_providers: dict[str, ResourceProvider] = {}


def _unwrap(value: Any) -> Any:
    """A deserialized property with every secret wrapper removed (the dynamic providers take plain values)."""
    value = rpc.unwrap_rpc_secret(value)
    if isinstance(value, dict):
        return {k: _unwrap(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


def _plain(props: Any) -> tuple[dict[str, Any], set[str]]:
    """Deserialized properties unwrapped, and the names of those that held a secret anywhere inside."""
    plain = {k: _unwrap(v) for k, v in props.items()}
    return plain, {k for k, v in props.items() if plain[k] != v or rpc.is_rpc_secret(v)}


def _secret_again(values: dict[str, Any], secret: set[str]) -> dict[str, Any]:
    return {k: rpc.wrap_rpc_secret(v) if k in secret else v for k, v in values.items()}


def _provider(props: dict[str, Any]) -> ResourceProvider:
    """The ResourceProvider pickled in `props` (cached: one object per pickled form, as the SDK's host does).
    Corral's providers take no provider config, so configure() is not called."""
    pickled = props[PROVIDER_KEY]
    if pickled not in _providers:
        _providers[pickled] = _deserialize(lambda: dill.loads(base64.b64decode(pickled)))
    return _providers[pickled]


async def _serialize(values: dict[str, Any]) -> Any:
    return await rpc.serialize_properties(values, {})


class Servicer(ProviderServicer):
    """ProviderServicer with the dynamic resources' CRUD."""

    async def _run(self, context: grpc.aio.ServicerContext, fn: Callable[[], Any]) -> Any:
        try:
            return await asyncio.to_thread(fn)
        except Exception:  # noqa: BLE001 - any provider failure goes to the engine, with the traceback
            await context.abort(grpc.StatusCode.UNKNOWN, traceback.format_exc())

    async def Check(self, request, context):
        olds, _ = _plain(rpc.deserialize_properties(request.olds, True))
        news, secret = _plain(rpc.deserialize_properties(request.news, True))
        provider = _provider(olds if news.get(PROVIDER_KEY) == rpc.UNKNOWN else news)
        result = await self._run(context, lambda: provider.check(olds, news))
        inputs = {**result.inputs, PROVIDER_KEY: news[PROVIDER_KEY]}
        failures = [proto.CheckFailure(property=f.property, reason=f.reason) for f in result.failures]
        return proto.CheckResponse(inputs=await _serialize(_secret_again(inputs, secret)), failures=failures)

    async def Diff(self, request, context):
        olds, _ = _plain(rpc.deserialize_properties(request.olds, True))
        news, _ = _plain(rpc.deserialize_properties(request.news, True))
        provider = _provider(olds if news.get(PROVIDER_KEY) == rpc.UNKNOWN else news)
        result = await self._run(context, lambda: provider.diff(request.id, olds, news))
        fields: dict[str, Any] = {"changes": proto.DiffResponse.DIFF_UNKNOWN if result.changes is None else
                                  proto.DiffResponse.DIFF_SOME if result.changes else proto.DiffResponse.DIFF_NONE}
        if result.replaces is not None:
            fields["replaces"] = result.replaces
        if result.delete_before_replace is not None:
            fields["deleteBeforeReplace"] = result.delete_before_replace
        return proto.DiffResponse(**fields)

    async def Create(self, request, context):
        props, secret = _plain(rpc.deserialize_properties(request.properties))
        result = await self._run(context, lambda: _provider(props).create(props))
        outs = {**(result.outs or {}), PROVIDER_KEY: props[PROVIDER_KEY]}
        return proto.CreateResponse(id=result.id, properties=await _serialize(_secret_again(outs, secret)))

    async def Read(self, request, context):
        props, secret = _plain(rpc.deserialize_properties(request.properties))
        if not props and request.inputs is not None:
            props, secret = _plain(rpc.deserialize_properties(request.inputs))
        result = await self._run(context, lambda: _provider(props).read(request.id, props))
        outs = {**(result.outs or {}), PROVIDER_KEY: props[PROVIDER_KEY]}
        fields = {"id": result.id, "properties": await _serialize(_secret_again(outs, secret))}
        if result.inputs is not None:
            fields["inputs"] = await _serialize(_secret_again({**result.inputs, PROVIDER_KEY: props[PROVIDER_KEY]},
                                                              secret))
        return proto.ReadResponse(**fields)

    async def Update(self, request, context):
        olds, _ = _plain(rpc.deserialize_properties(request.olds))
        news, secret = _plain(rpc.deserialize_properties(request.news))
        result = await self._run(context, lambda: _provider(news).update(request.id, olds, news))
        outs = {**(result.outs or {}), PROVIDER_KEY: news[PROVIDER_KEY]}
        return proto.UpdateResponse(properties=await _serialize(_secret_again(outs, secret)))

    async def Delete(self, request, context):
        props, _ = _plain(rpc.deserialize_properties(request.properties))
        await self._run(context, lambda: _provider(props).delete(request.id, props))
        return empty_pb2.Empty()


def serve(provider: Any, args: list[str]) -> None:
    """pulumi.provider.main with this Servicer: serve on a free loopback port and print it for the engine."""
    argp = argparse.ArgumentParser(description="Corral's component provider (gRPC server)")
    argp.add_argument("engine", help="Pulumi engine address")
    argp.add_argument("--logflow", action="store_true", help="ignored")
    argp.add_argument("--logtostderr", action="store_true", help="ignored")
    known, _ = argp.parse_known_args(args)

    async def run() -> None:
        server = grpc.aio.server(options=_GRPC_CHANNEL_OPTIONS)
        provider_pb2_grpc.add_ResourceProviderServicer_to_server(
            Servicer(provider, args, engine_address=known.engine), server)
        port = server.add_insecure_port(address="127.0.0.1:0")
        await server.start()
        sys.stdout.buffer.write(f"{port}\n".encode())
        sys.stdout.buffer.flush()
        await server.wait_for_termination()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
