"""A keyed work queue: the same key never runs twice at once, repeated requests coalesce, failures back off.

Watch events and deadline timers only *request* a reconcile of a key; a bounded pool of workers runs them. This is
what keeps the operator exact (one reconcile per object at a time) and bounded (a burst of 1,000 events is at most
`workers` concurrent reconciles), and idle when nothing changes (no timers but known deadlines). Keys carry a
priority: waiting claims go before sandboxes, sandboxes before pools, so a burst of claims is served before the
pools start refilling.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger("corral.operator.queue")

Key = TypeVar("Key", bound=Hashable)  # what a reconcile request names (the operator's: (kind, namespace, name))


class WorkQueue(Generic[Key]):
    def __init__(self, handler: Callable[[Key], Awaitable[None]], workers: int = 32,
                 max_backoff: float = 60.0, priority: Callable[[Key], int] = lambda key: 0) -> None:
        self._handler = handler
        self._workers_n = workers
        self._priority = priority
        self._seq = 0
        self._queue: asyncio.PriorityQueue[tuple[int, int, Key]] = asyncio.PriorityQueue()
        self._queued: set[Key] = set()
        self._running: set[Key] = set()
        self._dirty: set[Key] = set()
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._failures: dict[Key, int] = {}
        self._max_backoff = max_backoff
        self._tasks: list[asyncio.Task[None]] = []
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()  # cleared while held: requests queue up, nothing runs
        self._open.set()

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(i), name=f"corral-worker-{i}") for i in range(self._workers_n)]

    async def stop(self) -> None:
        for handle in (h for _, h in self._timers.values()):
            handle.cancel()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def add(self, key: Key) -> None:
        """Request a reconcile of key (coalesced with any pending request)."""
        if key in self._running:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._idle.clear()
            self._seq += 1
            self._queue.put_nowait((self._priority(key), self._seq, key))

    def add_at(self, key: Key, when: float) -> None:
        """Request a reconcile of key at wall-clock time `when` (keeps only the earliest pending deadline)."""
        delay = max(0.0, when - time.time())
        current = self._timers.get(key)
        if current and current[0] <= when:
            return
        if current:
            current[1].cancel()
        loop = asyncio.get_running_loop()
        self._timers[key] = (when, loop.call_later(delay, self._fire, key))

    def cancel_at(self, key: Key) -> None:
        """Drop key's pending deadline, if any (a reconcile re-arms the deadlines it still needs)."""
        current = self._timers.pop(key, None)
        if current:
            current[1].cancel()

    def cancel_where(self, pred: Callable[[Key], bool]) -> int:
        """Cancel the pending timers of every key `pred` picks (a shard this replica no longer holds); how many."""
        keys = [k for k in self._timers if pred(k)]
        for k in keys:
            self.cancel_at(k)
        return len(keys)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def hold(self) -> None:
        """Run nothing new until `release` (reconciles already running finish); requests and timers still queue."""
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    @property
    def held(self) -> bool:
        return not self._open.is_set()

    @property
    def pending_timers(self) -> int:
        return len(self._timers)

    async def wait_idle(self) -> None:
        await self._idle.wait()

    async def _worker(self, index: int) -> None:
        while True:
            await self._open.wait()
            prio, seq, key = await self._queue.get()
            if not self._open.is_set():  # held while this worker waited for work: the key waits for the release
                self._queue.put_nowait((prio, seq, key))
                self._queue.task_done()
                continue
            self._queued.discard(key)
            self._running.add(key)
            try:
                await self._handler(key)
                self._failures.pop(key, None)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a reconcile failure is retried with backoff, never fatal
                n = self._failures[key] = self._failures.get(key, 0) + 1
                delay = min(self._max_backoff, 0.2 * 2 ** (n - 1))
                log.exception("reconcile of %s failed (attempt %d); retrying in %.1fs", key, n, delay)
                self.add_at(key, time.time() + delay)
            finally:
                self._running.discard(key)
                self._queue.task_done()
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.add(key)
                if not self._queued and not self._running:
                    self._idle.set()
            # A reconcile that did no I/O never yielded: yield now, so that a loop of keys requesting each other can
            # never starve the event loop (watch streams, probes, the claims API, signals).
            await asyncio.sleep(0)
