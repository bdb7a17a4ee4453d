"""The backend protocol: what a mode (Docker, Kubernetes) implements for the claims API. Kept small on purpose.

Every method is async and raises a `BackendError` subclass for anything the client should see (it becomes the
`{code, message}` body with the error's status). `execd_target` is all the proxy needs: where the sandbox's execd
answers and with which token; the API never exposes either to clients.

`list_pools` (GET /v1/pools, for `corral pools`) was added after the first version, and so were the retained
sandboxes and snapshots (`list_retained`, `delete_retained`, `list_snapshots`, `delete_snapshot`); a backend that
does not have one yet makes its route answer 501 `not_implemented` (the app checks with getattr), everything else is
unaffected.
Batches (`create_batch`, `get_batch`, `list_batches`, `delete_batch`, `watch_batch`) are optional the same way:
a SandboxBatch (Kubernetes) or its Docker counterpart, N sandboxes of one pool and one task in each. Results are
followed without polling: `watch_batch` is an async iterator of the batch's states, one each time it changes, which
the app turns into the NDJSON stream of GET /v1/batches/{name}/events (a `task` line per ended index, `progress` lines
as counts change, an `end` line; see corral.api.wire.BatchEvent), so the SDK iterates results as tasks finish over
one open response, and a backend only has to say when its batch changed. An ended index's `output` is the tail of
its task's output (at most wire.OUTPUT_TAIL_BYTES, read from the sandbox's execd once, when it has ended: a backend
bounds how many it reads at a time and may cache them, an ended task's output does not change).
A claim that exists but is not Ready (execd_target, pause, ...) is a `Conflict` worded "claim <name> is <Phase>, not
Ready" (or with code="not_ready"): the SDK turns either into its `NotReady` exception.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

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


class BackendError(Exception):
    status = 500
    code = "internal"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.code
        self.status = status or self.status


class NotFound(BackendError):
    status, code = 404, "not_found"


class Conflict(BackendError):
    status, code = 409, "conflict"


class Invalid(BackendError):
    status, code = 400, "invalid"


class Unavailable(BackendError):
    status, code = 503, "unavailable"


@dataclass(frozen=True)
class ExecdTarget:
    url: str      # base URL of the sandbox's execd, e.g. http://172.18.0.5:44772
    token: str    # the sandbox's execd token


@runtime_checkable
class ClaimsBackend(Protocol):
    async def create_claim(self, req: ClaimRequest) -> Claim:
        """Bind a sandbox of `req.pool` (warm if one is ready, else cold); wait up to req.timeout_seconds for it to
        be Ready. Creating an existing name returns the existing claim (idempotent retry)."""

    async def get_claim(self, name: str) -> Claim: ...

    async def list_claims(self, pool: str | None = None) -> list[Claim]: ...

    async def delete_claim(self, name: str) -> None:
        """End the claim: its sandbox is deleted, recycled into its Pool, or retained (shutdownPolicy)."""

    async def renew_claim(self, name: str, ttl_seconds: int) -> Claim:
        """Extend the lease to now + ttl_seconds."""

    async def pause_claim(self, name: str) -> Claim:
        """Freeze every process of the sandbox (memory kept)."""

    async def resume_claim(self, name: str) -> Claim: ...

    async def snapshot_claim(self, name: str, req: SnapshotRequest) -> Snapshot:
        """Save the sandbox's filesystem as an image a new claim or pool can start from."""

    async def execd_target(self, name: str) -> ExecdTarget:
        """Where the claim's execd answers (the claim must be Ready)."""

    async def list_pools(self) -> list[PoolStatus]:
        """Every WarmPool and Pool of the mode (Kubernetes: of the operator's namespaces) with its counts:
        desired, ready (idle and ready), idle (unclaimed, ready or starting), allocated (bound to a claim)."""

    async def list_retained(self) -> list[RetainedSandbox]:
        """Sandboxes kept after their claim ended (shutdownPolicy Retain), oldest first."""

    async def delete_retained(self, name: str) -> None:
        """Delete a retained sandbox (NotFound for any other name, a pool's or a claim's sandbox included)."""

    async def list_snapshots(self) -> list[Snapshot]:
        """Snapshot images of this mode, one per reference, oldest first."""

    async def delete_snapshot(self, ref: str) -> None:
        """Remove a snapshot by its reference or image ID (NotFound for anything that is not one of this mode's
        snapshots; Conflict while a sandbox uses it)."""

    # --- batches (optional: the routes answer 501 without them) ----------------------------------------------------
    async def create_batch(self, req: BatchRequest) -> Batch:
        """Create the batch and answer at once (Pending; its sandboxes are bound and its tasks started in the
        background). NotFound if the pool does not exist (a batch for a pool that appears later is not created
        through the API). Creating an existing name for the same pool returns it (a retry is safe); for another pool
        it is a Conflict."""

    async def get_batch(self, name: str) -> Batch:
        """The batch with one result per index; ended indexes carry their output's tail."""

    async def list_batches(self, pool: str | None = None) -> list[Batch]:
        """Batches (of one pool), oldest first, their results without output."""

    async def delete_batch(self, name: str) -> None:
        """Delete the batch: running tasks are killed with their sandboxes, which are deleted or recycled (Retain:
        the kept ones go now too). Returns once it is gone or after a short grace."""

    def watch_batch(self, name: str) -> AsyncIterator[Batch]:
        """The batch now, then again each time it changed (phase, counts, an index), until it is finished: the last
        item is finished. States may be coalesced (a hundred ends at once can be one item), never lost: an index
        that ended stays ended in every later item, with its output's tail. Raises NotFound if there is no such
        batch when first iterated, and NotFound from a later step if it is deleted while watched. Woken by the
        mode's own events (Kubernetes: the operator's watch), never by polling."""
