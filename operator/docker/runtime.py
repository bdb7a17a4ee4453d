"""The Docker runtime: the claims API's backend (ClaimsBackend, operator/claimsapi/backend.py) over one Docker Engine,
composed of small parts, each given what it depends on:

- `Runner`      (runner.py)     the thread pool for blocking Docker and SQLite calls, and background tasks;
- `Sandboxes`   (sandboxes.py)  sandbox containers: start (execd healthy), recycle, delete; execd tokens and calls;
- `PoolWorkers` (pools.py)      one worker per pool, planning with the core's planners; `Wake` wakes them;
- `Claims`      (claims.py)     the claims side: bind, wait, release, lease deadlines, a claim's execd;
- `Batches`     (batches.py)    batches: bind like claims, one task per index in execd, followed to its end;
- `Recovery`    (recovery.py)   the engine's container events and the resync from engine and store;
- `Retained`    (retained.py)   retained sandboxes and snapshot images.

The store (store.py) is the truth for claims and sandboxes; the pools file (desired.py) is the desired state, which
a reload replaces (every part reads it through `desired()`).

Event-driven: pool workers wake on claims, releases, container events and pools-file reloads; claims expire on a
timer set for the next known deadline. With nothing changing it makes no Docker calls. Docker calls run in a bounded
thread pool; creates are bounded separately for claims (cold starts) and for pools (slow-start batches 1, 2, 4, ...).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import httpx

from corral.api.wire import (
    Batch,
    BatchRequest,
    Claim,
    ClaimRequest,
    PoolStatus,
    RetainedSandbox,
    Snapshot,
    SnapshotRequest,
)
from corral.operator.claimsapi import ExecdTarget

from .batches import Batches
from .claims import Claims
from .desired import DesiredState
from .pools import PoolWorkers, Wake
from .recovery import Recovery
from .retained import Retained
from .runner import Runner
from .sandboxes import Sandboxes
from .settings import Settings
from .store import Store

__all__ = ["DockerRuntime", "Settings"]


class DockerRuntime:
    def __init__(self, settings: Settings, desired: DesiredState, store: Store, client: Any):
        self.s, self.desired, self.store, self.client = settings, desired, store, client
        secret = bytes.fromhex(store.meta("token-secret", lambda: secrets.token_hex(32)))
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0))
        self.runner = Runner(settings.threads)
        self.wake = Wake()
        current = lambda: self.desired  # noqa: E731 - the pools file of now (reload replaces it)
        self.sandboxes = Sandboxes(settings, current, store, client, self.runner, self.http, secret, self.wake)
        self.pools = PoolWorkers(settings, current, store, self.runner, self.sandboxes, self.wake)
        cold = asyncio.Semaphore(settings.max_cold_creates)  # cold starts of claims and batches together
        self.claims = Claims(settings, current, store, client, self.runner, self.sandboxes, self.wake, cold)
        self.batches = Batches(settings, current, store, self.runner, self.sandboxes, self.wake, cold)
        self.recovery = Recovery(settings, store, client, self.runner, self.sandboxes, self.claims, self.batches,
                                 self.wake)
        self.retained = Retained(settings, store, client, self.runner, self.sandboxes)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self.runner.spawn(coro)

    # --- lifecycle --------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.runner.attach()
        await self.sandboxes.ensure_infrastructure()
        await self.recovery.resync()
        await self.batches.resume()
        self.pools.start()
        self.runner.spawn(self.claims.deadlines())
        self.runner.spawn(self.batches.deadlines())
        self.recovery.start()

    async def stop(self) -> None:
        self.recovery.stop()
        await self.pools.stop()
        await self.batches.stop()
        await self.runner.stop()
        await self.http.aclose()

    async def reload(self, desired: DesiredState) -> None:
        """A new pools file: new pools get workers, removed pools drain their idle sandboxes, all re-plan."""
        self.desired = desired
        await self.sandboxes.ensure_infrastructure()
        self.pools.start()
        self.wake()

    # --- ClaimsBackend ----------------------------------------------------------------------------------------------
    async def create_claim(self, req: ClaimRequest) -> Claim:
        return await self.claims.create(req)

    async def get_claim(self, name: str) -> Claim:
        return await self.claims.get(name)

    async def list_claims(self, pool: str | None = None) -> list[Claim]:
        return await self.claims.list(pool)

    async def delete_claim(self, name: str) -> None:
        await self.claims.delete(name)

    async def renew_claim(self, name: str, ttl_seconds: int) -> Claim:
        return await self.claims.renew(name, ttl_seconds)

    async def pause_claim(self, name: str) -> Claim:
        return await self.claims.pause(name)

    async def resume_claim(self, name: str) -> Claim:
        return await self.claims.resume(name)

    async def snapshot_claim(self, name: str, req: SnapshotRequest) -> Snapshot:
        return await self.claims.snapshot(name, req)

    async def execd_target(self, name: str) -> ExecdTarget:
        return await self.claims.execd_target(name)

    def execd_unreachable(self, name: str) -> None:
        """The proxy could not connect to the claim's execd (Claims.execd_unreachable)."""
        self.claims.execd_unreachable(name)

    async def list_pools(self) -> list[PoolStatus]:
        return await self.pools.list_pools()

    async def list_retained(self) -> list[RetainedSandbox]:
        return await self.retained.list_retained()

    async def delete_retained(self, name: str) -> None:
        await self.retained.delete_retained(name)

    async def list_snapshots(self) -> list[Snapshot]:
        return await self.retained.list_snapshots()

    async def delete_snapshot(self, ref: str) -> None:
        await self.retained.delete_snapshot(ref)

    async def create_batch(self, req: BatchRequest) -> Batch:
        return await self.batches.create(req)

    async def get_batch(self, name: str) -> Batch:
        return await self.batches.get(name)

    async def list_batches(self, pool: str | None = None) -> list[Batch]:
        return await self.batches.list(pool)

    async def delete_batch(self, name: str) -> None:
        await self.batches.delete(name)

    def watch_batch(self, name: str) -> AsyncIterator[Batch]:
        return self.batches.watch(name)
