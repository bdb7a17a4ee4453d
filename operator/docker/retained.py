"""What outlives a claim on Docker, listed and removed through the claims API: retained sandboxes (containers kept
after their claim ended, shutdownPolicy Retain; rows in state `retained`, which no pool counts) and snapshot images
(commits labelled with the stack and role `snapshot`, see engine.commit).

A retained sandbox is never reached through the proxy (its claim is gone); its listing asks the engine for the
container's state and its execd for health, at most RETAINED_PROBES at a time and a second each. Only rows in state
`retained` can be deleted here, and only this stack's snapshot images: a pool's or a claim's sandbox, a template's
image, is a 404.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from corral.operator.claimsapi import Conflict, NotFound, RetainedSandbox, Snapshot

from . import engine
from .runner import Runner
from .sandboxes import Sandboxes
from .settings import Settings
from .store import SandboxRow, Store

RETAINED_PROBES = 16  # concurrent state/health probes of one listing
HEALTH_TIMEOUT = 1.0  # seconds an execd has to answer its health endpoint in a listing


def _ts(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t else None


class Retained:
    def __init__(self, settings: Settings, store: Store, client: Any, runner: Runner, sandboxes: Sandboxes):
        self.s, self.store, self.client, self.runner, self.sandboxes = settings, store, client, runner, sandboxes

    async def list_retained(self) -> list[RetainedSandbox]:
        rows = await self.runner.run(self.store.sandboxes, states=("retained",))
        gate = asyncio.Semaphore(RETAINED_PROBES)

        async def describe(row: SandboxRow) -> RetainedSandbox:
            async with gate:
                state = await self.runner.run(engine.container_state, self.client, row.name)
                ready = state == "running" and bool(row.ip) and await self.sandboxes.healthy(row, HEALTH_TIMEOUT)
            return RetainedSandbox(name=row.name, template=row.template, pool=row.retained_pool,
                                   claim=row.retained_from, retained_at=_ts(row.retained_at),
                                   created=_ts(row.created), state=state, ready=ready)

        return list(await asyncio.gather(*(describe(r) for r in rows)))

    async def delete_retained(self, name: str) -> None:
        row = await self.runner.run(self.store.sandbox, name)
        if row is None or row.state != "retained":
            raise NotFound(f"no retained sandbox named {name!r}")
        await self.runner.run(self.store.update_sandbox, name, state="deleting")
        await self.sandboxes.delete(name)

    async def list_snapshots(self) -> list[Snapshot]:
        return [Snapshot.model_validate(s) for s in await self.runner.run(engine.list_snapshots, self.client,
                                                                          self.s.stack)]

    async def delete_snapshot(self, ref: str) -> None:
        outcome = await self.runner.run(engine.remove_snapshot, self.client, self.s.stack, ref, op="remove-image")
        if outcome == "missing":
            raise NotFound(f"no snapshot {ref!r} (an image of another kind is never removed here)")
        if outcome.startswith("in-use"):
            raise Conflict(f"snapshot {ref!r} is in use by {outcome.partition(': ')[2]}: release the claims and "
                           "remove the pools started from it first")
