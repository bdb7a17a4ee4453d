"""PoolPacing: claims first, then the work that only restores or reports a pool's capacity.

A refill costs ~7 API writes per sandbox and a status echo one more; during a stream of claims on a small control
plane each of them delays every claim behind it. So a claim decision on a pool (a warm adoption or a cold start)
is noted, and that pool's refill and routine status writes wait for the quiet moment after the stream:

- claim activity, (kind, ns, pool) -> wall time of the last claim decision (`claim_decided`): a stream is claims
  less than `claim_quiet` apart (`claims_streaming`);
- deferred refills, (kind, ns, pool) -> when the refill first waited for the current stream: it waits at most
  `max_refill_defer` in all, and never once the pool runs low (`refill_wait`). Gone when the refill runs;
- status writes, (kind, ns, pool) -> wall time of the pool's last status write: routine ones are at least
  `status_interval` apart (`status_wait`).

Every entry goes with its pool (`pool_gone`); claim activity is noted only for pools that exist. A restarted
operator starts with no stream in progress, which only means one refill that does not wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

PoolKey = tuple[str, str, str]  # (kind, namespace, pool)


@dataclass
class PoolPacing:
    claim_quiet: float = 0.15
    max_refill_defer: float = 30.0
    status_interval: float = 0.5
    _claim_activity: dict[PoolKey, float] = field(default_factory=dict)
    _refill_deferred: dict[PoolKey, float] = field(default_factory=dict)
    _status_written: dict[PoolKey, float] = field(default_factory=dict)

    def claim_decided(self, kind: str, ns: str, pool: str, now: float | None = None) -> None:
        """A claim on this pool is being decided (warm adoption or cold start)."""
        self._claim_activity[(kind, ns, pool)] = time.time() if now is None else now

    def claims_streaming(self, kind: str, ns: str, pool: str, now: float, quiet: float | None = None) -> float | None:
        """If claims on this pool were decided within the last `quiet` seconds (`claim_quiet` by default): when that
        quiet period ends. One claim after another at 20-50 ms intervals is a stream; at 0.5 s intervals it is not."""
        quiet = self.claim_quiet if quiet is None else quiet
        last = self._claim_activity.get((kind, ns, pool))
        if last is None or now - last >= quiet:
            return None
        return last + quiet

    def refill_wait(self, kind: str, ns: str, pool: str, now: float, ready_idle: int, low_water: int) -> float | None:
        """When to refill instead of now (None: now). A refill never waits once the ready idle sandboxes fall below
        `low_water`, nor longer than `max_refill_defer` in all."""
        key = (kind, ns, pool)
        until = self.claims_streaming(kind, ns, pool, now)
        if until is None or ready_idle < low_water:
            self._refill_deferred.pop(key, None)
            return None
        since = self._refill_deferred.setdefault(key, now)
        if now - since >= self.max_refill_defer:
            self._refill_deferred.pop(key, None)
            return None
        return min(until, since + self.max_refill_defer)

    def status_wait(self, kind: str, ns: str, pool: str, now: float) -> float | None:
        """When a pool's routine status write may go (None: now): not during a claim stream on it, and not sooner
        than `status_interval` after the previous one."""
        until = max(self.claims_streaming(kind, ns, pool, now) or 0.0,
                    self._status_written.get((kind, ns, pool), 0.0) + self.status_interval)
        return until if until > now else None

    def status_written(self, kind: str, ns: str, pool: str, now: float) -> None:
        self._status_written[(kind, ns, pool)] = now

    def pool_gone(self, kind: str, ns: str, pool: str) -> None:
        key = (kind, ns, pool)
        self._claim_activity.pop(key, None)
        self._refill_deferred.pop(key, None)
        self._status_written.pop(key, None)

    def __len__(self) -> int:
        return len(self._claim_activity) + len(self._refill_deferred) + len(self._status_written)
