"""What the parts of the Docker runtime share: its state, set up in DockerRuntime.__init__ (runtime.py), and the
methods one part calls on another. The pool workers (pools.py), recovery (recovery.py) and the retained listing
(retained.py) are mixins of DockerRuntime; each derives from RuntimeBase so that it is type-checked against this one
declaration instead of attributes it cannot see. Nothing here runs: the methods are declared for the type checker
only, so a part that forgot one fails at once instead of calling a stub."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import httpx

    from .desired import DesiredState, DockerTemplate
    from .runtime import Settings
    from .store import ClaimRow, SandboxRow, Store

T = TypeVar("T")


class RuntimeBase:
    s: Settings
    desired: DesiredState
    store: Store
    client: Any                                  # docker.DockerClient (the docker SDK has no type information)
    http: httpx.AsyncClient
    pool_sem: asyncio.Semaphore
    execd_volume: str
    _wake: dict[str, asyncio.Event]              # per pool worker
    _waiters: dict[str, asyncio.Event]           # per claim waiting for its sandbox
    _failed: set[str]                            # sandboxes whose container died while starting
    _restarting: set[str]                        # recycled by restart: their die event is expected
    _stopping: threading.Event
    _loop: asyncio.AbstractEventLoop | None

    if TYPE_CHECKING:
        # runtime.py
        async def run(self, fn: Callable[..., T], *args: Any, op: str = "", **kw: Any) -> T: ...
        def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]: ...
        def token(self, sandbox: str, claim: ClaimRow | None = None) -> str: ...
        def wake(self, pool: str | None = None) -> None: ...
        def _notify(self, claim: str) -> None: ...
        def _port(self, sandbox: SandboxRow) -> int: ...
        def _arm_deadlines(self) -> None: ...
        def execd_unreachable(self, name: str) -> None: ...
        async def _cold_start(self, claim: str, sandbox: SandboxRow, tmpl: DockerTemplate, t0: float) -> None: ...

        # pools.py
        async def _delete_sandbox(self, name: str) -> None: ...
        async def _start_sandbox(self, row: SandboxRow, tmpl: DockerTemplate, env: dict[str, str],
                                 token: str) -> None: ...

        # recovery.py
        async def _lose(self, row: SandboxRow, why: str) -> None: ...
