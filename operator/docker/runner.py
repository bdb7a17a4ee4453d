"""Where the Docker runtime's work runs: blocking Docker and SQLite calls on a bounded thread pool (`run`, counted by
operation in corral_docker_calls_total), and background tasks on the event loop (`spawn`), kept referenced until they
end and logged when one fails. Every part of the runtime gets the one Runner it shares; `stop` cancels whatever is
still in flight."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .metrics import DOCKER_CALLS

log = logging.getLogger("corral.operator.docker")
T = TypeVar("T")


class Runner:
    def __init__(self, threads: int):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="docker")
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The runtime's event loop (set by `attach`, from DockerRuntime.start)."""
        assert self._loop is not None, "Runner.attach() was not called"
        return self._loop

    def attach(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def run(self, fn: Callable[..., T], *args: Any, op: str = "", **kw: Any) -> T:
        """`fn(*args, **kw)` on the thread pool; `op` names a Docker operation for corral_docker_calls_total."""
        try:
            out = await self.loop.run_in_executor(self._pool, lambda: fn(*args, **kw))
        except Exception:
            if op:
                DOCKER_CALLS.labels(op, "error").inc()
            raise
        if op:
            DOCKER_CALLS.labels(op, "ok").inc()
        return out

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        return task

    def spawn_threadsafe(self, coro: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """From another thread (the engine's event stream): spawn `coro()` on the loop."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(lambda: self.spawn(coro()))

    async def stop(self, *also: asyncio.Task[Any]) -> None:
        """Cancel the background tasks (and `also`), wait for them, and drop the thread pool's queued calls."""
        tasks = [*self._tasks, *also]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())
