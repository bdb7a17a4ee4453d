"""Which replica is the active one, as kopf peering decides it, for what kopf does not pause by itself.

With `--peering`, kopf pauses every replica but the one with the highest priority among the live peers listed in
the peering object's status (and all of them when two share a priority). A paused replica gets no watch events, so
its indices go stale; its claims HTTP API must not answer from them. kopf does not expose its pause state, so this
module watches the same peering object and applies the same rule, with kopf's own notion of a dead peer (last seen
more than its lifetime ago). kopf touches its own entry when a blocking peer expires, so the decision is event-driven;
a timer at the blocking peer's deadline re-evaluates it without any API call in case that event is slow.

When the active state changes, the replica labels its own pod (`corral.dev/claims-api: active`, removed on standby
and on shutdown): the chart's claims API Service selects that label, so API traffic goes to the active replica only.
A standby replica that is asked anyway answers 503 (see `api.kube_backend`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from lightkube.generic_resource import create_global_resource

from .constants import L_CLAIMS_API

log = logging.getLogger("corral.operator.leadership")

ClusterKopfPeering = create_global_resource("kopf.dev", "v1", "ClusterKopfPeering", "clusterkopfpeerings")


def decide(status: Mapping[str, Any], me: str, priority: int, now: datetime) -> tuple[bool, float | None]:
    """kopf's rule over a peering object's status: (active, seconds until a blocking peer expires, if any).

    Active when no live peer other than `me` has a priority >= ours (an equal one pauses both, as kopf does)."""
    blocking: list[float] = []
    for identity, info in status.items():
        if identity == me or not isinstance(info, Mapping):
            continue
        seen = info.get("lastseen")
        last = datetime.fromisoformat(seen) if seen else now
        if last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        left = (last - now).total_seconds() + int(info.get("lifetime", 60))
        if left > 0 and int(info.get("priority", 0)) >= priority:
            blocking.append(left)
    return (not blocking, min(blocking) if blocking else None)


class Leadership:
    """The replica's active/standby state; `active` is True unless kopf peering says otherwise."""

    def __init__(self) -> None:
        self.active = True
        self.peering: str | None = None  # the peering object's name, when peering is on
        self._listeners: list[Callable[[bool], Any]] = []
        self._task: asyncio.Task[None] | None = None

    def on_change(self, listener: Callable[[bool], Any]) -> None:
        self._listeners.append(listener)

    async def _set(self, active: bool) -> None:
        if active == self.active:
            return
        self.active = active
        log.info("this replica is now %s (peering %s)", "active" if active else "on standby", self.peering)
        for listener in self._listeners:
            result = listener(active)
            if asyncio.iscoroutine(result):
                await result

    def start(self, client: Any, *, name: str, me: str, priority: int) -> None:
        """Start observing the ClusterKopfPeering `name` (cluster-wide peering: what `python -m corral.operator`
        runs unless given namespaces). Standby until the first observation: a replica starting next to an active one
        must not serve meanwhile."""
        self.peering = name
        self.active = False
        self._task = asyncio.create_task(self._observe(client, name, me, priority), name="corral-leadership")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _observe(self, client: Any, name: str, me: str, priority: int) -> None:
        status: Mapping[str, Any] = {}
        recheck: asyncio.Task[None] | None = None
        lock = asyncio.Lock()  # one evaluation at a time: listeners see the changes in order

        async def evaluate() -> None:
            nonlocal recheck
            async with lock:
                active, wait = decide(status, me, priority, datetime.now(UTC))
                await self._set(active)
                if recheck is not None and recheck is not asyncio.current_task():
                    recheck.cancel()
                recheck = asyncio.create_task(later(wait + 0.05)) if wait is not None else None

        async def later(delay: float) -> None:
            await asyncio.sleep(delay)
            await evaluate()

        while True:
            try:
                async for _event, obj in client.watch(ClusterKopfPeering, fields={"metadata.name": name}):
                    body = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
                    status = body.get("status") or {}
                    await evaluate()
            except asyncio.CancelledError:
                if recheck is not None:
                    recheck.cancel()
                raise
            except Exception as exc:  # noqa: BLE001 - keep observing; kopf keeps its own peering going meanwhile
                log.warning("watching peering %s failed (%s); retrying", name, exc)
                await asyncio.sleep(1)


def own_pod() -> tuple[str, str] | None:
    """(namespace, name) of the pod this replica runs in, when the chart says so (CORRAL_POD_NAME/CORRAL_NAMESPACE)."""
    name, ns = os.environ.get("CORRAL_POD_NAME"), os.environ.get("CORRAL_NAMESPACE")
    return (ns, name) if name and ns else None


def pod_label_patch(active: bool) -> dict[str, Any]:
    """The merge patch that marks (or unmarks) this replica's pod as the one serving the claims API."""
    return {"metadata": {"labels": {L_CLAIMS_API: "active" if active else None}}}
