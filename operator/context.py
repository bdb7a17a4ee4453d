"""Everything a reconciler needs, in one object: settings, the API client, the cache, the queue and the in-memory
expectations that bridge the gap between our own writes and the watch events that report them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, Field

from corral.api import SandboxTemplateSpec, validate

from .batchbook import BatchBook
from .builders import blueprint_hash
from .cache import Cache
from .kube import Kube
from .leadership import Leadership
from .workqueue import WorkQueue


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
    max_refill_defer: float = Field(
        default=30.0, ge=0, le=600, description="Longest a refill waits for a claim stream.")
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
class Expectations:
    """Creates we made but have not seen in the cache yet, per pool; they expire after `ttl` seconds."""

    ttl: float = 60.0
    _pending: dict[Any, dict[str, float]] = field(default_factory=dict)

    def expect(self, key: Any, name: str) -> None:
        self._pending.setdefault(key, {})[name] = time.monotonic()

    def outstanding(self, key: Any, seen: set[str]) -> int:
        now = time.monotonic()
        pending = self._pending.get(key, {})
        for name in [n for n, t in pending.items() if n in seen or now - t > self.ttl]:
            del pending[name]
        return len(pending)


@dataclass
class Context:
    settings: Settings
    kube: Kube
    cache: Cache
    queue: WorkQueue[tuple[str, str, str]] | None = None
    token_key: bytes = b""
    leadership: Leadership = field(default_factory=Leadership)
    creates: Expectations = field(default_factory=Expectations)
    # sandbox name -> claim key, for adoptions the cache has not reported yet (no double use in one process)
    reserved: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # claim key -> sandbox name, bound but not yet reflected in the cache
    bound: dict[tuple[str, str], str] = field(default_factory=dict)
    # (ns, sandbox) -> time we created its pod (until the pod shows up)
    pod_creates: dict[tuple[str, str], float] = field(default_factory=dict)
    # claim key -> the phase we last wrote to its status, until the watch shows it (no second write meanwhile)
    phase_written: dict[tuple[str, str], str] = field(default_factory=dict)
    # claim key -> when the operator first saw it pending (claim latency starts here)
    first_seen: dict[tuple[str, str], float] = field(default_factory=dict)
    # (kind, ns, pool) -> wall time of the last claim decision on that pool (see `claims_streaming`)
    claim_activity: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # (kind, ns, pool) -> when its refill first waited for the current claim stream
    refill_deferred: dict[tuple[str, str, str], float] = field(default_factory=dict)
    # (ns, sandbox) -> when its pending intermediate status was first held back (see Settings.sandbox_settle)
    settling: dict[tuple[str, str], float] = field(default_factory=dict)
    # (kind, ns, pool) -> wall time of its last status write
    status_written: dict[tuple[str, str, str], float] = field(default_factory=dict)
    _http: httpx.AsyncClient | None = None
    # (ns, sandbox) -> (pod uid, claim uid) whose claim token this process put into that pod's execd (tokens.py)
    installed: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)
    # namespaces whose execd key Secret this process has created (or found): one create per namespace
    key_secrets: set[str] = field(default_factory=set)
    # namespace -> when a create in it was refused because it is being deleted (see `terminating_since`)
    terminating: dict[str, float] = field(default_factory=dict)
    # namespace -> the lost-pod repair in flight there, that the others wait for (see `pod_repair`)
    _repairs: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    # (ns, template) -> (uid, generation, validated spec, blueprint hash): see `template_spec`
    _templates: dict[tuple[str, str], tuple[str, Any, SandboxTemplateSpec, str]] = field(default_factory=dict)
    # one lock per Pool: its capacity check and creates (refill or a claim's cold start) never interleave
    _pool_locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    # SandboxBatches: per-index entries, task followers, batches waiting for a pool (batchbook.py)
    batches: BatchBook = field(default_factory=BatchBook)

    def pool_lock(self, ns: str, name: str) -> asyncio.Lock:
        return self._pool_locks.setdefault((ns, name), asyncio.Lock())

    def http(self) -> httpx.AsyncClient:
        """One pooled HTTP client for talking to sandboxes' execd."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10)
        return self._http

    def template_spec(self, template: dict[str, Any]) -> tuple[SandboxTemplateSpec, str]:
        """A SandboxTemplate's validated spec and blueprint hash, worked out once per spec generation (every claim and
        every pool reconcile needs them: validating and hashing each time was ~10% of the operator's CPU in a claim
        burst). Raises CorralValidationError for an invalid spec (not cached: the template reports it)."""
        meta = template["metadata"]
        key, version = (meta["namespace"], meta["name"]), (meta.get("uid", ""), meta.get("generation"))
        hit = self._templates.get(key)
        if hit is not None and hit[:2] == version:
            return hit[2], hit[3]
        spec = validate(SandboxTemplateSpec, template["spec"])
        bp_hash = blueprint_hash(spec)
        self._templates[key] = (*version, spec, bp_hash)
        return spec, bp_hash

    def namespace_terminating(self, ns: str, now: float) -> None:
        """A create in `ns` was refused: the namespace is being deleted (its sandboxes' pods are going first)."""
        self.terminating.setdefault(ns, now)
        self.key_secrets.discard(ns)  # its execd key Secret goes with it
        for other, since in list(self.terminating.items()):
            if now - since > 600:  # long gone (or re-created: newer sandboxes are never skipped anyway)
                del self.terminating[other]

    @contextlib.asynccontextmanager
    async def pod_repair(self, ns: str) -> AsyncIterator[None]:
        """Around re-creating a lost pod in `ns`: while one such repair is in flight there, the others wait for it,
        then go on together. When a namespace is deleted its pods go before its sandboxes, and every sandbox looks
        like one to repair: the first refusal marks the namespace terminating (see `namespace_terminating`), and the
        repairs that waited for it then find that and skip, however many arrived meanwhile. A real repair wave (a
        node lost) pays one extra round trip."""
        ahead = self._repairs.get(ns)
        if ahead is not None:
            await asyncio.shield(ahead)  # a waiter cancelled must not cancel the others' wait
            yield
            return
        done = asyncio.get_running_loop().create_future()
        self._repairs[ns] = done
        try:
            yield
        finally:
            del self._repairs[ns]
            done.set_result(None)

    def terminating_since(self, ns: str, created: float) -> bool:
        """Whether a sandbox created at `created` sits in a namespace seen being deleted after it was made: repairing
        its pod would only be refused (one GET and one create per sandbox, thousands in a big namespace)."""
        since = self.terminating.get(ns)
        return since is not None and created <= since

    def __post_init__(self) -> None:
        self.token_key = (self.settings.token_secret or secrets.token_hex(32)).encode()

    def claim_decided(self, kind: str, ns: str, pool: str) -> None:
        """A claim on this pool is being decided (warm adoption or cold start)."""
        self.claim_activity[(kind, ns, pool)] = time.time()

    def claims_streaming(self, kind: str, ns: str, pool: str, now: float, quiet: float | None = None) -> float | None:
        """If claims on this pool were decided within the last `claim_quiet` seconds: when that quiet period ends.

        Work that only restores capacity or reports it (a refill, a status echo) waits for the quiet moment after a
        stream of claims, so on a small machine the claims get the API server (and the operator's CPU) first. One
        claim after another at 20-50 ms intervals is such a stream; at 0.5 s intervals it is not."""
        quiet = self.settings.claim_quiet if quiet is None else quiet
        last = self.claim_activity.get((kind, ns, pool))
        if last is None or now - last >= quiet:
            return None
        return last + quiet

    def refill_wait(self, kind: str, ns: str, pool: str, now: float, ready_idle: int, low_water: int) -> float | None:
        """When to refill instead of now (None: now). A refill never waits once the ready idle sandboxes fall below
        `low_water`, nor longer than `max_refill_defer` in all."""
        key = (kind, ns, pool)
        until = self.claims_streaming(kind, ns, pool, now)
        if until is None or ready_idle < low_water:
            self.refill_deferred.pop(key, None)
            return None
        since = self.refill_deferred.setdefault(key, now)
        if now - since >= self.settings.max_refill_defer:
            self.refill_deferred.pop(key, None)
            return None
        return min(until, since + self.settings.max_refill_defer)

    def status_wait(self, kind: str, ns: str, pool: str, now: float) -> float | None:
        """When a pool's routine status write may go (None: now): not during a claim stream on it, and not sooner than
        `status_interval` after the previous one."""
        key = (kind, ns, pool)
        until = max(self.claims_streaming(kind, ns, pool, now) or 0.0,
                    self.status_written.get(key, 0.0) + self.settings.status_interval)
        return until if until > now else None

    def request(self, kind: str, namespace: str, name: str) -> None:
        if self.queue is not None:
            self.queue.add((kind, namespace, name))

    def cancel_at(self, kind: str, namespace: str, name: str) -> None:
        if self.queue is not None:
            self.queue.cancel_at((kind, namespace, name))

    def request_at(self, kind: str, namespace: str, name: str, when: float) -> None:
        if self.queue is not None:
            self.queue.add_at((kind, namespace, name), when)
