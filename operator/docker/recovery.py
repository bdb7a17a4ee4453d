"""Recovery of the Docker runtime: the engine's container events (die/destroy/oom of this stack's sandboxes, and
`health_status: unhealthy` when the engine's probe finds execd gone: engine.healthcheck) and a full resync from the
engine and the store at start-up and whenever the event stream comes back (dockerd restarted).

The event stream is read on a thread of its own (the docker SDK's stream blocks); each event becomes a task on the
runtime's loop. What a lost sandbox means for its holder is the holder's: a claim's (Claims.lose, restart_cold,
execd_unreachable) or a batch index's (Batches.sandbox_lost, start_cut_short; an index's execd that stops answering
is noticed by its task's follower); what it means for its pool is a wake of the pool's worker."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from functools import partial
from typing import Any

from corral.operator.core.batches import parse_claim_label

from . import engine
from .batches import Batches
from .claims import Claims
from .pools import Wake
from .runner import Runner
from .sandboxes import Sandboxes
from .settings import Settings
from .store import SandboxRow, Store

log = logging.getLogger("corral.operator.docker")


class Recovery:
    def __init__(self, settings: Settings, store: Store, client: Any, runner: Runner, sandboxes: Sandboxes,
                 claims: Claims, batches: Batches, wake: Wake):
        self.s, self.store, self.client, self.runner = settings, store, client, runner
        self.sandboxes, self.claims, self.batches, self.wake = sandboxes, claims, batches, wake
        self._stopping = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._watch_events, name="docker-events", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()

    def _watch_events(self) -> None:
        """Container die/destroy/oom and health events of this stack's sandboxes; on a broken stream (dockerd
        restarted) reconnect and resync everything from the engine and the store."""
        backoff, first = 0.5, True
        while not self._stopping.is_set():
            try:
                since = int(time.time())
                if not first:
                    self.client.ping()
                    asyncio.run_coroutine_threadsafe(self.resync(wake=True), self.runner.loop).result(timeout=600)
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
                    if not name:
                        continue
                    if action.startswith("health_status"):
                        if action.endswith("unhealthy"):
                            self.runner.spawn_threadsafe(partial(self.on_unhealthy, name))
                    else:
                        self.runner.spawn_threadsafe(partial(self.on_gone, name))
            except Exception as exc:  # noqa: BLE001 - the engine went away; retry
                log.warning("docker events stream broke (%s); reconnecting", exc)
            first = False
            time.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def on_gone(self, name: str) -> None:
        row = await self.runner.run(self.store.sandbox, name)
        if row is None or row.state in ("deleting", "retained", "recycling") or self.sandboxes.restarting(name):
            return
        if row.state == "creating":
            self.sandboxes.exited_while_starting(name)
            return
        try:
            running = (await self.runner.run(self.client.api.inspect_container, name))["State"]["Status"]
        except Exception:  # noqa: BLE001
            running = "gone"
        if running in ("running", "paused"):
            return
        await self.lose(row, "the sandbox container exited")

    async def on_unhealthy(self, name: str) -> None:
        """The engine's probe found nothing listening on execd's port, HEALTH_RETRIES times an interval apart: its
        supervisor and server are gone. An idle sandbox leaves the pool in one conditional write (it cannot be bound
        from then on) and is replaced; a claimed one goes through the same check as a proxied call that could not
        connect (execd_unreachable: silent for EXECD_GONE s -> claim Failed, sandbox replaced). Other states are
        starting, recycling or on their way out, and are checked there."""
        row = await self.runner.run(self.store.sandbox, name)
        if row is None or row.state != "ready":
            return
        if row.claim is None:
            if await self.runner.run(self.store.retire_idle, name):
                log.warning("idle sandbox %s: execd is gone (the engine's health probe); replacing it", name)
                await self.sandboxes.delete(name)
                return
            row = await self.runner.run(self.store.sandbox, name)  # bound meanwhile: its claim's check decides
        if row is not None and row.state == "ready" and row.claim and parse_claim_label(row.claim) is None:
            self.claims.execd_unreachable(row.claim)

    async def lose(self, row: SandboxRow, why: str) -> None:
        """A sandbox is lost: its holder fails (a claim, or a batch's index) and it is deleted."""
        if parse_claim_label(row.claim) is not None:
            await self.batches.sandbox_lost(row, why)
            await self.sandboxes.discard(row.name)
        else:
            await self.claims.lose(row, why)

    async def resync(self, wake: bool = False) -> None:
        """Rebuild the runtime's view from the engine (labelled containers) and the store; run at start and after
        the engine came back. Containers without a row are orphans (removed); rows without a live container are
        dropped (idle), fail their claim (claimed), or are restarted cold (a claim still Pending)."""
        run = self.runner.run
        containers = {c.labels.get("corral.dev/sandbox", c.name): c
                      for c in await run(engine.list_sandboxes, self.client, self.s.stack)}
        rows = {r.name: r for r in await run(self.store.sandboxes)}
        for name, c in containers.items():
            if name not in rows:
                await run(engine.remove, self.client, c.id, op="remove")
        for row in rows.values():
            c = containers.get(row.name)
            alive = c is not None and c.status in ("running", "paused")
            if row.state in ("deleting", "releasing", "recycling") or (row.state == "creating" and row.claim is None):
                await run(engine.remove, self.client, row.name, op="remove")
                await run(self.store.remove_sandbox, row.name)
            elif row.state == "creating":  # a cold start cut short: start it again
                await self.batches.start_cut_short(row)  # a batch index's (a claim's: below)
                await run(engine.remove, self.client, row.name, op="remove")
                await run(self.store.remove_sandbox, row.name)
            elif not alive:
                if row.state == "retained":
                    await run(self.store.remove_sandbox, row.name)
                else:
                    await self.lose(row, "the sandbox container is gone (engine restarted or removed)")
            elif c is not None and engine.health_of(c.attrs) == "unhealthy":  # went by while the stream was down
                await self.on_unhealthy(row.name)
        for claim in await run(self.store.claims, phases=("Pending",)):
            if claim.sandbox and await run(self.store.sandbox, claim.sandbox) is not None:
                continue
            self.claims.restart_cold(claim)
        self.claims.arm_deadlines()
        if wake:
            self.wake()
