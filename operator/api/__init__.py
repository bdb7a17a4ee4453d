"""corral.operator.api: the claims HTTP API, served by the operator in both modes (Docker and Kubernetes).

`create_app(backend, token)` builds the FastAPI app; a mode plugs in through the small `ClaimsBackend` protocol
(backend.py). Every route but health and metrics needs `Authorization: Bearer <token>`; every error is
`{"code", "message"}` with a 4xx/5xx status.
"""

from .app import create_app
from .backend import BackendError, ClaimsBackend, Conflict, ExecdTarget, Invalid, NotFound, Unavailable
from .models import Claim, ClaimList, ClaimRequest, Error, RenewRequest, Snapshot, SnapshotRequest

__all__ = [
    "create_app", "ClaimsBackend", "ExecdTarget", "BackendError", "NotFound", "Conflict", "Invalid", "Unavailable",
    "Claim", "ClaimList", "ClaimRequest", "Error", "RenewRequest", "Snapshot", "SnapshotRequest",
]
