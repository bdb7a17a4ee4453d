"""pulumi.runtime.Mocks that record every registered resource, for asserting resource graphs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pulumi


@dataclass
class Registered:
    typ: str
    name: str
    inputs: dict[str, Any]
    custom: bool
    provider: str | None


class RecordingMocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: list[Registered] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(Registered(args.typ, args.name, dict(args.inputs), args.custom, args.provider))
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}

    def of_type(self, typ: str) -> list[Registered]:
        return [r for r in self.resources if r.typ == typ]


MOCKS = RecordingMocks()


def install(stack: str = "test", project: str = "corral") -> RecordingMocks:
    """(Re)install the one shared recorder with a clean slate; call it before each test."""
    MOCKS.resources.clear()
    # Pulumi's mocks run on the thread's current event loop; an async test before this one (pytest-asyncio) leaves
    # the thread with none set, and asyncio.get_event_loop() then raises instead of making one.
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    pulumi.runtime.set_mocks(MOCKS, project=project, stack=stack, preview=False)
    return MOCKS


def resolve(output: pulumi.Output) -> Any:
    """The value of an output inside a @pulumi.runtime.test function (as a future for .apply chains)."""
    return output
