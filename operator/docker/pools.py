"""Pool workers of the Docker runtime: one per WarmPool/Pool, planning with corral.operator.planning and acting in
slow-start batches (1, 2, 4, ... capped at CORRAL_MAX_BATCH, planning.SlowStart as on Kubernetes), re-planning after
each batch; a failing batch backs off exponentially instead of storming. Sandbox start = container create + start +
execd healthy."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

import httpx

from corral.api import Pool, WarmPool
from corral.execd import wire
from corral.api.wire import PoolStatus
from corral.operator.core import lifecycle, metrics
from corral.operator.planning import SlowStart, plan_pool, plan_warm_pool, pool_desired

from . import engine
from .base import RuntimeBase
from .desired import DockerTemplate, name_of, template_of
from .metrics import RECONCILES, SANDBOX_START
from .store import SandboxRow, now

log = logging.getLogger("corral.operator.docker")


def desired_size(spec: WarmPool | Pool, allocated: int) -> int:
    """A pool's `desired` (the pool list, the desired gauge): a WarmPool's replicas, a Pool's total from the core."""
    if isinstance(spec, WarmPool):
        return spec.spec.replicas
    cap = spec.spec.capacity
    return pool_desired(buffer_min=cap.buffer_min, pool_min=cap.pool_min, pool_max=cap.pool_max, allocated=allocated)


class PoolsMixin(RuntimeBase):
    """Part of DockerRuntime (runtime.py): the attributes used here are set up there (declared in base.py)."""

    def _plan(self, pool: str):
        found = self.desired.pool(pool)
        rows = self.store.sandboxes(pool=pool)
        idle = [r.member() for r in rows if r.claim is None and r.state in ("creating", "ready")]
        allocated = sum(1 for r in rows if r.claim is not None or r.state in ("releasing", "recycling"))
        terminating = sum(1 for r in rows if r.state == "deleting")
        metrics.pool_sandboxes(self.s.stack, pool, desired=desired_size(found[1], allocated) if found else 0,
                               ready=sum(1 for m in idle if m.ready), idle=len(idle), allocated=allocated)
        RECONCILES.labels(pool).inc()
        if found is None:  # removed from the pools file: drain what is idle
            return plan_warm_pool(replicas=0, idle=idle, current_hash=None, strategy="OnReplenish",
                                  expected_creates=0, now=now(),
                                  readiness_grace=lifecycle.DEFAULT_READINESS_GRACE), None
        kind, spec = found
        tmpl = self.desired.template(template_of(spec))
        if isinstance(spec, WarmPool):
            plan = plan_warm_pool(replicas=spec.spec.replicas, idle=idle, current_hash=tmpl.blueprint_hash(),
                                  strategy=spec.spec.update_strategy.type, expected_creates=0, now=now(),
                                  readiness_grace=lifecycle.readiness_grace(spec.spec))
        else:
            cap = spec.spec.capacity
            plan = plan_pool(buffer_min=cap.buffer_min, buffer_max=cap.buffer_max, pool_min=cap.pool_min,
                             pool_max=cap.pool_max, max_unavailable=spec.spec.max_unavailable, idle=idle,
                             allocated=allocated, terminating=terminating, expected_creates=0,
                             current_hash=tmpl.blueprint_hash())
        return plan, (kind, tmpl)

    async def list_pools(self) -> list[PoolStatus]:
        """GET /v1/pools: every pool of the pools file with its counts, from one read of the store."""
        rows = await self.run(self.store.sandboxes)
        out = []
        for spec in self.desired.all_pools():
            mine = [r for r in rows if r.pool == name_of(spec)]
            idle = [r for r in mine if r.claim is None and r.state in ("creating", "ready")]
            allocated = sum(1 for r in mine if r.claim is not None or r.state in ("releasing", "recycling"))
            out.append(PoolStatus(name=name_of(spec), kind=spec.kind, template=template_of(spec),
                                  desired=desired_size(spec, allocated),
                                  ready=sum(1 for r in idle if r.state == "ready"), idle=len(idle),
                                  allocated=allocated))
        return out

    async def _pool_worker(self, pool: str) -> None:
        """One worker per pool: plan, act on one slow-start batch, re-plan; sleep until woken."""
        ev, pace, failures = self._wake[pool], SlowStart(self.s.max_batch), 0
        while True:
            await ev.wait()
            ev.clear()
            while True:
                plan, target = await self.run(self._plan, pool)
                if not plan.create and not plan.delete:
                    pace.reset()
                    break
                for m in plan.delete[:pace.take(len(plan.delete))]:
                    await self.run(self.store.update_sandbox, m.name, state="deleting")
                    self.spawn(self._delete_sandbox(m.name))
                if plan.create and target:
                    kind, tmpl = target
                    n = pace.take(plan.create)
                    results = await asyncio.gather(*[self._create_idle(pool, kind, tmpl) for _ in range(n)],
                                                   return_exceptions=True)
                    errors = [r for r in results if isinstance(r, BaseException)]
                    if errors:
                        failures += 1
                        delay = min(60.0, 2.0 ** failures)
                        log.warning("pool %s: %d of %d creates failed (%s); retrying in %.0f s", pool, len(errors),
                                    n, errors[0], delay)
                        pace.reset()
                        await asyncio.sleep(delay)
                        continue
                    failures = 0
                pace.grow()

    async def _create_idle(self, pool: str, kind: str, tmpl: DockerTemplate) -> None:
        row = SandboxRow(name=f"corral-{self.s.stack}-{pool}-{secrets.token_hex(3)}", template=tmpl.name,
                         state="creating", created=now(), pool=pool, pool_kind=kind, hash=tmpl.blueprint_hash(),
                         image=tmpl.image)
        await self.run(self.store.add_sandbox, row)
        async with self.pool_sem:
            await self._start_sandbox(row, tmpl, {}, self.token(row.name))
        await self.run(self.store.update_sandbox, row.name, state="ready")

    async def _start_sandbox(self, row: SandboxRow, tmpl: DockerTemplate, env: dict[str, str], token: str) -> None:
        """Create + start the container of a `creating` row and wait until its execd answers; `token` is the idle
        sandbox's, or its cold claim's."""
        t0 = time.monotonic()
        if env:
            tmpl = tmpl.model_copy(update={"env": {**tmpl.env, **env}})
        try:
            addr = await self.run(engine.create_sandbox, self.client, stack=self.s.stack, name=row.name, tmpl=tmpl,
                                  image=row.image or tmpl.image, token=token,
                                  execd_volume=self.execd_volume, pool=row.pool, pool_kind=row.pool_kind,
                                  health_interval=self.s.health_interval, op="create")
            await self.run(self.store.update_sandbox, row.name, container_id=addr["id"], ip=addr["ip"],
                           host_port=addr["host_port"])
            await self._wait_healthy(row.name, addr["ip"], tmpl.execd_port)
        except BaseException:
            await self.run(engine.remove, self.client, row.name, op="remove")
            await self.run(self.store.remove_sandbox, row.name)
            raise
        SANDBOX_START.observe(time.monotonic() - t0)

    async def _wait_healthy(self, name: str, ip: str | None, port: int) -> None:
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

    async def _delete_sandbox(self, name: str) -> None:
        await self.run(engine.remove, self.client, name, op="remove")
        row = await self.run(self.store.sandbox, name)
        await self.run(self.store.remove_sandbox, name)
        if row and row.pool:
            self.wake(row.pool)

