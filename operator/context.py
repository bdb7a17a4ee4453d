"""Everything a reconciler needs, in one object: settings, the API client, the cache, the queue, and the in-flight
state that bridges the gap between our own writes and the watch events that report them (corral.operator.inflight,
one small type per concern)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
from pydantic import BaseModel, Field

from corral.api import SandboxTemplateSpec

from .batchbook import BatchBook
from .cache import Cache
from .core.batches import parse_claim_label
from .inflight import (
    ClaimBook,
    Expectations,
    NamespaceRepairs,
    PoolLocks,
    PoolPacing,
    SandboxStarts,
    TemplateSpecs,
    TokenBook,
)
from .kube import Kube
from .leadership import Leadership
from .workqueue import WorkQueue

if TYPE_CHECKING:
    from .shards import Shards


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("corral")
    except PackageNotFoundError:
        return "latest"


class Settings(BaseModel):
    """Operator settings, from CORRAL_* environment variables."""

    namespace: str = Field(default="corral-system", description="The operator's own namespace (NetworkPolicy ingress).")
    execd_image: str = Field(default_factory=lambda: f"corral/controller:{_version()}",
                             description="Image carrying the execd bundle (the operator image carries it).")
    token_secret: str = Field(default="", description="Key for per-sandbox execd tokens (HMAC); random if unset.")
    workers: int = Field(default=64, ge=1, le=1024, description="Concurrent reconciles.")
    max_batch: int = Field(default=32, ge=1, le=500, description="Largest create/delete batch (slow start cap).")
    metrics_port: int = Field(default=9090, ge=0, le=65535, description="Prometheus port (0: off).")
    kubeconfig: str | None = Field(default=None, description="kubeconfig path (default: in-cluster or ~/.kube/config).")
    claim_quiet: float = Field(default=0.15, ge=0, le=10, description=(
        "Seconds without a claim decision on a WarmPool before its refill and its cosmetic status writes run: "
        "a stream of claims gets the API server first."))
    max_refill_defer: float = Field(default=0.5, ge=0, le=600, description=(
        "Longest a refill waits for a claim stream: a stream that does not pause refills its pool in chunks this "
        "far apart (at once when the pool would run low)."))
    sandbox_settle: float = Field(default=0.3, ge=0, le=10, description=(
        "Seconds a sandbox whose pod is still starting waits before writing an intermediate (not Ready) status: a pod "
        "that gets Ready meanwhile costs one status write instead of one per pod phase. Ready is written at once."))
    status_interval: float = Field(default=0.5, ge=0, le=30, description=(
        "Least seconds between two status writes of one WarmPool/Pool (the last state is always written)."))
    peering_lifetime: int = Field(default=60, ge=5, le=3600, description=(
        "kopf peering: seconds a replica's keepalive is valid; a standby takes over at most this long after the "
        "active replica died without saying goodbye."))

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        mapping = {
            "namespace": "CORRAL_NAMESPACE", "execd_image": "CORRAL_EXECD_IMAGE",
            "token_secret": "CORRAL_TOKEN_SECRET", "workers": "CORRAL_WORKERS", "max_batch": "CORRAL_MAX_BATCH",
            "metrics_port": "CORRAL_METRICS_PORT", "kubeconfig": "KUBECONFIG",
            "claim_quiet": "CORRAL_CLAIM_QUIET", "max_refill_defer": "CORRAL_MAX_REFILL_DEFER",
            "status_interval": "CORRAL_STATUS_INTERVAL", "sandbox_settle": "CORRAL_SANDBOX_SETTLE",
            "peering_lifetime": "CORRAL_PEERING_LIFETIME",
        }
        return cls.model_validate({k: env[v] for k, v in mapping.items() if env.get(v)})


@dataclass
class Context:
    """Settings, the API client, the cache, the queue, and one small type per piece of in-flight state
    (corral.operator.inflight: each says what it holds and when each entry goes)."""

    settings: Settings
    kube: Kube
    cache: Cache
    queue: WorkQueue[tuple[str, str, str]] | None = None
    token_key: bytes = b""
    leadership: Leadership = field(default_factory=Leadership)
    creates: Expectations = field(default_factory=Expectations)
    claims: ClaimBook = field(default_factory=ClaimBook)
    pacing: PoolPacing = field(init=False)
    starts: SandboxStarts = field(init=False)
    namespaces: NamespaceRepairs = field(default_factory=NamespaceRepairs)
    tokens: TokenBook = field(default_factory=TokenBook)
    templates: TemplateSpecs = field(default_factory=TemplateSpecs)
    pool_locks: PoolLocks = field(default_factory=PoolLocks)
    _http: httpx.AsyncClient | None = None
    # SandboxBatches: per-index entries, task followers, batches waiting for a pool (batchbook.py)
    batches: BatchBook = field(default_factory=BatchBook)
    # sharded mode (corral.operator.shards.Shards): only keys of the shards this replica holds are reconciled
    shards: Shards | None = None

    def __post_init__(self) -> None:
        self.token_key = (self.settings.token_secret or secrets.token_hex(32)).encode()
        self.pacing = PoolPacing(claim_quiet=self.settings.claim_quiet,
                                 max_refill_defer=self.settings.max_refill_defer,
                                 status_interval=self.settings.status_interval)
        self.starts = SandboxStarts(settle=self.settings.sandbox_settle)

    def http(self) -> httpx.AsyncClient:
        """One pooled HTTP client for talking to sandboxes' execd. No cap on open connections: each running batch
        task holds its wait stream open for as long as it runs, so httpx's default of 100 made a batch's 101st task
        wait for a slot (PoolTimeout) and its ended tasks' output reads time out behind the open streams. Idle
        connections kept for reuse stay bounded."""
        if self._http is None:
            self._http = httpx.AsyncClient(
                timeout=10, limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        return self._http

    def namespace_terminating(self, ns: str, now: float) -> None:
        """A create in `ns` was refused: the namespace is being deleted (its sandboxes' pods are going first), and its
        execd key Secret with it."""
        self.namespaces.mark_terminating(ns, now)
        self.tokens.namespace_gone(ns)

    def forget(self, picks: Callable[[tuple[str, str, str]], bool]) -> None:
        """Drop what is kept in memory for the objects whose reconcile key `picks` (kind, namespace, name) says: a
        shard this replica no longer holds, or takes (back) now (corral.operator.shards). Another replica acts on
        them meanwhile, so what this one remembers of its own writes is stale, and the cleanups of the ones deleted
        meanwhile ran there. Claims and batch indexes by their holder's key, sandboxes by theirs, pools by theirs;
        the batches' states (task followers) are stopped; a claim token this process put into a sandbox's execd
        stays noted while the sandbox exists (a later take-back then restarts its pod if execd does not answer,
        the safe side). Template specs and namespace state are no shard's and stay."""

        def holder(ns: str, name: str) -> bool:
            batch = parse_claim_label(name)
            return picks(("SandboxBatch", ns, batch[0]) if batch else ("SandboxClaim", ns, name))

        self.claims.forget_where(holder)
        self.starts.forget_where(lambda key: picks(("Sandbox", *key)))
        self.tokens.forget_where(lambda key: self.cache.sandbox(*key) is None and picks(("Sandbox", *key)))
        self.creates.forget_where(lambda key: picks(key))
        self.pacing.forget_where(lambda key: picks(key))
        for key in [k for k in self.batches.waiting if picks(k)]:
            del self.batches.waiting[key]
        for ns, name in [k for k in self.batches.states if picks(("SandboxBatch", *k))]:
            self.batches.forget(ns, name)

    # ---- the names reconcile/batches.py still uses (it moves to the books above in its own change) -----------------
    @property
    def reserved(self) -> dict[tuple[str, str], tuple[str, str]]:
        return self.claims.reserved

    @property
    def bound(self) -> dict[tuple[str, str], str]:
        return self.claims.bound

    def claim_decided(self, kind: str, ns: str, pool: str) -> None:
        self.pacing.claim_decided(kind, ns, pool)

    def template_spec(self, template: dict[str, Any]) -> tuple[SandboxTemplateSpec, str]:
        return self.templates.spec(template)

    def pool_lock(self, ns: str, name: str) -> contextlib.AbstractAsyncContextManager[None]:
        return self.pool_locks.hold(ns, name)

    # ---- reconcile requests ----------------------------------------------------------------------------------------
    def owns(self, kind: str, namespace: str, name: str) -> bool:
        """Whether this replica reconciles the key (always, unless sharded and its shard is another's)."""
        return self.shards is None or self.shards.owns_key((kind, namespace, name))

    def request(self, kind: str, namespace: str, name: str) -> None:
        if self.queue is not None and self.owns(kind, namespace, name):
            self.queue.add((kind, namespace, name))

    def cancel_at(self, kind: str, namespace: str, name: str) -> None:
        if self.queue is not None:
            self.queue.cancel_at((kind, namespace, name))

    def request_at(self, kind: str, namespace: str, name: str, when: float) -> None:
        if self.queue is not None and self.owns(kind, namespace, name):
            self.queue.add_at((kind, namespace, name), when)
