"""Prometheus metrics of the Docker runtime that exist in this mode only (Docker Engine calls, pool worker rounds,
container start). The claim and pool metrics are the core's (corral.operator.core.metrics), the same names and labels
as the Kubernetes operator's."""

from prometheus_client import Counter, Histogram

DOCKER_CALLS = Counter("corral_docker_calls_total", "Docker Engine operations", ["op", "outcome"])
RECONCILES = Counter("corral_pool_reconciles_total", "Pool plan rounds", ["pool"])
SANDBOX_START = Histogram(
    "corral_sandbox_start_seconds", "Container create to execd healthy",
    buckets=(0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 21, 34, 60),
)
