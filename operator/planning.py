"""Pure decisions: what a WarmPool or Pool should create or delete, and which sandbox a claim adopts.

Everything here is a function of plain values (no I/O), so it is unit-tested exhaustively and the reconcilers stay
thin. Counts include what is in flight (expected creates not yet seen, deletes not yet gone), so informer lag never
double-creates or double-deletes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .core import lifecycle

MAX_BATCH = 32


@dataclass(frozen=True)
class Member:
    """A sandbox as the operator's index sees it."""

    name: str
    namespace: str
    uid: str = ""
    resource_version: str = ""
    template: str = ""
    pool: str | None = None
    pool_kind: str | None = None
    claim: str | None = None
    blueprint_hash: str | None = None
    ready: bool = False
    node: str | None = None
    created: float = 0.0
    deleting: bool = False
    phase: str | None = None
    pod_ips: tuple[str, ...] = ()
    endpoint: str | None = None
    launch_type: str | None = None
    suspended: bool = False
    claim_uid: str | None = None
    unready_since: float = 0.0  # when its Ready condition last turned False (0: ready, or not known)


@dataclass
class SlowStart:
    """Batch pacing for creates and deletes: 1, 2, 4, ... capped at `cap` (CORRAL_MAX_BATCH in both runtimes).

    One object per run of batches: `take(n)` is the next batch for n outstanding, `grow()` after a batch that
    succeeded, `reset()` after one that failed (or once the pool has converged), so a failing engine or API server
    sees single creates, not a storm.
    """

    cap: int = MAX_BATCH
    size: int = 1

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise ValueError(f"the slow-start cap must be >= 1, not {self.cap}")

    def take(self, n: int) -> int:
        return max(0, min(n, self.size, self.cap))

    def grow(self) -> None:
        self.size = min(self.size * 2, self.cap)

    def reset(self) -> None:
        self.size = 1


def unready_from(m: Member) -> float:
    """Since when a sandbox has been unready: its creation, or the moment it turned unready after being ready (an
    execd that died for good fails the pod's readiness probe long after the pod was made)."""
    return max(m.created, m.unready_since)


def stuck_members(idle: Iterable[Member], now: float, grace: float | None) -> list[Member]:
    """Idle sandboxes unready for longer than `grace` since they turned unready (None: never)."""
    return [] if grace is None else [m for m in idle if lifecycle.stuck(unready_from(m), m.ready, now, grace)]


def slow_start(n: int, cap: int = MAX_BATCH) -> list[int]:
    """Batch sizes 1, 2, 4, ... (capped) that add up to n. The first batch is always 1."""
    out, pace = [], SlowStart(cap)
    while n > 0:
        b = pace.take(n)
        out.append(b)
        n -= b
        pace.grow()
    return out


def pool_desired(*, buffer_min: int, pool_min: int, pool_max: int, allocated: int) -> int:
    """A Pool's desired total: what is allocated plus the idle buffer's floor, within [poolMin, poolMax].

    The `desired` of the claims API's pool list and of the corral_pool_sandboxes gauge, in both runtimes. Pass the
    values of a validated `corral.api.Capacity`, never raw dict lookups with defaults of their own.
    """
    return max(pool_min, min(pool_max, allocated + buffer_min))


def deletion_order(members: Iterable[Member], current_hash: str | None) -> list[Member]:
    """Not-ready first, then stale, then newest."""
    return sorted(members, key=lambda m: (m.ready, m.blueprint_hash == current_hash, -m.created, m.name))


@dataclass
class Plan:
    create: int = 0
    delete: list[Member] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)


def plan_warm_pool(
    *,
    replicas: int,
    idle: Sequence[Member],
    current_hash: str | None,
    strategy: str,
    expected_creates: int,
    now: float,
    readiness_grace: float,
) -> Plan:
    """Keep exactly `replicas` idle sandboxes.

    `idle` are the pool's unclaimed sandboxes that are not being deleted. Stuck ones (unready past the grace) are
    replaced; under Recreate stale ones (another blueprint hash) are deleted and replaced; under OnReplenish they
    stay claimable and are replaced as they are claimed.
    """
    plan = Plan()
    stuck = stuck_members(idle, now, readiness_grace)
    stale = [m for m in idle if strategy == "Recreate" and current_hash and m.blueprint_hash != current_hash]
    doomed = {m.name: m for m in [*stuck, *stale]}
    if stuck:
        plan.reasons.append(f"{len(stuck)} stuck unready > {readiness_grace:.0f}s")
    if stale:
        plan.reasons.append(f"{len(stale)} stale (Recreate)")
    keep = [m for m in idle if m.name not in doomed]
    have = len(keep) + expected_creates
    if have < replicas:
        plan.create = replicas - have
    elif have > replicas:
        surplus = min(have - replicas, len(keep))
        doomed.update({m.name: m for m in deletion_order(keep, current_hash)[:surplus]})
    plan.delete = deletion_order(doomed.values(), current_hash)
    return plan


def plan_pool(
    *,
    buffer_min: int,
    buffer_max: int,
    pool_min: int,
    pool_max: int,
    max_unavailable: int,
    idle: Sequence[Member],
    allocated: int,
    terminating: int,
    expected_creates: int,
    current_hash: str | None,
    now: float = 0.0,
    readiness_grace: float | None = None,
) -> Plan:
    """OpenSandbox Pool capacity: idle buffer in [bufferMin, bufferMax], total in [poolMin, poolMax], counting
    pending creates and terminating sandboxes; deletes per round bounded by maxUnavailable (minus in-flight).
    Idle sandboxes unready past `readiness_grace` are replaced first (deleted, counted as terminating until gone)."""
    plan = Plan()
    doomed = stuck_members(idle, now, readiness_grace)[:max(0, max_unavailable - terminating)]
    if doomed:
        plan.delete = deletion_order(doomed, current_hash)
        plan.reasons.append(f"{len(doomed)} stuck unready > {readiness_grace:.0f}s")
        idle = [m for m in idle if m not in doomed]
        terminating += len(doomed)
    n_idle = len(idle) + expected_creates
    total = allocated + n_idle + terminating
    create = max(0, buffer_min - n_idle, pool_min - total)
    create = min(create, max(0, pool_max - total))
    plan.create = create
    if create:
        return plan
    surplus = max(0, n_idle - buffer_max, total - pool_max)
    surplus = min(surplus, len(idle), max(0, total - terminating - pool_min))
    surplus = min(surplus, max(0, max_unavailable - terminating))
    plan.delete = [*plan.delete, *deletion_order(idle, current_hash)[:surplus]]
    return plan


def adoption_candidates(candidates: Iterable[Member], current_hash: str | None, reserved: set[str]) -> Iterator[Member]:
    """Ready idle sandboxes in the order a claim should try them.

    Stale ones first (so an OnReplenish pool drains its old blueprint through claims), then spread over nodes: the
    node with the most idle candidates gives first, so the remaining warm capacity stays spread; oldest first.
    Lazily: the first candidate costs one pass over the pool (a claim almost always gets it); the rest are sorted
    only when that one was taken meanwhile (a full sort per claim was quadratic over a burst).
    """
    ready = [m for m in candidates if m.ready and not m.deleting and not m.claim and m.name not in reserved]
    if not ready:
        return
    per_node = Counter(m.node for m in ready)

    def key(m: Member) -> tuple[Any, ...]:
        return (m.blueprint_hash == current_hash, -per_node[m.node], m.created, m.name)

    first = min(ready, key=key)
    yield first
    yield from sorted((m for m in ready if m is not first), key=key)


def adoption_order(candidates: Iterable[Member], current_hash: str | None, reserved: set[str]) -> list[Member]:
    """`adoption_candidates`, all of them."""
    return list(adoption_candidates(candidates, current_hash, reserved))
