"""PoolPacing: claims first, then the work that only restores or reports a pool's capacity, at the pace the claims
take it away.

A refill costs ~7 API writes per sandbox and a status echo one more; during a stream of claims on a small control
plane each of them delays every claim behind it. So a claim decision on a pool (a warm adoption or a cold start)
is noted, and that pool's refill and routine status writes wait for the quiet moment after the stream. A stream
that never pauses (a steady 10 or 50 claims a second) must not drain the pool, though: during one, the refill runs
in chunks, one every `max_refill_defer` seconds, each about what the claims took meanwhile; and all of it at once
when the ready sandboxes would otherwise run out before a sandbox created now is Ready (`refill`).

- claim activity, (kind, ns, pool) -> wall time of the last claim decision (`claim_decided`): a stream is claims
  less than `claim_quiet` apart (`claims_streaming`); and when the current stream began: a refill waits for the
  claims still undecided (a burst's), not those of an established stream (`waits_for_claims`);
- claim times, (kind, ns, pool) -> the claim decisions of the last `rate_window` seconds: the stream's rate
  (`claim_rate`). A cold claim waiting for its sandbox is decided again on each pass: a pool that ran dry sees a
  higher rate than its claims', and refills harder;
- deferred refills, (kind, ns, pool) -> when the refill first waited in the current stream: it waits at most
  `max_refill_defer`, then a chunk runs. Gone when a refill runs;
- refills in flight, (kind, ns, pool) -> {sandbox: when this process created it}, and the pool's ready lag (created
  -> seen Ready, a moving average; `ready_guess` until measured): how far ahead a refill must start. An entry goes
  when its sandbox is seen Ready (a sample), leaves the pool, or after `REFILL_TTL` seconds;
- status writes, (kind, ns, pool) -> wall time of the pool's last status write: routine ones are at least
  `status_interval` apart (`status_wait`).

Every entry goes with its pool (`pool_gone`); claim activity is noted only for pools that exist. A restarted
operator starts with no stream in progress, which only means one refill that does not wait.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PoolKey = tuple[str, str, str]  # (kind, namespace, pool)
REFILL_TTL = 120.0  # seconds a refill is followed before it no longer counts as one (a pod that never gets Ready)
UNSEEN_GRACE = 5.0  # seconds a refill may take to show up in the cache before it counts as gone
STEADY_STREAM = 10.0  # seconds after which a claim stream is no burst: its refill never waits for its claims
STATUS_MAX_DEFER = 5.0  # seconds a routine status write waits for a claim stream at most
LAG_WEIGHT = 0.2  # the weight of a new ready-lag sample in the moving average
MAX_CLAIM_TIMES = 4096  # claim decisions kept per pool at most (a rate of 2,000/s over the default window)


@dataclass
class PoolPacing:
    claim_quiet: float = 0.15
    max_refill_defer: float = 0.5
    status_interval: float = 0.5
    rate_window: float = 2.0
    ready_guess: float = 1.0
    _claim_activity: dict[PoolKey, float] = field(default_factory=dict)
    _stream_start: dict[PoolKey, float] = field(default_factory=dict)
    _claim_times: dict[PoolKey, deque[float]] = field(default_factory=dict)
    _refill_deferred: dict[PoolKey, float] = field(default_factory=dict)
    _refilling: dict[PoolKey, dict[str, float]] = field(default_factory=dict)
    _ready_lag: dict[PoolKey, float] = field(default_factory=dict)
    _status_written: dict[PoolKey, float] = field(default_factory=dict)

    # ---- claims -------------------------------------------------------------------------------------------------
    def claim_decided(self, kind: str, ns: str, pool: str, now: float | None = None) -> None:
        """A claim on this pool is being decided (warm adoption or cold start)."""
        key = (kind, ns, pool)
        now = time.time() if now is None else now
        last = self._claim_activity.get(key)
        if last is None or now - last >= self.claim_quiet:
            self._stream_start[key] = now
        self._claim_activity[key] = now
        times = self._claim_times.get(key)
        if times is None:
            times = self._claim_times[key] = deque(maxlen=MAX_CLAIM_TIMES)
        times.append(now)
        while times and now - times[0] >= self.rate_window:
            times.popleft()

    def claims_streaming(self, kind: str, ns: str, pool: str, now: float, quiet: float | None = None) -> float | None:
        """If claims on this pool were decided within the last `quiet` seconds (`claim_quiet` by default): when that
        quiet period ends. One claim after another at 20-50 ms intervals is a stream; at 0.5 s intervals it is not."""
        quiet = self.claim_quiet if quiet is None else quiet
        last = self._claim_activity.get((kind, ns, pool))
        if last is None or now - last >= quiet:
            return None
        return last + quiet

    def waits_for_claims(self, kind: str, ns: str, pool: str, now: float, *, undecided: int, ready_idle: int) -> bool:
        """Whether the pool's refill waits for its `undecided` claims (claims not yet warm nor cold): a burst's
        claims are decided before the refill takes the API server (so a burst of N against R ready sandboxes gets
        exactly R warm). Not in a stream going on for `rate_window` seconds or more while the pool has a ready
        sandbox for each waiting claim: at 20 claims a second a claim is nearly always waiting, and the refill has
        to keep pace among them. Nor in a stream going on for STEADY_STREAM seconds, whatever waits: on a
        saturated control plane claims queue up, the pool runs dry, and a refill that waited for the queue to
        clear left every claim cold for as long as the stream lasted."""
        if undecided <= 0:
            return False
        start = self._stream_start.get((kind, ns, pool))
        if self.claims_streaming(kind, ns, pool, now) is None or start is None:
            return True
        age = now - start
        if age >= STEADY_STREAM:
            return False  # no burst lasts this long: a pool run dry by a stream must refill, claims waiting or not
        return age < self.rate_window or undecided > ready_idle

    def claim_rate(self, kind: str, ns: str, pool: str, now: float) -> float:
        """Claim decisions per second on this pool over the last `rate_window` seconds."""
        times = self._claim_times.get((kind, ns, pool))
        if not times:
            return 0.0
        return sum(1 for t in times if now - t < self.rate_window) / self.rate_window

    # ---- refills ------------------------------------------------------------------------------------------------
    def refill(self, kind: str, ns: str, pool: str, now: float, *, deficit: int, ready_idle: int, starting: int,
               low_water: int) -> tuple[int, float | None]:
        """How many of the pool's `deficit` missing sandboxes to create now, and when to look at the pool again for
        the rest (None: no need). `ready_idle` sandboxes can be claimed now, `starting` ones (created, not Ready
        yet) soon.

        - No claim stream: all of them.
        - During a stream, all of them at once if the ready sandboxes would run low before the next chunk's
          sandboxes are Ready (under `low_water`, counting the claims expected meanwhile at the stream's rate).
        - Otherwise the refill waits, `max_refill_defer` at most from when it first waited (or for the end of the
          stream, if sooner); then a chunk: twice what the claims took in that time at their rate, or less, so the
          refill keeps up without a storm of creates among the claims.
        """
        key = (kind, ns, pool)
        if deficit <= 0:
            self._refill_deferred.pop(key, None)
            return 0, None
        until = self.claims_streaming(kind, ns, pool, now)
        if until is None:
            self._refill_deferred.pop(key, None)
            return deficit, None
        rate = self.claim_rate(kind, ns, pool, now)
        horizon = self.ready_lag(kind, ns, pool) + self.max_refill_defer
        if ready_idle < low_water or ready_idle + starting - rate * horizon < low_water:
            self._refill_deferred.pop(key, None)
            return deficit, None
        since = self._refill_deferred.setdefault(key, now)
        if now - since < self.max_refill_defer:
            return 0, min(until, since + self.max_refill_defer)
        self._refill_deferred.pop(key, None)
        chunk = min(deficit, max(1, math.ceil(2 * rate * self.max_refill_defer)))
        return chunk, (None if chunk == deficit else min(until, now + self.max_refill_defer))

    def refill_started(self, kind: str, ns: str, pool: str, sandbox: str, now: float) -> None:
        """This process created `sandbox` to refill the pool."""
        self._refilling.setdefault((kind, ns, pool), {})[sandbox] = now

    def following(self, kind: str, ns: str, pool: str) -> bool:
        """Whether refills of this pool are followed until Ready (`refills_seen` has something to look for)."""
        return bool(self._refilling.get((kind, ns, pool)))

    def refills_seen(self, kind: str, ns: str, pool: str, ready: Mapping[str, bool], now: float) -> None:
        """The pool's sandboxes as the cache shows them now (name -> Ready): refills seen Ready give a sample of the
        ready lag; those that left the pool, or were followed for REFILL_TTL, are forgotten."""
        key = (kind, ns, pool)
        refilling = self._refilling.get(key)
        if not refilling:
            return
        for name, started in list(refilling.items()):
            is_ready = ready.get(name)
            if is_ready:
                lag = max(0.0, now - started)
                prev = self._ready_lag.get(key)
                self._ready_lag[key] = lag if prev is None else prev + LAG_WEIGHT * (lag - prev)
            if is_ready or (is_ready is None and now - started > UNSEEN_GRACE) or now - started > REFILL_TTL:
                del refilling[name]  # Ready, gone (not just created: the watch may not show it yet), or too old
        if not refilling:
            del self._refilling[key]

    def ready_lag(self, kind: str, ns: str, pool: str) -> float:
        """Seconds from a refill's create to the pool seeing it Ready (a moving average; `ready_guess` until
        measured)."""
        return self._ready_lag.get((kind, ns, pool), self.ready_guess)

    # ---- status -------------------------------------------------------------------------------------------------
    def status_wait(self, kind: str, ns: str, pool: str, now: float) -> float | None:
        """When a pool's routine status write may go (None: now): not during a claim stream on it (unless the last
        one is STATUS_MAX_DEFER old: a stream that never pauses still sees its pool's status now and then), and not
        sooner than `status_interval` after the previous one."""
        last = self._status_written.get((kind, ns, pool), 0.0)
        stream = self.claims_streaming(kind, ns, pool, now) if now - last < STATUS_MAX_DEFER else None
        until = max(stream or 0.0, last + self.status_interval)
        return until if until > now else None

    def status_written(self, kind: str, ns: str, pool: str, now: float) -> None:
        self._status_written[(kind, ns, pool)] = now

    def _books(self) -> tuple[dict[PoolKey, Any], ...]:
        return (self._claim_activity, self._stream_start, self._claim_times, self._refill_deferred, self._refilling,
                self._ready_lag, self._status_written)

    def pool_gone(self, kind: str, ns: str, pool: str) -> None:
        for book in self._books():
            book.pop((kind, ns, pool), None)

    def forget_where(self, pool: Callable[[PoolKey], bool]) -> None:
        """The pools `pool` picks (a shard this replica no longer holds): as if gone. (A refill followed from before
        would give a ready-lag sample that counts the time another replica held the pool.)"""
        for book in self._books():
            for key in [k for k in book if pool(k)]:
                del book[key]

    def __len__(self) -> int:
        return sum(len(book) for book in self._books())
