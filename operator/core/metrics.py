"""The metrics both runtimes export: one name, one label set, one label vocabulary each, so one dashboard covers
the Kubernetes operator and the Docker runtime alike.

    corral_claim_latency_seconds{launch_type, pool}     claim created -> bound (Ready), histogram
    corral_claims_total{outcome, pool, launch_type}      claims by how they came out: Bound, or the reason they
                                                         failed or finished (vocabulary.REASONS)
    corral_pool_sandboxes{namespace, pool, state}        sandboxes of a pool by state (vocabulary.POOL_STATES);
                                                         on Docker `namespace` is the stack name
    corral_batch_duration_seconds{pool, phase}           SandboxBatch created -> final phase (core.batches), histogram
    corral_batch_tasks_total{outcome, pool}              batch tasks by how they ended (Completed or the reason)
    corral_batch_tasks_running{namespace, pool}          batch tasks running now

`launch_type` is warm, cold or none (never bound). Runtime-specific metrics live beside each runtime
(`corral.operator.metrics` for Kubernetes API calls and reconciles, `corral.operator.docker.metrics` for Docker
Engine calls); none of them reuses a name from here. The functions below are the only writers of these metrics.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from .vocabulary import POOL_STATES, R_BOUND, REASONS, launch_label

CLAIM_LATENCY = Histogram(
    "corral_claim_latency_seconds", "Claim created -> bound (Ready), by launch type and pool.",
    ["launch_type", "pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
CLAIMS = Counter("corral_claims_total", "Claims by outcome: Bound, or the reason they failed or finished.",
                 ["outcome", "pool", "launch_type"])
POOL_SANDBOXES = Gauge("corral_pool_sandboxes", "Sandboxes of a pool by state (desired/ready/idle/allocated).",
                       ["namespace", "pool", "state"])

BATCH_DURATION = Histogram(
    "corral_batch_duration_seconds", "SandboxBatch created -> its final phase, by pool and phase.", ["pool", "phase"],
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600),
)
BATCH_TASKS = Counter("corral_batch_tasks_total", "Batch tasks by how they ended: Completed, or why they failed.",
                      ["outcome", "pool"])
BATCH_TASKS_RUNNING = Gauge("corral_batch_tasks_running", "Batch tasks running now.", ["namespace", "pool"])

SHARED = (CLAIM_LATENCY, CLAIMS, POOL_SANDBOXES, BATCH_DURATION, BATCH_TASKS, BATCH_TASKS_RUNNING)


def claim_bound(pool: str, launch_type: str, seconds: float) -> None:
    """A claim got its sandbox (Bound on Kubernetes, Ready on Docker) `seconds` after it was made."""
    launch = launch_label(launch_type)
    CLAIM_LATENCY.labels(launch_type=launch, pool=pool).observe(max(0.0, seconds))
    CLAIMS.labels(outcome=R_BOUND, pool=pool, launch_type=launch).inc()


def claim_ended(pool: str, launch_type: str | None, reason: str) -> None:
    """A claim failed or finished for `reason` (vocabulary.REASONS)."""
    if reason not in REASONS:
        raise ValueError(f"claim outcome {reason!r} is not in the core's reason vocabulary")
    CLAIMS.labels(outcome=reason, pool=pool, launch_type=launch_label(launch_type)).inc()


def pool_sandboxes(namespace: str, pool: str, *, desired: int, ready: int, idle: int, allocated: int) -> None:
    values = dict(zip(POOL_STATES, (desired, ready, idle, allocated), strict=True))
    for state, value in values.items():
        POOL_SANDBOXES.labels(namespace=namespace, pool=pool, state=state).set(value)


def batch_task_ended(pool: str, reason: str) -> None:
    """A batch task ended for `reason` (core.batches: Completed, NonZeroExit, TaskTimeout, ... or SandboxLost)."""
    BATCH_TASKS.labels(outcome=reason or "Unknown", pool=pool).inc()


def batch_tasks_running(namespace: str, pool: str, delta: int) -> None:
    """`delta` more (or fewer) batch tasks run on this pool."""
    if delta:
        BATCH_TASKS_RUNNING.labels(namespace=namespace, pool=pool).inc(delta)


def batch_finished(pool: str, phase: str, seconds: float) -> None:
    """A batch reached its final `phase` `seconds` after it was created."""
    BATCH_DURATION.labels(pool=pool, phase=phase).observe(max(0.0, seconds))
