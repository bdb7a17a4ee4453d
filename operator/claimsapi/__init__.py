"""corral.operator.claimsapi: the claims HTTP API, served by the operator in both modes (Docker and Kubernetes).

`create_app(backend, token)` builds the FastAPI app; a mode plugs in through the small `ClaimsBackend` protocol
(backend.py). Every route but health, metrics and the API docs needs `Authorization: Bearer <token>`, checked
before any body is read; every error is `{"code", "message"}` with a 4xx/5xx status.
"""

from corral.api.wire import (
    Claim,
    ClaimList,
    ClaimRequest,
    Error,
    PoolList,
    PoolStatus,
    RenewRequest,
    RetainedSandbox,
    RetainedSandboxList,
    Snapshot,
    SnapshotList,
    SnapshotRequest,
)

from .backend import BackendError, ClaimsBackend, Conflict, ExecdTarget, Invalid, NotFound, Unavailable

__all__ = [
    "create_app", "ClaimsBackend", "ExecdTarget", "BackendError", "NotFound", "Conflict", "Invalid", "Unavailable",
    "Claim", "ClaimList", "ClaimRequest", "Error", "PoolList", "PoolStatus", "RenewRequest", "RetainedSandbox",
    "RetainedSandboxList", "Snapshot", "SnapshotList", "SnapshotRequest",
]


def __getattr__(name: str):
    # create_app is imported on first use: importing the package for its models should not pay for FastAPI (~0.4 s).
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
