"""Sandbox containers of the Docker runtime: how one is started (a `creating` row first, then container create +
start, then its execd healthy), released by its holder (a claim, or an index of a batch: `release` recycles it into
its Pool, Restart: a new process tree and token; Noop: env cleared and token rotated; or deletes it), and deleted;
the execd calls the runtime itself makes (token rotation, claim env, health); and the stack's infrastructure every
sandbox needs (template networks, the execd volume).

execd tokens are derived, never stored (tokens.py): the idle sandbox's, or its holder's while held. A container
that dies while it starts is reported by recovery (`exited_while_starting`), which ends that start's health wait at
once; a container restarted for recycling is `restarting` for a few seconds, so recovery ignores its die event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from corral.api import Pool
from corral.execd import wire

from . import engine
from .desired import DEFAULT_EXECD_PORT, DesiredState, DockerTemplate, template_of
from .metrics import SANDBOX_START
from .runner import Runner
from .settings import Settings
from .store import SandboxRow, Store
from .tokens import Holder, execd_token

log = logging.getLogger("corral.operator.docker")
RESTART_QUIET = 5.0  # seconds a recycled sandbox's die event is expected after its restart


class Sandboxes:
    def __init__(self, settings: Settings, desired: Callable[[], DesiredState], store: Store, client: Any,
                 runner: Runner, http: httpx.AsyncClient, secret: bytes, pool_changed: Callable[[str], None]):
        """`desired()` is the current pools file (a reload replaces it); `pool_changed(pool)` is called when a
        pool's sandbox is gone or back in it (its worker re-plans, batches waiting for room bind)."""
        self.s, self.desired, self.store, self.client = settings, desired, store, client
        self.runner, self.http, self.secret, self.pool_changed = runner, http, secret, pool_changed
        self.execd_volume = ""
        self._failed: set[str] = set()               # containers that died while starting
        self._restarting: set[str] = set()           # recycled by restart: their die event is expected

    # --- infrastructure ---------------------------------------------------------------------------------------------
    async def ensure_infrastructure(self) -> None:
        run, desired = self.runner.run, self.desired()
        for t in desired.templates:
            await run(engine.ensure_network, self.client, t.network, internal=t.internal, stack=self.s.stack)
        images = [t.image for t in desired.templates] or ["corral/base:bookworm"]
        present = [i for i in images if await run(engine.image_exists, self.client, i)]
        if not present:  # nothing could start anyway; say which images are missing instead of crash-looping
            log.error("none of the template images is on the engine: %s", ", ".join(sorted(set(images))))
        helper = (present or images)[0]
        self.execd_volume = await run(engine.ensure_execd_volume, self.client, stack=self.s.stack,
                                      key=self.s.execd_key, tar_path=self.s.execd_tar, helper_image=helper)

    # --- execd ------------------------------------------------------------------------------------------------------
    def token(self, sandbox: str, holder: Holder | None = None) -> str:
        return execd_token(self.secret, sandbox, holder)

    def port(self, sandbox: SandboxRow) -> int:
        found = [t for t in self.desired().templates if t.name == sandbox.template]
        return found[0].execd_port if found else DEFAULT_EXECD_PORT

    def url(self, sandbox: SandboxRow) -> str:
        return f"http://{sandbox.ip}:{self.port(sandbox)}"

    async def rotate(self, sandbox: SandboxRow, old: str, new: str) -> None:
        """execd takes the next token (PUT /v1/token, authenticated with the current one): at each bind and release,
        so a claim's token dies with the claim even where the sandbox lives on (Pool recycling)."""
        r = await self.http.put(self.url(sandbox) + wire.TOKEN_PATH, json={"token": new},
                                headers={"Authorization": f"Bearer {old}"})
        r.raise_for_status()

    async def set_env(self, sandbox: SandboxRow, env: dict[str, str], token: str) -> None:
        """Replace the env execd gives its commands (a claim's, or none after it)."""
        r = await self.http.put(self.url(sandbox) + wire.ENV_PATH, json={"env": env, "merge": False},
                                headers={"Authorization": f"Bearer {token}"})
        r.raise_for_status()

    async def healthy(self, sandbox: SandboxRow, timeout: float) -> bool:
        try:
            return (await self.http.get(self.url(sandbox) + wire.HEALTH_PATH, timeout=timeout)).status_code == 200
        except httpx.HTTPError:
            return False

    # --- containers -------------------------------------------------------------------------------------------------
    async def start(self, row: SandboxRow, tmpl: DockerTemplate, env: dict[str, str], token: str) -> None:
        """Create + start the container of a `creating` row and wait until its execd answers; `token` is the idle
        sandbox's, or its cold claim's. On failure the container and the row are removed and the error raised."""
        run, t0 = self.runner.run, time.monotonic()
        if env:
            tmpl = tmpl.model_copy(update={"env": {**tmpl.env, **env}})
        try:
            addr = await run(engine.create_sandbox, self.client, stack=self.s.stack, name=row.name, tmpl=tmpl,
                             image=row.image or tmpl.image, token=token,
                             execd_volume=self.execd_volume, pool=row.pool, pool_kind=row.pool_kind,
                             health_interval=self.s.health_interval, op="create")
            await run(self.store.update_sandbox, row.name, container_id=addr["id"], ip=addr["ip"],
                      host_port=addr["host_port"])
            await self.wait_healthy(row.name, addr["ip"], tmpl.execd_port)
        except BaseException:
            await run(engine.remove, self.client, row.name, op="remove")
            await run(self.store.remove_sandbox, row.name)
            raise
        SANDBOX_START.observe(time.monotonic() - t0)

    async def wait_healthy(self, name: str, ip: str | None, port: int) -> None:
        if not ip:
            raise RuntimeError(f"sandbox {name} has no IP address")
        deadline = time.monotonic() + self.s.ready_timeout
        while True:
            try:
                r = await self.http.get(f"http://{ip}:{port}{wire.HEALTH_PATH}", timeout=2.0)
                if r.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if name in self._failed:
                self._failed.discard(name)
                raise RuntimeError(f"sandbox {name}: container exited while starting")
            if time.monotonic() > deadline:
                raise TimeoutError(f"sandbox {name}: execd not healthy after {self.s.ready_timeout:.0f} s")
            await asyncio.sleep(0.03)

    def exited_while_starting(self, name: str) -> None:
        """Recovery saw the container of a `creating` row die: its start fails now instead of at the timeout."""
        self._failed.add(name)

    def restarting(self, name: str) -> bool:
        """Recycled by a restart just now: its die event is expected."""
        return name in self._restarting

    async def delete(self, name: str) -> None:
        """Remove the container and its row (the caller has set the row to `deleting` or knows it is unreachable)."""
        await self.runner.run(engine.remove, self.client, name, op="remove")
        row = await self.runner.run(self.store.sandbox, name)
        await self.runner.run(self.store.remove_sandbox, name)
        if row and row.pool:
            self.pool_changed(row.pool)

    async def discard(self, name: str) -> None:
        """Delete a sandbox that must not be reused (lost, or its task still running)."""
        await self.runner.run(self.store.update_sandbox, name, state="deleting", claim=None)
        await self.delete(name)

    async def release(self, name: str, holder: Holder) -> None:
        """Its holder let it go (the row is `releasing`): recycle it into its Pool when the Pool recycles and the
        sandbox is still of its template (Restart/Noop), else delete it."""
        row = await self.runner.run(self.store.sandbox, name)
        if row is None:
            return
        desired = self.desired()
        found = desired.pool(row.pool) if row.pool else None
        spec = found[1] if found else None
        tmpl = desired.template(template_of(spec)) if spec else None
        if isinstance(spec, Pool) and tmpl is not None and spec.spec.recycle_strategy != "Delete" \
                and row.hash == tmpl.blueprint_hash() and row.image == tmpl.image:
            try:
                await self.recycle(row, spec.spec.recycle_strategy, holder)
                if row.pool:
                    self.pool_changed(row.pool)
                return
            except Exception as exc:  # noqa: BLE001 - fall back to delete
                log.warning("recycling %s failed (%s); deleting it", name, exc)
        await self.discard(name)

    async def recycle(self, row: SandboxRow, strategy: str, claim: Holder) -> None:
        """Put a released sandbox back into its Pool as idle and ready: Restart (stop, next token, start, healthy) or
        Noop (env cleared, token rotated back to the idle one). Raises if it could not; the caller deletes it."""
        run = self.runner.run
        # `recycling` is neither idle nor claimable: the pool planner must not trim it while it restarts.
        await run(self.store.update_sandbox, row.name, state="recycling", claim=None, launch_type=None)
        try:
            await run(engine.unpause, self.client, row.name)
        except Exception:  # noqa: BLE001 - not paused
            pass
        port = self.port(row)
        if strategy == "Restart":
            self._restarting.add(row.name)
            try:
                tmpl = self.desired().template(row.template)
                attrs = await run(engine.restart, self.client, row.name, token=self.token(row.name),
                                  user=tmpl.user, op="restart")
            finally:
                self.runner.loop.call_later(RESTART_QUIET, self._restarting.discard, row.name)
            addr = engine.address(attrs, tmpl.network, f"{port}/tcp")
            await run(self.store.update_sandbox, row.name, ip=addr["ip"], host_port=addr["host_port"])
            await self.wait_healthy(row.name, addr["ip"], port)
        else:
            await self.set_env(row, {}, self.token(row.name, claim))
            await self.rotate(row, self.token(row.name, claim), self.token(row.name))
        await run(self.store.update_sandbox, row.name, state="ready")
