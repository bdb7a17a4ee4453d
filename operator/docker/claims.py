"""The claims side of the Docker runtime: the claims API's claim methods over the store (the truth for claims) and
the sandboxes.

A claim is admitted by the core's rules (admission), then bound in one store transaction (Store.adopt): a warm
sandbox of its pool in the core's adoption order, else a new cold one (within a Pool's poolMax). A warm bind rotates
the sandbox's execd token to the claim's and sets the claim's env; a cold start creates the container with both.
Callers wait on the claim's event (`notify`), never by polling. Claims with a TTL end on a timer armed for the next
deadline (`arm_deadlines`); an ended claim's sandbox is retained, recycled into its Pool, or deleted (`release`).
A Ready claim whose execd stops answering (`execd_unreachable`) fails after EXECD_GONE seconds, and its sandbox is
replaced; a sandbox lost under a claim (`lose`) fails the claim.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from corral.api import Pool
from corral.api.wire import Claim, ClaimRequest, SandboxRef, Snapshot, SnapshotRequest
from corral.operator.claimsapi import Conflict, ExecdTarget, Invalid, NotFound, Unavailable
from corral.operator.core import lifecycle, metrics
from corral.operator.core import vocabulary as vocab
from corral.operator.core.admission import Refusal, admit_claim
from corral.operator.planning import Member, adoption_order

from . import engine
from .desired import DesiredState, DockerTemplate, template_of
from .pools import Wake
from .runner import Runner
from .sandboxes import Sandboxes
from .settings import Settings
from .store import ClaimRow, SandboxRow, Store, now

log = logging.getLogger("corral.operator.docker")
EXECD_GONE = 15.0  # seconds a claimed sandbox's execd may stay silent (its own restart backoff tops out at 5 s)


def admission(req: ClaimRequest, tmpl: DockerTemplate) -> Refusal | None:
    """The core's claim admission for a claims API request and its Docker template (no volume claims on Docker)."""
    return admit_claim(env=req.env, template_env=tmpl.env, env_policy=tmpl.env_policy)


def to_api(c: ClaimRow) -> Claim:
    ts = lambda t: datetime.fromtimestamp(t, UTC) if t else None  # noqa: E731
    sandbox = SandboxRef(name=c.sandbox, endpoint=f"/v1/claims/{c.name}/execd") if c.sandbox else None
    return Claim(name=c.name, pool=c.pool, pool_kind=c.pool_kind, phase=c.phase, launch_type=c.launch_type,
                 sandbox=sandbox, created=datetime.fromtimestamp(c.created, UTC), ready_at=ts(c.ready_at),
                 expires_at=ts(c.expires_at),
                 shutdown_policy=c.shutdown_policy, snapshot=c.snapshot, message=c.message)


class Claims:
    def __init__(self, settings: Settings, desired: Callable[[], DesiredState], store: Store, client: Any,
                 runner: Runner, sandboxes: Sandboxes, wake: Wake, cold: asyncio.Semaphore):
        """`cold` bounds cold starts (shared with the batches')."""
        self.s, self.desired, self.store, self.client = settings, desired, store, client
        self.runner, self.sandboxes, self.wake, self.cold_sem = runner, sandboxes, wake, cold
        self._waiters: dict[str, asyncio.Event] = {}  # per claim waiting for its sandbox
        self._checking: set[str] = set()              # claims whose execd did not answer the proxy
        self._deadline = asyncio.Event()

    def notify(self, claim: str) -> None:
        """The claim's phase changed: wake whoever waits for it."""
        ev = self._waiters.get(claim)
        if ev:
            ev.set()

    async def _claim(self, name: str) -> ClaimRow:
        c = await self.runner.run(self.store.claim, name)
        if c is None:
            raise NotFound(f"no claim named {name!r}")
        return c

    # --- binding ----------------------------------------------------------------------------------------------------
    async def create(self, req: ClaimRequest) -> Claim:
        run, t0 = self.runner.run, time.monotonic()
        found = self.desired().pool(req.pool)
        if found is None:
            raise NotFound(f"no WarmPool or Pool named {req.pool!r}")
        kind, spec = found
        tmpl = self.desired().template(template_of(spec))
        if refusal := admission(req, tmpl):
            metrics.claim_ended(req.pool, None, refusal.reason)
            raise Invalid(f"template {tmpl.name!r} refuses the claim ({refusal.reason}): {refusal.message}")
        if req.snapshot and not await run(engine.image_exists, self.client, req.snapshot):
            raise Invalid(f"snapshot image {req.snapshot!r} does not exist")
        created = now()
        row = ClaimRow(name=req.name or f"claim-{secrets.token_hex(5)}", pool=req.pool, pool_kind=kind,
                       phase=vocab.PENDING, created=created, expires_at=lifecycle.lease_end(created, req.ttl_seconds),
                       shutdown_policy=req.shutdown_policy, env=dict(req.env), snapshot=req.snapshot)

        def order(members: list[Member]) -> list[Member]:
            return adoption_order(members, tmpl.blueprint_hash(), set())

        def cold() -> SandboxRow:
            return SandboxRow(name=f"corral-{self.s.stack}-{req.pool}-{secrets.token_hex(3)}", template=tmpl.name,
                              state="creating", created=now(), pool=req.pool, pool_kind=kind,
                              hash=tmpl.blueprint_hash(), image=req.snapshot or tmpl.image)

        limit = spec.spec.capacity.pool_max if isinstance(spec, Pool) else None
        claim, sandbox, new = await run(self.store.adopt, row, order, cold, limit)
        if not new:
            return await self._wait(claim.name, req.timeout_seconds)
        if sandbox is None:
            await run(self.store.remove_claim, claim.name)  # not recorded: a later retry may fit
            metrics.claim_ended(req.pool, None, vocab.R_POOL_EXHAUSTED)
            raise Conflict(f"pool {req.pool!r} is at poolMax and has no idle sandbox")
        self.wake(req.pool)
        if claim.launch_type == vocab.API_WARM:
            await self._warm_ready(claim, sandbox, t0)
            return to_api(claim)
        self._waiters.setdefault(claim.name, asyncio.Event())
        self.runner.spawn(self.cold_start(claim.name, sandbox, tmpl, t0))
        return await self._wait(claim.name, req.timeout_seconds)

    async def _warm_ready(self, claim: ClaimRow, sandbox: SandboxRow, t0: float) -> None:
        sbx = self.sandboxes
        try:
            await sbx.rotate(sandbox, sbx.token(sandbox.name), sbx.token(sandbox.name, claim))
        except httpx.HTTPError as exc:  # its execd is gone for good (it supervises itself): report and replace
            claim.phase, claim.message = "Failed", f"execd of sandbox {sandbox.name} did not answer: {exc}"
            await self.lose(sandbox, claim.message)
            self.arm_deadlines()
            return
        if claim.env:
            try:
                await sbx.set_env(sandbox, claim.env, sbx.token(sandbox.name, claim))
            except httpx.HTTPError as exc:
                claim.phase, claim.message = "Failed", f"set env: {exc}"
                await self.runner.run(self.store.update_claim, claim.name, phase="Failed", message=claim.message)
                self.arm_deadlines()
                return
        claim.phase, claim.ready_at = "Ready", now()
        await self.runner.run(self.store.update_claim, claim.name, phase="Ready", ready_at=claim.ready_at)
        metrics.claim_bound(claim.pool, vocab.API_WARM, time.monotonic() - t0)
        self.arm_deadlines()

    async def cold_start(self, claim: str, sandbox: SandboxRow, tmpl: DockerTemplate, t0: float) -> None:
        """Start the cold sandbox bound to a Pending claim; the claim becomes Ready, or Failed if it cannot start."""
        run = self.runner.run
        c = await self._claim(claim)
        try:
            async with self.cold_sem:
                await self.sandboxes.start(sandbox, tmpl, c.env, self.sandboxes.token(sandbox.name, c))
        except Exception as exc:  # noqa: BLE001 - becomes the claim's status
            log.warning("claim %s: cold start failed: %s", claim, exc)
            await run(self.store.update_claim, claim, phase="Failed", sandbox=None,
                      message=f"cold start failed: {exc}")
            metrics.claim_ended(c.pool, vocab.API_COLD, vocab.R_START_FAILED)
        else:
            if await run(self.store.finish_cold, claim, sandbox.name, now()):
                metrics.claim_bound(c.pool, vocab.API_COLD, time.monotonic() - t0)
            else:  # the claim ended while its sandbox was starting
                await self.release(sandbox.name, c)
        self.arm_deadlines()
        self.notify(claim)

    def restart_cold(self, c: ClaimRow) -> None:
        """A Pending claim whose sandbox is gone (recovery): a new cold sandbox, or Failed if its pool is gone."""
        found = self.desired().pool(c.pool)
        if found is None:
            self.runner.spawn(self.fail(c.name, f"pool {c.pool} no longer exists"))
            return
        kind, spec = found
        tmpl = self.desired().template(template_of(spec))
        row = SandboxRow(name=f"corral-{self.s.stack}-{c.pool}-{secrets.token_hex(3)}", template=tmpl.name,
                         state="creating", created=now(), pool=c.pool, pool_kind=kind, hash=tmpl.blueprint_hash(),
                         image=c.snapshot or tmpl.image, claim=c.name, launch_type="cold")
        self.store.bind_cold(c.name, row)
        self._waiters.setdefault(c.name, asyncio.Event())
        self.runner.spawn(self.cold_start(c.name, row, tmpl, time.monotonic()))

    async def fail(self, claim: str, why: str) -> None:
        await self.runner.run(self.store.update_claim, claim, phase="Failed", message=why)
        self.notify(claim)

    async def lose(self, row: SandboxRow, why: str) -> None:
        """A sandbox is lost (container gone, execd dead): its claim fails, the sandbox is deleted."""
        if row.claim:
            await self.runner.run(self.store.update_claim, row.claim, phase="Failed", sandbox=None, message=why)
            self.notify(row.claim)
        await self.sandboxes.discard(row.name)

    async def _wait(self, name: str, timeout: float) -> Claim:
        ev = self._waiters.setdefault(name, asyncio.Event())
        c = await self._claim(name)
        if c.phase == "Pending" and timeout > 0:
            try:
                await asyncio.wait_for(ev.wait(), timeout)
            except TimeoutError:
                pass
            c = await self._claim(name)
        if c.phase != "Pending":
            self._waiters.pop(name, None)
        return to_api(c)

    # --- reads and lease --------------------------------------------------------------------------------------------
    async def get(self, name: str) -> Claim:
        return to_api(await self._claim(name))

    async def list(self, pool: str | None = None) -> list[Claim]:
        return [to_api(c) for c in await self.runner.run(self.store.claims, pool=pool)]

    async def renew(self, name: str, ttl_seconds: int) -> Claim:
        c = await self._claim(name)
        if c.phase in ("Expired", "Failed"):
            raise Conflict(f"claim {name} is {c.phase}")
        await self.runner.run(self.store.update_claim, name, expires_at=lifecycle.lease_end(now(), ttl_seconds))
        self.arm_deadlines()
        return to_api(await self._claim(name))

    # --- ending -----------------------------------------------------------------------------------------------------
    async def delete(self, name: str) -> None:
        c = await self._claim(name)
        await self.end(c, expired=False)

    async def end(self, c: ClaimRow, *, expired: bool) -> None:
        sandbox = await self.runner.run(self.store.end_claim, c.name, expired=expired,
                                        message="the claim's TTL ran out" if expired else None)
        self.notify(c.name)
        if sandbox:
            row = await self.runner.run(self.store.sandbox, sandbox)
            if row and row.state == "releasing":  # a cold start in flight releases its own sandbox when done
                await self.release(sandbox, c)
        if expired:
            metrics.claim_ended(c.pool, c.launch_type, vocab.R_SHUTDOWN_TIME)

    async def release(self, name: str, claim: ClaimRow) -> None:
        """A claim ended: retain the sandbox (shutdownPolicy Retain), or release it (recycled into its Pool, or
        deleted: Sandboxes.release)."""
        if claim.shutdown_policy == "Retain":
            row = await self.runner.run(self.store.sandbox, name)
            if row is not None:
                await self.runner.run(self.store.update_sandbox, name, state="retained", claim=None, pool=None,
                                      retained_from=claim.name, retained_pool=row.pool, retained_at=now())
            return
        await self.sandboxes.release(name, claim)

    # --- the sandbox of a Ready claim -------------------------------------------------------------------------------
    async def ready_sandbox(self, name: str, phases: tuple[str, ...] = ("Ready",)) -> tuple[ClaimRow, SandboxRow]:
        def both() -> tuple[ClaimRow | None, SandboxRow | None]:  # one thread hop: this is on every proxied call
            claim = self.store.claim(name)
            return claim, self.store.sandbox(claim.sandbox) if claim and claim.sandbox else None

        c, row = await self.runner.run(both)
        if c is None:
            raise NotFound(f"no claim named {name!r}")
        if c.phase not in phases or not c.sandbox:
            raise Conflict(f"claim {name} is {c.phase}, not {' or '.join(phases)}")
        if row is None:
            raise Unavailable(f"claim {name}: its sandbox is gone")
        return c, row

    async def pause(self, name: str) -> Claim:
        c, row = await self.ready_sandbox(name, ("Ready", "Paused"))
        if c.phase == "Ready":
            await self.runner.run(engine.pause, self.client, row.name, op="pause")
            await self.runner.run(self.store.update_claim, name, phase="Paused")
        return to_api(await self._claim(name))

    async def resume(self, name: str) -> Claim:
        c, row = await self.ready_sandbox(name, ("Ready", "Paused"))
        if c.phase == "Paused":
            await self.runner.run(engine.unpause, self.client, row.name, op="unpause")
            await self.runner.run(self.store.update_claim, name, phase="Ready")
        return to_api(await self._claim(name))

    async def snapshot(self, name: str, req: SnapshotRequest) -> Snapshot:
        c, row = await self.ready_sandbox(name, ("Ready", "Paused"))
        tmpl = self.desired().template(row.template)
        tag = req.tag or f"{name}-{int(time.time())}"
        out = await self.runner.run(engine.commit, self.client, row.name, stack=self.s.stack, tag=tag, env=tmpl.env,
                                    labels={engine.L_SNAPSHOT_OF: name}, op="commit")
        return Snapshot.model_validate(out)

    async def execd_target(self, name: str) -> ExecdTarget:
        c, row = await self.ready_sandbox(name)
        return ExecdTarget(url=self.sandboxes.url(row), token=self.sandboxes.token(row.name, c))

    def execd_unreachable(self, name: str) -> None:
        """The proxy could not connect to a Ready claim's execd. It supervises itself, so it is back within
        seconds unless its supervisor died too: then, after EXECD_GONE seconds without an answer, the claim
        becomes Failed and its sandbox is replaced, instead of a Ready claim answering 502 for good. Checked only
        after such a failure, never on a timer."""
        if name not in self._checking:
            self._checking.add(name)
            self.runner.spawn(self._check_execd(name)).add_done_callback(lambda _: self._checking.discard(name))

    async def _check_execd(self, name: str) -> None:
        try:
            c, row = await self.ready_sandbox(name, ("Ready",))
        except Exception:  # noqa: BLE001 - gone or not Ready meanwhile: nothing to check
            return
        deadline = time.monotonic() + EXECD_GONE
        while time.monotonic() < deadline:
            if await self.sandboxes.healthy(row, timeout=2.0):
                return
            await asyncio.sleep(0.5)
        current = await self.runner.run(self.store.claim, name)
        if current is None or current.phase != "Ready" or current.sandbox != row.name:
            return
        log.warning("claim %s: execd of sandbox %s stayed gone for %.0f s; replacing it", name, row.name, EXECD_GONE)
        await self.lose(row, f"execd of sandbox {row.name} stopped answering")

    # --- deadlines --------------------------------------------------------------------------------------------------
    def arm_deadlines(self) -> None:
        self._deadline.set()

    async def deadlines(self) -> None:
        """End claims whose TTL ran out, sleeping until the next one (or until re-armed)."""
        while True:
            self._deadline.clear()
            claims = await self.runner.run(self.store.claims, phases=("Pending", "Ready", "Paused"))
            due = [c for c in claims if lifecycle.due(c.expires_at, now())]
            for c in due:
                try:
                    await self.end(c, expired=True)
                except Exception:  # noqa: BLE001
                    log.exception("expiring claim %s", c.name)
            upcoming = [c.expires_at for c in claims if c.expires_at and c.expires_at > now()]
            timeout = max(0.05, min(upcoming) - now()) if upcoming else None
            try:
                await asyncio.wait_for(self._deadline.wait(), timeout)
            except TimeoutError:
                pass
