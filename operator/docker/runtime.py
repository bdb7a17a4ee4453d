"""The Docker runtime: the claims backend plus the pool workers, over the store (truth for claims) and the engine.

Event-driven: pool workers wake on claims, releases, container events and pools-file reloads; claims expire on a
timer set for the next known deadline. With nothing changing it makes no Docker calls. Docker calls run in a bounded
thread pool; creates are bounded separately for claims (cold starts) and for pools (slow-start batches 1, 2, 4, ...).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx

from corral.api import Pool
from corral.execd import wire
from corral.operator.claimsapi import (
    Claim,
    ClaimRequest,
    Conflict,
    ExecdTarget,
    Invalid,
    NotFound,
    Snapshot,
    SnapshotRequest,
    Unavailable,
)
from corral.api.wire import SandboxRef
from corral.operator.core import lifecycle, metrics
from corral.operator.core import vocabulary as vocab
from corral.operator.core.admission import Refusal, admit_claim
from corral.operator.planning import MAX_BATCH, Member, adoption_order

from . import engine
from .desired import DEFAULT_EXECD_PORT, DesiredState, DockerTemplate, name_of, template_of
from .metrics import DOCKER_CALLS
from .pools import PoolsMixin
from .recovery import RecoveryMixin
from .retained import RetainedMixin
from .store import ClaimRow, SandboxRow, Store, now
from .tokens import execd_token

log = logging.getLogger("corral.operator.docker")
T = TypeVar("T")
EXECD_GONE = 15.0  # seconds a claimed sandbox's execd may stay silent (its own restart backoff tops out at 5 s)


@dataclass
class Settings:
    stack: str
    execd_tar: str
    execd_key: str
    max_batch: int = MAX_BATCH          # slow-start cap of pool creates and deletes (CORRAL_MAX_BATCH)
    ready_timeout: float = 120.0        # container start -> execd healthy, at most
    max_cold_creates: int = 8           # concurrent cold starts for claims
    max_pool_creates: int = 4           # concurrent creates per pool batch (after slow start)
    threads: int = 48
    health_interval: float = engine.HEALTH_INTERVAL  # the engine's execd probe in each sandbox; 0: none


def admission(req: ClaimRequest, tmpl: DockerTemplate) -> Refusal | None:
    """The core's claim admission for a claims API request and its Docker template (no volume claims on Docker)."""
    return admit_claim(env=req.env, template_env=tmpl.env, env_policy=tmpl.env_policy)


class DockerRuntime(PoolsMixin, RecoveryMixin, RetainedMixin):
    def __init__(self, settings: Settings, desired: DesiredState, store: Store, client: Any):
        self.s, self.desired, self.store, self.client = settings, desired, store, client
        self.secret = bytes.fromhex(store.meta("token-secret", lambda: secrets.token_hex(32)))
        self.pool_exec = ThreadPoolExecutor(settings.threads, thread_name_prefix="docker")
        self.cold_sem = asyncio.Semaphore(settings.max_cold_creates)
        self.pool_sem = asyncio.Semaphore(settings.max_pool_creates)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0))
        self.execd_volume = ""
        self._wake: dict[str, asyncio.Event] = {}
        self._workers: dict[str, asyncio.Task] = {}
        self._waiters: dict[str, asyncio.Event] = {}
        self._tasks: set[asyncio.Task] = set()
        self._failed: set[str] = set()               # sandboxes whose container died while starting
        self._restarting: set[str] = set()           # recycled by restart: their die event is expected
        self._checking: set[str] = set()             # claims whose execd did not answer the proxy (execd_unreachable)
        self._deadline = asyncio.Event()
        self._stopping = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- plumbing ---------------------------------------------------------------------------------------------------
    async def run(self, fn: Callable[..., T], *args: Any, op: str = "", **kw: Any) -> T:
        assert self._loop is not None
        try:
            out = await self._loop.run_in_executor(self.pool_exec, lambda: fn(*args, **kw))
        except Exception:
            if op:
                DOCKER_CALLS.labels(op, "error").inc()
            raise
        if op:
            DOCKER_CALLS.labels(op, "ok").inc()
        return out

    def spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        return task

    def token(self, sandbox: str, claim: ClaimRow | None = None) -> str:
        return execd_token(self.secret, sandbox, claim)

    async def _rotate(self, sandbox: SandboxRow, old: str, new: str) -> None:
        """execd takes the next token (PUT /v1/token, authenticated with the current one): at each bind and release,
        so a claim's token dies with the claim even where the sandbox lives on (Pool recycling)."""
        r = await self.http.put(f"http://{sandbox.ip}:{self._port(sandbox)}{wire.TOKEN_PATH}", json={"token": new},
                                headers={"Authorization": f"Bearer {old}"})
        r.raise_for_status()

    def wake(self, pool: str | None = None) -> None:
        for name, ev in self._wake.items():
            if pool is None or name == pool:
                ev.set()

    def _notify(self, claim: str) -> None:
        ev = self._waiters.get(claim)
        if ev:
            ev.set()

    # --- lifecycle --------------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._ensure_infrastructure()
        await self.resync()
        self._start_workers()
        self.spawn(self._deadline_loop())
        threading.Thread(target=self._watch_events, name="docker-events", daemon=True).start()

    async def stop(self) -> None:
        self._stopping.set()
        for t in list(self._tasks) + list(self._workers.values()):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._workers.values(), return_exceptions=True)
        await self.http.aclose()
        self.pool_exec.shutdown(wait=False, cancel_futures=True)

    async def _ensure_infrastructure(self) -> None:
        for t in self.desired.templates:
            await self.run(engine.ensure_network, self.client, t.network, internal=t.internal, stack=self.s.stack)
        images = [t.image for t in self.desired.templates] or ["corral/base:bookworm"]
        present = [i for i in images if await self.run(engine.image_exists, self.client, i)]
        if not present:  # nothing could start anyway; say which images are missing instead of crash-looping
            log.error("none of the template images is on the engine: %s", ", ".join(sorted(set(images))))
        helper = (present or images)[0]
        self.execd_volume = await self.run(engine.ensure_execd_volume, self.client, stack=self.s.stack,
                                           key=self.s.execd_key, tar_path=self.s.execd_tar, helper_image=helper)

    async def reload(self, desired: DesiredState) -> None:
        """A new pools file: new pools get workers, removed pools drain their idle sandboxes, all re-plan."""
        self.desired = desired
        await self._ensure_infrastructure()
        self._start_workers()
        self.wake()

    def _start_workers(self) -> None:
        names = {name_of(p) for p in self.desired.all_pools()}
        names |= {r.pool for r in self.store.sandboxes() if r.pool}
        for name in names:
            if name not in self._workers or self._workers[name].done():
                self._wake[name] = asyncio.Event()
                self._wake[name].set()
                self._workers[name] = asyncio.get_running_loop().create_task(self._pool_worker(name))

    # --- claims -----------------------------------------------------------------------------------------------------
    def to_api(self, c: ClaimRow) -> Claim:
        ts = lambda t: datetime.fromtimestamp(t, UTC) if t else None  # noqa: E731
        sandbox = SandboxRef(name=c.sandbox, endpoint=f"/v1/claims/{c.name}/execd") if c.sandbox else None
        return Claim(name=c.name, pool=c.pool, pool_kind=c.pool_kind, phase=c.phase, launch_type=c.launch_type,
                     sandbox=sandbox, created=datetime.fromtimestamp(c.created, UTC), ready_at=ts(c.ready_at),
                     expires_at=ts(c.expires_at),
                     shutdown_policy=c.shutdown_policy, snapshot=c.snapshot, message=c.message)

    async def _claim(self, name: str) -> ClaimRow:
        c = await self.run(self.store.claim, name)
        if c is None:
            raise NotFound(f"no claim named {name!r}")
        return c

    async def create_claim(self, req: ClaimRequest) -> Claim:
        t0 = time.monotonic()
        found = self.desired.pool(req.pool)
        if found is None:
            raise NotFound(f"no WarmPool or Pool named {req.pool!r}")
        kind, spec = found
        tmpl = self.desired.template(template_of(spec))
        if refusal := admission(req, tmpl):
            metrics.claim_ended(req.pool, None, refusal.reason)
            raise Invalid(f"template {tmpl.name!r} refuses the claim ({refusal.reason}): {refusal.message}")
        if req.snapshot and not await self.run(engine.image_exists, self.client, req.snapshot):
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
        claim, sandbox, new = await self.run(self.store.adopt, row, order, cold, limit)
        if not new:
            return await self._wait(claim.name, req.timeout_seconds)
        if sandbox is None:
            await self.run(self.store.remove_claim, claim.name)  # not recorded: a later retry may fit
            metrics.claim_ended(req.pool, None, vocab.R_POOL_EXHAUSTED)
            raise Conflict(f"pool {req.pool!r} is at poolMax and has no idle sandbox")
        self.wake(req.pool)
        if claim.launch_type == vocab.API_WARM:
            await self._warm_ready(claim, sandbox, t0)
            return self.to_api(claim)
        self._waiters.setdefault(claim.name, asyncio.Event())
        self.spawn(self._cold_start(claim.name, sandbox, tmpl, t0))
        return await self._wait(claim.name, req.timeout_seconds)

    async def _warm_ready(self, claim: ClaimRow, sandbox: SandboxRow, t0: float) -> None:
        try:
            await self._rotate(sandbox, self.token(sandbox.name), self.token(sandbox.name, claim))
        except httpx.HTTPError as exc:  # its execd is gone for good (it supervises itself): report and replace
            claim.phase, claim.message = "Failed", f"execd of sandbox {sandbox.name} did not answer: {exc}"
            await self._lose(sandbox, claim.message)
            self._arm_deadlines()
            return
        if claim.env:
            try:
                r = await self.http.put(f"http://{sandbox.ip}:{self._port(sandbox)}{wire.ENV_PATH}",
                                        json={"env": claim.env, "merge": False},
                                        headers={"Authorization": f"Bearer {self.token(sandbox.name, claim)}"})
                r.raise_for_status()
            except httpx.HTTPError as exc:
                claim.phase, claim.message = "Failed", f"set env: {exc}"
                await self.run(self.store.update_claim, claim.name, phase="Failed", message=claim.message)
                self._arm_deadlines()
                return
        claim.phase, claim.ready_at = "Ready", now()
        await self.run(self.store.update_claim, claim.name, phase="Ready", ready_at=claim.ready_at)
        metrics.claim_bound(claim.pool, vocab.API_WARM, time.monotonic() - t0)
        self._arm_deadlines()

    def _port(self, sandbox: SandboxRow) -> int:
        found = [t for t in self.desired.templates if t.name == sandbox.template]
        return found[0].execd_port if found else DEFAULT_EXECD_PORT

    async def _cold_start(self, claim: str, sandbox: SandboxRow, tmpl: DockerTemplate, t0: float) -> None:
        c = await self._claim(claim)
        try:
            async with self.cold_sem:
                await self._start_sandbox(sandbox, tmpl, c.env, self.token(sandbox.name, c))
        except Exception as exc:  # noqa: BLE001 - becomes the claim's status
            log.warning("claim %s: cold start failed: %s", claim, exc)
            await self.run(self.store.update_claim, claim, phase="Failed", sandbox=None,
                           message=f"cold start failed: {exc}")
            metrics.claim_ended(c.pool, vocab.API_COLD, vocab.R_START_FAILED)
        else:
            if await self.run(self.store.finish_cold, claim, sandbox.name, now()):
                metrics.claim_bound(c.pool, vocab.API_COLD, time.monotonic() - t0)
            else:  # the claim ended while its sandbox was starting
                await self._release_sandbox(sandbox.name, c)
        self._arm_deadlines()
        self._notify(claim)

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
        return self.to_api(c)

    async def get_claim(self, name: str) -> Claim:
        return self.to_api(await self._claim(name))

    async def list_claims(self, pool: str | None = None) -> list[Claim]:
        return [self.to_api(c) for c in await self.run(self.store.claims, pool=pool)]

    async def delete_claim(self, name: str) -> None:
        c = await self._claim(name)
        await self._end_claim(c, expired=False)

    async def _end_claim(self, c: ClaimRow, *, expired: bool) -> None:
        sandbox = await self.run(self.store.end_claim, c.name, expired=expired,
                                 message="the claim's TTL ran out" if expired else None)
        self._notify(c.name)
        if sandbox:
            row = await self.run(self.store.sandbox, sandbox)
            if row and row.state == "releasing":  # a cold start in flight releases its own sandbox when done
                await self._release_sandbox(sandbox, c)
        if expired:
            metrics.claim_ended(c.pool, c.launch_type, vocab.R_SHUTDOWN_TIME)

    async def _release_sandbox(self, name: str, claim: ClaimRow) -> None:
        """A claim ended: retain, recycle into its Pool (Restart/Noop), or delete the sandbox."""
        row = await self.run(self.store.sandbox, name)
        if row is None:
            return
        if claim.shutdown_policy == "Retain":
            await self.run(self.store.update_sandbox, name, state="retained", claim=None, pool=None,
                           retained_from=claim.name, retained_pool=row.pool, retained_at=now())
            return
        found = self.desired.pool(row.pool) if row.pool else None
        spec = found[1] if found else None
        tmpl_hash = self.desired.template(template_of(spec)).blueprint_hash() if spec else None
        if isinstance(spec, Pool) and spec.spec.recycle_strategy != "Delete" and row.hash == tmpl_hash \
                and row.image == self.desired.template(template_of(spec)).image:
            try:
                await self._recycle(row, spec.spec.recycle_strategy, claim)
                self.wake(row.pool)
                return
            except Exception as exc:  # noqa: BLE001 - fall back to delete
                log.warning("recycling %s failed (%s); deleting it", name, exc)
        await self.run(self.store.update_sandbox, name, state="deleting", claim=None)
        await self._delete_sandbox(name)

    async def _recycle(self, row: SandboxRow, strategy: str, claim: ClaimRow) -> None:
        # `recycling` is neither idle nor claimable: the pool planner must not trim it while it restarts.
        await self.run(self.store.update_sandbox, row.name, state="recycling", claim=None, launch_type=None)
        try:
            await self.run(engine.unpause, self.client, row.name)
        except Exception:  # noqa: BLE001 - not paused
            pass
        port = self._port(row)
        if strategy == "Restart":
            self._restarting.add(row.name)
            try:
                tmpl = self.desired.template(row.template)
                attrs = await self.run(engine.restart, self.client, row.name, token=self.token(row.name),
                                       user=tmpl.user, op="restart")
            finally:
                self._loop.call_later(5.0, self._restarting.discard, row.name)  # type: ignore[union-attr]
            addr = engine.address(attrs, tmpl.network, f"{port}/tcp")
            await self.run(self.store.update_sandbox, row.name, ip=addr["ip"], host_port=addr["host_port"])
            await self._wait_healthy(row.name, addr["ip"], port)
        else:
            r = await self.http.put(f"http://{row.ip}:{port}{wire.ENV_PATH}", json={"env": {}, "merge": False},
                                    headers={"Authorization": f"Bearer {self.token(row.name, claim)}"})
            r.raise_for_status()
            await self._rotate(row, self.token(row.name, claim), self.token(row.name))
        await self.run(self.store.update_sandbox, row.name, state="ready")

    async def renew_claim(self, name: str, ttl_seconds: int) -> Claim:
        c = await self._claim(name)
        if c.phase in ("Expired", "Failed"):
            raise Conflict(f"claim {name} is {c.phase}")
        await self.run(self.store.update_claim, name, expires_at=lifecycle.lease_end(now(), ttl_seconds))
        self._arm_deadlines()
        return self.to_api(await self._claim(name))

    async def _ready_sandbox(self, name: str, phases: tuple[str, ...] = ("Ready",)) -> tuple[ClaimRow, SandboxRow]:
        def both() -> tuple[ClaimRow | None, SandboxRow | None]:  # one thread hop: this is on every proxied call
            claim = self.store.claim(name)
            return claim, self.store.sandbox(claim.sandbox) if claim and claim.sandbox else None

        c, row = await self.run(both)
        if c is None:
            raise NotFound(f"no claim named {name!r}")
        if c.phase not in phases or not c.sandbox:
            raise Conflict(f"claim {name} is {c.phase}, not {' or '.join(phases)}")
        if row is None:
            raise Unavailable(f"claim {name}: its sandbox is gone")
        return c, row

    async def pause_claim(self, name: str) -> Claim:
        c, row = await self._ready_sandbox(name, ("Ready", "Paused"))
        if c.phase == "Ready":
            await self.run(engine.pause, self.client, row.name, op="pause")
            await self.run(self.store.update_claim, name, phase="Paused")
        return self.to_api(await self._claim(name))

    async def resume_claim(self, name: str) -> Claim:
        c, row = await self._ready_sandbox(name, ("Ready", "Paused"))
        if c.phase == "Paused":
            await self.run(engine.unpause, self.client, row.name, op="unpause")
            await self.run(self.store.update_claim, name, phase="Ready")
        return self.to_api(await self._claim(name))

    async def snapshot_claim(self, name: str, req: SnapshotRequest) -> Snapshot:
        c, row = await self._ready_sandbox(name, ("Ready", "Paused"))
        tmpl = self.desired.template(row.template)
        tag = req.tag or f"{name}-{int(time.time())}"
        out = await self.run(engine.commit, self.client, row.name, stack=self.s.stack, tag=tag, env=tmpl.env,
                             labels={engine.L_SNAPSHOT_OF: name}, op="commit")
        return Snapshot.model_validate(out)

    async def execd_target(self, name: str) -> ExecdTarget:
        c, row = await self._ready_sandbox(name)
        return ExecdTarget(url=f"http://{row.ip}:{self._port(row)}", token=self.token(row.name, c))

    def execd_unreachable(self, name: str) -> None:
        """The proxy could not connect to a Ready claim's execd. It supervises itself, so it is back within
        seconds unless its supervisor died too: then, after EXECD_GONE seconds without an answer, the claim
        becomes Failed and its sandbox is replaced, instead of a Ready claim answering 502 for good. Checked only
        after such a failure, never on a timer."""
        if name not in self._checking:
            self._checking.add(name)
            self.spawn(self._check_execd(name)).add_done_callback(lambda _: self._checking.discard(name))

    async def _check_execd(self, name: str) -> None:
        try:
            c, row = await self._ready_sandbox(name, ("Ready",))
        except Exception:  # noqa: BLE001 - gone or not Ready meanwhile: nothing to check
            return
        deadline = time.monotonic() + EXECD_GONE
        health = f"http://{row.ip}:{self._port(row)}{wire.HEALTH_PATH}"
        while time.monotonic() < deadline:
            try:
                if (await self.http.get(health, timeout=2.0)).is_success:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.5)
        current = await self.run(self.store.claim, name)
        if current is None or current.phase != "Ready" or current.sandbox != row.name:
            return
        log.warning("claim %s: execd of sandbox %s stayed gone for %.0f s; replacing it", name, row.name, EXECD_GONE)
        await self._lose(row, f"execd of sandbox {row.name} stopped answering")

    # --- deadlines --------------------------------------------------------------------------------------------------
    def _arm_deadlines(self) -> None:
        self._deadline.set()

    async def _deadline_loop(self) -> None:
        while True:
            self._deadline.clear()
            claims = await self.run(self.store.claims, phases=("Pending", "Ready", "Paused"))
            due = [c for c in claims if lifecycle.due(c.expires_at, now())]
            for c in due:
                try:
                    await self._end_claim(c, expired=True)
                except Exception:  # noqa: BLE001
                    log.exception("expiring claim %s", c.name)
            upcoming = [c.expires_at for c in claims if c.expires_at and c.expires_at > now()]
            timeout = max(0.05, min(upcoming) - now()) if upcoming else None
            try:
                await asyncio.wait_for(self._deadline.wait(), timeout)
            except TimeoutError:
                pass

def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())
