"""Prometheus metrics of the Docker runtime."""

from prometheus_client import Counter, Gauge, Histogram

CLAIM_SECONDS = Histogram(
    "corral_claim_ready_seconds", "Claim request to Ready, by launch type", ["launch_type"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
)
CLAIMS = Counter("corral_claims_total", "Claims by outcome", ["launch_type", "outcome"])
POOL = Gauge("corral_pool_sandboxes", "Sandboxes of a pool by state", ["pool", "state"])
DOCKER_CALLS = Counter("corral_docker_calls_total", "Docker Engine operations", ["op", "outcome"])
RECONCILES = Counter("corral_pool_reconciles_total", "Pool plan rounds", ["pool"])
SANDBOX_START = Histogram(
    "corral_sandbox_start_seconds", "Container create to execd healthy",
    buckets=(0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 21, 34, 60),
)
