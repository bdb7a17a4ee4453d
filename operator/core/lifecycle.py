"""Deadlines of sandboxes and claims, as plain arithmetic on Unix times (seconds). Both runtimes arm their timers
from these and decide with `due`; neither polls.

- readiness grace: an idle sandbox still unready this long after its creation is stuck and gets replaced. Per
  WarmPool (`spec.readinessGraceSeconds`, the model's default where a pool has none, e.g. a removed Docker pool);
- claim timeout: a claim not bound within `timeoutSeconds` of its creation fails (Timeout);
- lease: a claim with a TTL (the API's `ttlSeconds`, the resource's `lifecycle.shutdownTime`) ends at
  `lease_end(start, ttl)`, counted from its creation or its last renew;
- ttlSecondsAfterFinished: a finished claim is deleted this long after it finished (resource model only).
"""

from __future__ import annotations

from typing import Any, overload

from corral.api import WarmPoolSpec

DEFAULT_READINESS_GRACE = float(WarmPoolSpec.model_fields["readiness_grace_seconds"].default)


def readiness_grace(pool_spec: Any) -> float:
    """The grace of a WarmPool or Pool spec (corral.api models); pools without the field get the default."""
    return float(getattr(pool_spec, "readiness_grace_seconds", DEFAULT_READINESS_GRACE))


def grace_deadline(created: float, grace: float) -> float:
    """When an unready sandbox created at `created` is stuck."""
    return created + grace


def stuck(created: float, ready: bool, now: float, grace: float) -> bool:
    """Unready past the grace (strictly after the deadline)."""
    return not ready and now > grace_deadline(created, grace)


def claim_deadline(created: float, timeout_seconds: float) -> float:
    """When a claim that is still not bound fails (Timeout)."""
    return created + timeout_seconds


def lease_end(start: float, ttl_seconds: float | None) -> float | None:
    """When a claim leased for `ttl_seconds` from `start` ends (None: no TTL, it never expires)."""
    return start + ttl_seconds if ttl_seconds else None


@overload
def finished_expiry(finished: float, ttl_after_finished: float) -> float: ...
@overload
def finished_expiry(finished: float, ttl_after_finished: None) -> None: ...
@overload
def finished_expiry(finished: float, ttl_after_finished: float | None) -> float | None: ...


def finished_expiry(finished: float, ttl_after_finished: float | None) -> float | None:
    """When a finished claim is deleted (None: kept)."""
    return None if ttl_after_finished is None else finished + ttl_after_finished


def due(deadline: float | None, now: float) -> bool:
    """A deadline is reached at its instant (a lease of 60 s is over at exactly 60 s)."""
    return deadline is not None and now >= deadline
