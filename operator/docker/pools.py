"""Pool workers of the Docker runtime: one per WarmPool/Pool, acting in slow-start batches (1, 2, 4, ... capped at
CORRAL_MAX_BATCH, planning.SlowStart as on Kubernetes) and re-planning after each batch; a failing batch backs off
exponentially instead of storming. A worker sleeps until its pool is woken (`Wake`: a claim bound or released one of
its sandboxes, a container of it is gone, the pools file was reloaded).

What a round decides is `plan_round`, a pure function of the pools file, the pool's store rows and the time (with the
planners of corral.operator.planning, as on Kubernetes); `PoolWorkers` reads the rows, exports the pool's counts and
acts on the plan through `Sandboxes`. Sandbox start = container create + start + execd healthy (sandboxes.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from corral.api import Pool, WarmPool
from corral.api.wire import PoolStatus
from corral.operator.core import lifecycle, metrics
from corral.operator.core.vocabulary import PoolKind
from corral.operator.planning import Plan, SlowStart, plan_pool, plan_warm_pool, pool_desired

from .desired import DesiredState, DockerTemplate, name_of, template_of
from .metrics import RECONCILES
from .runner import Runner
from .sandboxes import Sandboxes
from .settings import Settings
from .store import SandboxRow, Store, now

log = logging.getLogger("corral.operator.docker")


def desired_size(spec: WarmPool | Pool, allocated: int) -> int:
    """A pool's `desired` (the pool list, the desired gauge): a WarmPool's replicas, a Pool's total from the core."""
    if isinstance(spec, WarmPool):
        return spec.spec.replicas
    cap = spec.spec.capacity
    return pool_desired(buffer_min=cap.buffer_min, pool_min=cap.pool_min, pool_max=cap.pool_max, allocated=allocated)


@dataclass(frozen=True)
class Counts:
    """A pool's sandboxes by state, from its store rows."""

    idle: list[SandboxRow]      # no claim, creating or ready
    ready: int                  # idle and ready
    allocated: int              # claimed, or on their way back from a claim (releasing, recycling)
    terminating: int            # deleting

    @classmethod
    def of(cls, rows: Sequence[SandboxRow]) -> Counts:
        idle = [r for r in rows if r.claim is None and r.state in ("creating", "ready")]
        return cls(idle=idle, ready=sum(1 for r in idle if r.state == "ready"),
                   allocated=sum(1 for r in rows if r.claim is not None or r.state in ("releasing", "recycling")),
                   terminating=sum(1 for r in rows if r.state == "deleting"))


@dataclass(frozen=True)
class Round:
    """What one round of a pool's worker decided: the plan, the kind and template to create from (None for a pool
    removed from the pools file, which only drains), and its counts with its desired size (for the gauges)."""

    plan: Plan
    target: tuple[PoolKind, DockerTemplate] | None
    counts: Counts
    desired: int


def plan_round(desired: DesiredState, pool: str, rows: Sequence[SandboxRow], now: float) -> Round:
    """The plan of pool `pool` over its store rows `rows` at time `now`: a WarmPool's (replicas, update strategy,
    readiness grace), a Pool's (capacity, maxUnavailable), or, for a pool no longer in the pools file, deleting what
    is idle."""
    found = desired.pool(pool)
    counts = Counts.of(rows)
    idle = [r.member() for r in counts.idle]
    if found is None:  # removed from the pools file: drain what is idle
        plan = plan_warm_pool(replicas=0, idle=idle, current_hash=None, strategy="OnReplenish", expected_creates=0,
                              now=now, readiness_grace=lifecycle.DEFAULT_READINESS_GRACE)
        return Round(plan, None, counts, 0)
    kind, spec = found
    tmpl = desired.template(template_of(spec))
    if isinstance(spec, WarmPool):
        plan = plan_warm_pool(replicas=spec.spec.replicas, idle=idle, current_hash=tmpl.blueprint_hash(),
                              strategy=spec.spec.update_strategy.type, expected_creates=0, now=now,
                              readiness_grace=lifecycle.readiness_grace(spec.spec))
    else:
        cap = spec.spec.capacity
        plan = plan_pool(buffer_min=cap.buffer_min, buffer_max=cap.buffer_max, pool_min=cap.pool_min,
                         pool_max=cap.pool_max, max_unavailable=spec.spec.max_unavailable, idle=idle,
                         allocated=counts.allocated, terminating=counts.terminating, expected_creates=0,
                         current_hash=tmpl.blueprint_hash())
    return Round(plan, (kind, tmpl), counts, desired_size(spec, counts.allocated))


class Wake:
    """One event per pool worker: set to make the worker plan again. Listeners (`listen`) hear of every wake too
    (batches waiting for room in a pool)."""

    def __init__(self) -> None:
        self.events: dict[str, asyncio.Event] = {}
        self._listeners: list[Callable[[str | None], None]] = []

    def listen(self, listener: Callable[[str | None], None]) -> None:
        """`listener(pool)` on every wake of a pool (None: of every pool)."""
        self._listeners.append(listener)

    def event(self, pool: str) -> asyncio.Event:
        """The pool's event, made (and set, so a new worker plans at once) the first time."""
        if pool not in self.events:
            self.events[pool] = asyncio.Event()
            self.events[pool].set()
        return self.events[pool]

    def __call__(self, pool: str | None = None) -> None:
        """Wake one pool's worker, or every worker."""
        for name, ev in self.events.items():
            if pool is None or name == pool:
                ev.set()
        for listener in self._listeners:
            listener(pool)


class PoolWorkers:
    def __init__(self, settings: Settings, desired: Callable[[], DesiredState], store: Store, runner: Runner,
                 sandboxes: Sandboxes, wake: Wake):
        self.s, self.desired, self.store, self.runner = settings, desired, store, runner
        self.sandboxes, self.wake = sandboxes, wake
        self.sem = asyncio.Semaphore(settings.max_pool_creates)
        self.workers: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        """A worker for every pool of the pools file and every pool that still has sandboxes (a removed pool's
        worker drains it); workers already running are kept."""
        names = {name_of(p) for p in self.desired().all_pools()}
        names |= {r.pool for r in self.store.sandboxes() if r.pool}
        for name in names:
            if name not in self.workers or self.workers[name].done():
                self.wake.events.pop(name, None)
                self.wake.event(name)
                self.workers[name] = asyncio.get_running_loop().create_task(self.work(name))

    def plan(self, pool: str) -> tuple[Plan, tuple[PoolKind, DockerTemplate] | None]:
        """One round's plan from the store (blocking: run on the runner's threads); exports the pool's gauges."""
        r = plan_round(self.desired(), pool, self.store.sandboxes(pool=pool), now())
        metrics.pool_sandboxes(self.s.stack, pool, desired=r.desired, ready=r.counts.ready,
                               idle=len(r.counts.idle), allocated=r.counts.allocated)
        RECONCILES.labels(pool).inc()
        return r.plan, r.target

    async def list_pools(self) -> list[PoolStatus]:
        """GET /v1/pools: every pool of the pools file with its counts, from one read of the store."""
        rows = await self.runner.run(self.store.sandboxes)
        out = []
        for spec in self.desired().all_pools():
            c = Counts.of([r for r in rows if r.pool == name_of(spec)])
            out.append(PoolStatus(name=name_of(spec), kind=spec.kind, template=template_of(spec),
                                  desired=desired_size(spec, c.allocated), ready=c.ready, idle=len(c.idle),
                                  allocated=c.allocated))
        return out

    async def work(self, pool: str) -> None:
        """One worker per pool: plan, act on one slow-start batch, re-plan; sleep until woken."""
        ev, pace, failures = self.wake.event(pool), SlowStart(self.s.max_batch), 0
        while True:
            await ev.wait()
            ev.clear()
            while True:
                plan, target = await self.runner.run(self.plan, pool)
                if not plan.create and not plan.delete:
                    pace.reset()
                    break
                for m in plan.delete[:pace.take(len(plan.delete))]:
                    await self.runner.run(self.store.update_sandbox, m.name, state="deleting")
                    self.runner.spawn(self.sandboxes.delete(m.name))
                if plan.create and target:
                    kind, tmpl = target
                    n = pace.take(plan.create)
                    results = await asyncio.gather(*[self.create_idle(pool, kind, tmpl) for _ in range(n)],
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

    async def create_idle(self, pool: str, kind: str, tmpl: DockerTemplate) -> None:
        row = SandboxRow(name=f"corral-{self.s.stack}-{pool}-{secrets.token_hex(3)}", template=tmpl.name,
                         state="creating", created=now(), pool=pool, pool_kind=kind, hash=tmpl.blueprint_hash(),
                         image=tmpl.image)
        await self.runner.run(self.store.add_sandbox, row)
        async with self.sem:
            await self.sandboxes.start(row, tmpl, {}, self.sandboxes.token(row.name))
        await self.runner.run(self.store.update_sandbox, row.name, state="ready")

    async def stop(self) -> None:
        for t in self.workers.values():
            t.cancel()
        await asyncio.gather(*self.workers.values(), return_exceptions=True)
