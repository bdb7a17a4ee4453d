"""Everything a reconciler needs, in one object: settings, the API client, the cache, the queue and the in-memory
expectations that bridge the gap between our own writes and the watch events that report them."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, Field

from .cache import Cache
from .kube import Kube
from .workqueue import WorkQueue


class Settings(BaseModel):
    """Operator settings, from CORRAL_* environment variables."""

    namespace: str = Field(default="corral-system", description="The operator's own namespace (NetworkPolicy ingress).")
    execd_image: str = Field(default="corral/execd:latest", description="Image carrying the execd bundle.")
    token_secret: str = Field(default="", description="Key for per-sandbox execd tokens (HMAC); random if unset.")
    workers: int = Field(default=64, ge=1, le=1024, description="Concurrent reconciles.")
    max_batch: int = Field(default=32, ge=1, le=500, description="Largest create/delete batch (slow start cap).")
    metrics_port: int = Field(default=9090, ge=0, le=65535, description="Prometheus port (0: off).")
    kubeconfig: str | None = Field(default=None, description="kubeconfig path (default: in-cluster or ~/.kube/config).")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        mapping = {
            "namespace": "CORRAL_NAMESPACE", "execd_image": "CORRAL_EXECD_IMAGE",
            "token_secret": "CORRAL_TOKEN_SECRET", "workers": "CORRAL_WORKERS", "max_batch": "CORRAL_MAX_BATCH",
            "metrics_port": "CORRAL_METRICS_PORT", "kubeconfig": "KUBECONFIG",
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
    queue: WorkQueue | None = None
    token_key: bytes = b""
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
    _http: httpx.AsyncClient | None = None
    # one lock per Pool: its capacity check and creates (refill or a claim's cold start) never interleave
    _pool_locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    def pool_lock(self, ns: str, name: str) -> asyncio.Lock:
        return self._pool_locks.setdefault((ns, name), asyncio.Lock())

    def http(self) -> httpx.AsyncClient:
        """One pooled HTTP client for talking to sandboxes' execd."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=10)
        return self._http

    def __post_init__(self) -> None:
        self.token_key = (self.settings.token_secret or secrets.token_hex(32)).encode()

    def request(self, kind: str, namespace: str, name: str) -> None:
        if self.queue is not None:
            self.queue.add((kind, namespace, name))

    def cancel_at(self, kind: str, namespace: str, name: str) -> None:
        if self.queue is not None:
            self.queue.cancel_at((kind, namespace, name))

    def request_at(self, kind: str, namespace: str, name: str, when: float) -> None:
        if self.queue is not None:
            self.queue.add_at((kind, namespace, name), when)
