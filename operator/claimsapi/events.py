"""GET /v1/batches/{name}/events: a backend's `watch_batch` states as NDJSON lines (corral.api.wire.BatchEvent).

`BatchFollower` is the whole rule, pure: from each state it makes a `task` line for every index that has ended and was
not sent yet, a `progress` line when the phase or counts changed and no task line carried them, and the `end` line
once the batch is finished (after its task lines). `ndjson` drives it over the backend's iterator and adds a
`progress` line after BATCH_KEEPALIVE_SECONDS without one (so a proxy or the SDK can tell a quiet batch from a dead
connection); the stream ends after `end` or `error`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Literal

from corral.api.wire import BATCH_KEEPALIVE_SECONDS, Batch, BatchEvent, BatchTaskResult, Error

from .backend import BackendError

Counts = tuple[str, int, int, int, int, int]


def counts(batch: Batch) -> Counts:
    return batch.phase, batch.replicas, batch.bound, batch.running, batch.succeeded, batch.failed


def event(batch: Batch, type_: Literal["progress", "task", "end", "error"], task: BatchTaskResult | None = None,
          error: Error | None = None) -> BatchEvent:
    return BatchEvent(type=type_, batch=batch.name, phase=batch.phase, replicas=batch.replicas, bound=batch.bound,
                      running=batch.running, succeeded=batch.succeeded, failed=batch.failed, task=task, error=error)


class BatchFollower:
    def __init__(self) -> None:
        self.sent: set[int] = set()
        self.last: Batch | None = None
        self._counts: Counts | None = None
        self.ended = False

    def step(self, batch: Batch) -> list[BatchEvent]:
        out = [event(batch, "task", r) for r in batch.results if r.ended and r.index not in self.sent]
        self.sent.update(e.task.index for e in out if e.task is not None)
        if not out and counts(batch) != self._counts:
            out.append(event(batch, "progress"))
        if batch.finished:
            out.append(event(batch, "end"))
            self.ended = True
        self.last, self._counts = batch, counts(batch)
        return out

    def keepalive(self) -> BatchEvent | None:
        return event(self.last, "progress") if self.last is not None else None

    def error(self, exc: BackendError) -> BatchEvent | None:
        self.ended = True
        return event(self.last, "error", error=Error(code=exc.code, message=exc.message)) if self.last else None


def line(ev: BatchEvent) -> bytes:
    return ev.model_dump_json(by_alias=True).encode() + b"\n"


async def ndjson(first: Batch, states: AsyncIterator[Batch],
                 keepalive: float = BATCH_KEEPALIVE_SECONDS) -> AsyncIterator[bytes]:
    """The stream's lines: from `first` (already read, so a missing batch was a 404 before the stream began), then
    from each later state of `states`."""
    follower = BatchFollower()
    for ev in follower.step(first):
        yield line(ev)
    pending: asyncio.Future[Any] | None = None
    try:
        while not follower.ended:
            if pending is None:
                pending = asyncio.ensure_future(anext(states))
            done, _ = await asyncio.wait({pending}, timeout=keepalive)
            if not done:
                if (alive := follower.keepalive()) is not None:
                    yield line(alive)
                continue
            got, pending = pending, None
            try:
                batch = got.result()
            except StopAsyncIteration:
                return
            except BackendError as exc:
                if (failed := follower.error(exc)) is not None:
                    yield line(failed)
                return
            for ev in follower.step(batch):
                yield line(ev)
    finally:
        if pending is not None:  # the client went away mid-wait: stop the backend's step, then close its iterator
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        aclose = getattr(states, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
