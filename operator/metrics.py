"""Prometheus metrics of the operator."""

from prometheus_client import Counter, Gauge, Histogram

CLAIM_LATENCY = Histogram(
    "corral_claim_latency_seconds", "Claim created -> Bound, by launch type and pool.",
    ["launch_type", "pool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
CLAIMS = Counter("corral_claims_total", "Claims finished binding or failing, by outcome.", ["outcome", "pool"])
POOL_REPLICAS = Gauge("corral_pool_sandboxes", "Sandboxes of a pool by state (desired/ready/idle/allocated).",
                      ["namespace", "pool", "state"])
RECONCILES = Counter("corral_reconciles_total", "Reconciles run, by kind and result.", ["kind", "result"])
API_REQUESTS = Counter("corral_api_requests_total", "Kubernetes API requests by verb and resource.",
                       ["verb", "resource"])
EVENTS = Counter("corral_watch_events_total", "Watch events handled, by kind.", ["kind"])
API_LATENCY = Histogram("corral_api_request_seconds", "Kubernetes API request latency by verb (reconcilers' calls).",
                        ["verb"], buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
