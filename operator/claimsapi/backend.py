"""The backend protocol: what a mode (Docker, Kubernetes) implements for the claims API. Kept small on purpose.

Every method is async and raises a `BackendError` subclass for anything the client should see (it becomes the
`{code, message}` body with the error's status). `execd_target` is all the proxy needs: where the sandbox's execd
answers and with which token; the API never exposes either to clients.

`list_pools` (GET /v1/pools, for `corral pools`) was added after the first version, and so were the retained
sandboxes and snapshots (`list_retained`, `delete_retained`, `list_snapshots`, `delete_snapshot`); a backend that
does not have one yet makes its route answer 501 `not_implemented` (the app checks with getattr), everything else is
unaffected.
A claim that exists but is not Ready (execd_target, pause, ...) is a `Conflict` worded "claim <name> is <Phase>, not
Ready" (or with code="not_ready"): the SDK turns either into its `NotReady` exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from corral.api.wire import Claim, ClaimRequest, PoolStatus, RetainedSandbox, Snapshot, SnapshotRequest


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
