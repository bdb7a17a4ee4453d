"""Recovery of the Docker runtime: the engine's container events (die/destroy/oom of this stack's sandboxes, and
`health_status: unhealthy` when the engine's probe finds execd gone: engine.healthcheck) and a full resync from the
engine and the store at start-up and whenever the event stream comes back (dockerd restarted)."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Coroutine
from typing import Any

from . import engine
from .base import RuntimeBase
from .desired import template_of
from .store import ClaimRow, SandboxRow, now

log = logging.getLogger("corral.operator.docker")


class RecoveryMixin(RuntimeBase):
    """Part of DockerRuntime (runtime.py): the attributes used here are set up there (declared in base.py)."""

    def _watch_events(self) -> None:
        """Container die/destroy/oom and health events of this stack's sandboxes; on a broken stream (dockerd
        restarted) reconnect and resync everything from the engine and the store."""
        backoff, first = 0.5, True
        while not self._stopping.is_set():
            try:
                since = int(time.time())
                if not first:
                    self.client.ping()
                    assert self._loop is not None
                    asyncio.run_coroutine_threadsafe(self.resync(wake=True), self._loop).result(timeout=600)
                first = False
                stream = self.client.events(since=since, decode=True, filters={
                    # "health_status" matches "health_status: <status>" (the engine's filter is fuzzy for it)
                    "type": "container", "event": ["die", "destroy", "oom", "health_status"],
                    "label": [f"{engine.L_STACK}={self.s.stack}", f"{engine.L_ROLE}=sandbox"]})
                backoff = 0.5
                for ev in stream:
                    if self._stopping.is_set():
                        return
                    name = (ev.get("Actor") or {}).get("Attributes", {}).get("name")
                    action = ev.get("Action") or ev.get("status") or ""
                    if not name or not self._loop:
                        continue
                    if action.startswith("health_status"):
                        if action.endswith("unhealthy"):
                            self._loop.call_soon_threadsafe(self._spawn_for, self._on_unhealthy, name)
                    else:
                        self._loop.call_soon_threadsafe(self._spawn_for, self._on_gone, name)
            except Exception as exc:  # noqa: BLE001 - the engine went away; retry
                log.warning("docker events stream broke (%s); reconnecting", exc)
            first = False
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    def _spawn_for(self, handler: Callable[[str], Coroutine[Any, Any, None]], name: str) -> None:
        """On the loop (call_soon_threadsafe from the event thread): run `handler(name)` as a task."""
        self.spawn(handler(name))

    async def _on_gone(self, name: str) -> None:
        row = await self.run(self.store.sandbox, name)
        if row is None or row.state in ("deleting", "retained", "recycling") or name in self._restarting:
            return
        if row.state == "creating":
            self._failed.add(name)
            return
        try:
            running = (await self.run(self.client.api.inspect_container, name))["State"]["Status"]
        except Exception:  # noqa: BLE001
            running = "gone"
        if running in ("running", "paused"):
            return
        await self._lose(row, "the sandbox container exited")

    async def _on_unhealthy(self, name: str) -> None:
        """The engine's probe found nothing listening on execd's port, HEALTH_RETRIES times an interval apart: its
        supervisor and server are gone. An idle sandbox leaves the pool in one conditional write (it cannot be bound
        from then on) and is replaced; a claimed one goes through the same check as a proxied call that could not
        connect (execd_unreachable: silent for EXECD_GONE s -> claim Failed, sandbox replaced). Other states are
        starting, recycling or on their way out, and are checked there."""
        row = await self.run(self.store.sandbox, name)
        if row is None or row.state != "ready":
            return
        if row.claim is None:
            if await self.run(self.store.retire_idle, name):
                log.warning("idle sandbox %s: execd is gone (the engine's health probe); replacing it", name)
                await self._delete_sandbox(name)
                return
            row = await self.run(self.store.sandbox, name)  # bound meanwhile: its claim's check decides
        if row is not None and row.state == "ready" and row.claim:
            self.execd_unreachable(row.claim)

    async def _lose(self, row: SandboxRow, why: str) -> None:
        if row.claim:
            await self.run(self.store.update_claim, row.claim, phase="Failed", sandbox=None, message=why)
            self._notify(row.claim)
        await self.run(self.store.update_sandbox, row.name, state="deleting", claim=None)
        await self._delete_sandbox(row.name)

    async def resync(self, wake: bool = False) -> None:
        """Rebuild the runtime's view from the engine (labelled containers) and the store; run at start and after
        the engine came back. Containers without a row are orphans (removed); rows without a live container are
        dropped (idle), fail their claim (claimed), or are restarted cold (a claim still Pending)."""
        containers = {c.labels.get("corral.dev/sandbox", c.name): c
                      for c in await self.run(engine.list_sandboxes, self.client, self.s.stack)}
        rows = {r.name: r for r in await self.run(self.store.sandboxes)}
        for name, c in containers.items():
            if name not in rows:
                await self.run(engine.remove, self.client, c.id, op="remove")
        for row in rows.values():
            c = containers.get(row.name)
            alive = c is not None and c.status in ("running", "paused")
            if row.state in ("deleting", "releasing", "recycling") or (row.state == "creating" and row.claim is None):
                await self.run(engine.remove, self.client, row.name, op="remove")
                await self.run(self.store.remove_sandbox, row.name)
            elif row.state == "creating":  # a cold start cut short: start it again
                await self.run(engine.remove, self.client, row.name, op="remove")
                await self.run(self.store.remove_sandbox, row.name)
            elif not alive:
                if row.state == "retained":
                    await self.run(self.store.remove_sandbox, row.name)
                else:
                    await self._lose(row, "the sandbox container is gone (engine restarted or removed)")
            elif c is not None and engine.health_of(c.attrs) == "unhealthy":  # went by while the stream was down
                await self._on_unhealthy(row.name)
        for claim in await self.run(self.store.claims, phases=("Pending",)):
            if claim.sandbox and await self.run(self.store.sandbox, claim.sandbox) is not None:
                continue
            self._restart_cold(claim)
        self._arm_deadlines()
        if wake:
            self.wake()

    def _restart_cold(self, c: ClaimRow) -> None:
        found = self.desired.pool(c.pool)
        if found is None:
            self.spawn(self._fail(c.name, f"pool {c.pool} no longer exists"))
            return
        kind, spec = found
        tmpl = self.desired.template(template_of(spec))
        row = SandboxRow(name=f"corral-{self.s.stack}-{c.pool}-{secrets.token_hex(3)}", template=tmpl.name,
                         state="creating", created=now(), pool=c.pool, pool_kind=kind, hash=tmpl.blueprint_hash(),
                         image=c.snapshot or tmpl.image, claim=c.name, launch_type="cold")
        self.store.bind_cold(c.name, row)
        self._waiters.setdefault(c.name, asyncio.Event())
        self.spawn(self._cold_start(c.name, row, tmpl, time.monotonic()))

    async def _fail(self, claim: str, why: str) -> None:
        await self.run(self.store.update_claim, claim, phase="Failed", message=why)
        self._notify(claim)


