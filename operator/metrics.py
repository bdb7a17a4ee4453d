"""Prometheus metrics of the Kubernetes operator.

The claim and pool metrics are the core's (corral.operator.core.metrics: the same names and labels as the Docker
runtime's); the ones here are about the Kubernetes API and the reconcilers, and exist in this mode only.
"""

from collections import OrderedDict

from prometheus_client import Counter, Gauge, Histogram

from .core.metrics import CLAIM_LATENCY, CLAIMS, POOL_SANDBOXES  # noqa: F401 - one /metrics, one module to look in

RECONCILES = Counter("corral_reconciles_total", "Reconciles run, by kind and result.", ["kind", "result"])
API_REQUESTS = Counter("corral_api_requests_total", "Kubernetes API requests by verb and resource.",
                       ["verb", "resource"])
EVENTS = Counter("corral_watch_events_total", "Watch events handled, by kind.", ["kind"])
API_LATENCY = Histogram("corral_api_request_seconds", "Kubernetes API request latency by verb (reconcilers' calls).",
                        ["verb"], buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
LOST_BINDS = Counter("corral_claim_lost_binds_total", "Claims this replica adopted or created a sandbox for but "
                     "another replica bound first (sharded mode, a shard changing hands): the sandbox taken was "
                     "deleted.")
_LOST_COUNTED: OrderedDict[str, None] = OrderedDict()  # uids of sandboxes counted in LOST_BINDS (the last 4096)


def lost_bind(sandbox_uid: str | None) -> None:
    """Count a sandbox given back after a lost bind once: the pass that lost the status write deletes it, and a
    later pass that still sees it labelled for the claim (before the deletion's watch event) deletes it again."""
    if sandbox_uid:
        if sandbox_uid in _LOST_COUNTED:
            return
        _LOST_COUNTED[sandbox_uid] = None
        if len(_LOST_COUNTED) > 4096:
            _LOST_COUNTED.popitem(last=False)
    LOST_BINDS.inc()


SHARDS_HELD = Gauge("corral_shards_held", "Shards this replica holds (sharded mode).")
