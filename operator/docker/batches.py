"""Batches on Docker: N sandboxes of one pool and one task in each (the claims API's /v1/batches), from the same
rules as the Kubernetes operator's SandboxBatch (corral.operator.core.batches: claim labels, the task's request, how
an index ended, counts and phase).

Binding is the claims' (Store.bind_batch, one transaction for the whole batch): warm sandboxes of the pool in the
core's adoption order first, new cold ones for the rest, a Pool's within its poolMax; indexes that do not fit wait
for room, woken when a sandbox of the pool is released or deleted (never on a timer). A batch's sandbox carries the
claim label `<batch>_<index>` in the store, so every pool rule counts it as taken. Its execd token is the index's
own (derived like a claim's, from the label and the batch's creation time: a warm sandbox's is rotated to it first).

Each index's task is one background command in its sandbox's execd (core.batches.task_request, with the index in
CORRAL_BATCH_INDEX and a key naming the batch, index and sandbox, so asking again never starts it twice), followed
to its end over one Server-Sent Events connection (GET /v1/command/{id}/wait: a keepalive comment every KEEPALIVE
seconds, then the exit). No request is made while a task runs. When it ended, the tail of its output is read once
(core.outputs) and the end is recorded in the store with it, in one transaction that also releases the sandbox
(shutdownPolicy Delete: recycled into its Pool or deleted; Retain: kept until the batch is deleted).

The store is the durable copy: the command id is written as soon as execd answers, so a restarted operator
re-attaches to every running task by its id (`resume`) and loses no result (execd keeps a finished background
command, and its wait stream answers with its exit at once). A sandbox lost mid-task (its container gone) fails its
index only (SandboxLost); an execd silent for EXECD_PATIENCE seconds fails it with ExecdUnreachable. timeoutSeconds
is execd's (it kills the task's process tree: TaskTimeout); ttlSecondsAfterFinished deletes a finished batch on a
timer armed for the next such deadline.

Watchers (`watch`, the events stream) are woken by the changes themselves; the batch metrics are the core's, with
the Kubernetes operator's names and labels (the stack is the namespace label), each transition counted once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, cast

import httpx

from corral.api import Pool
from corral.api.batch import BatchTask
from corral.api.claim import EnvVar
from corral.api.wire import Batch, BatchIndexPhase, BatchPhase, BatchRequest, BatchTaskRequest, BatchTaskResult
from corral.operator.claimsapi import Conflict, Invalid, NotFound
from corral.operator.core import batches as core
from corral.operator.core import lifecycle, metrics
from corral.operator.core import vocabulary as vocab
from corral.operator.core.outputs import Tail
from corral.operator.planning import Member, adoption_order
from corral.operator.taskexec import (
    EXECD_PATIENCE,
    MAX_BACKOFF,
    Contact,
    StartRefused,
    output_tail,
    start,
    task_key,
    wait,
)

from .desired import DesiredState, DockerTemplate, template_of
from .pools import Wake
from .runner import Runner
from .sandboxes import Sandboxes
from .settings import Settings
from .store import BatchRow, SandboxRow, Store, TaskRow, now

log = logging.getLogger("corral.operator.docker.batch")

COALESCE = 0.02  # seconds a watcher lets changes gather after a wake (tasks ending together: one state)
DELETE_GRACE = 30.0  # seconds DELETE waits for the batch's sandboxes to go (they go on in the background after)


def resource_task(req: BatchTaskRequest) -> BatchTask:
    """The resource model's task (what the store keeps and core.batches reads) of a claims API request's."""
    return BatchTask(argv=req.argv, command=req.command, env=[EnvVar(name=k, value=v) for k, v in req.env.items()],
                     working_dir=req.working_dir, timeout_seconds=req.timeout_seconds)


def _dt(t: float | None) -> datetime | None:
    return datetime.fromtimestamp(t, UTC) if t else None


def phase_of(b: BatchRow, tasks: list[TaskRow]) -> tuple[str, core.Counts]:
    """The batch's phase and counts from its tasks (core.batches); a final phase once recorded stays."""
    counts = core.count({"phase": t.phase, "sandbox": t.sandbox} for t in tasks)
    return b.phase or core.batch_phase(b.replicas, True, counts), counts


def to_api(b: BatchRow, tasks: list[TaskRow], *, outputs: bool) -> Batch:
    phase, c = phase_of(b, tasks)
    results = [BatchTaskResult(index=t.idx, sandbox=t.sandbox, launch_type=vocab.api_launch_type(t.launch_type),
                               phase=cast(BatchIndexPhase, t.phase), exit_code=t.exit_code, reason=t.reason,
                               message=t.message, output=t.output if outputs else None,
                               output_truncated=bool(t.output_truncated) and outputs) for t in tasks]
    return Batch(name=b.name, pool=b.pool, pool_kind=b.pool_kind, phase=cast(BatchPhase, phase), replicas=b.replicas,
                 bound=c.bound, running=c.running, succeeded=c.succeeded, failed=c.failed,
                 created=datetime.fromtimestamp(b.created, UTC), started_at=_dt(b.started_at),
                 finished_at=_dt(b.finished_at), shutdown_policy=b.shutdown_policy, message=b.message,
                 results=results)


class Batches:
    def __init__(self, settings: Settings, desired: Callable[[], DesiredState], store: Store, runner: Runner,
                 sandboxes: Sandboxes, wake: Wake, cold: asyncio.Semaphore):
        """`cold` bounds cold starts together with the claims'; `wake` wakes pool workers and tells this part when
        a pool may have room again."""
        self.s, self.desired, self.store, self.runner = settings, desired, store, runner
        self.sandboxes, self.wake, self.cold = sandboxes, wake, cold
        # the wait streams: one per running task, open for as long as it runs (not bounded like the shared client)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(10.0, connect=2.0),
                                      limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self._followers: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._watchers: dict[str, set[asyncio.Event]] = {}
        self._waiting: dict[str, set[str]] = {}      # pool -> batches with indexes waiting for it (or for room)
        self._binding: dict[str, asyncio.Lock] = {}  # one bind of a batch at a time
        self._running: set[tuple[str, int]] = set()  # indexes counted in corral_batch_tasks_running
        self._deadline = asyncio.Event()
        wake.listen(self.pool_changed)

    async def stop(self) -> None:
        for t in self._followers.values():
            t.cancel()
        await asyncio.gather(*self._followers.values(), return_exceptions=True)
        await self.http.aclose()

    # --- the claims API -----------------------------------------------------------------------------------------
    async def create(self, req: BatchRequest) -> Batch:
        found = self.desired().pool(req.pool)
        if found is None:
            raise NotFound(f"no WarmPool or Pool named {req.pool!r}")
        name = req.name or f"batch-{secrets.token_hex(5)}"
        if problem := core.name_problem(name):
            raise Invalid(problem)
        row = BatchRow(name=name, uid=secrets.token_hex(8), pool=req.pool, pool_kind=found[0],
                       replicas=req.replicas,
                       task=resource_task(req.task).model_dump_json(by_alias=True, exclude_none=True),
                       created=now(), shutdown_policy=req.shutdown_policy,
                       ttl_after_finished=req.ttl_seconds_after_finished)
        row, new = await self.runner.run(self.store.add_batch, row)
        if not new and row.pool != req.pool:
            raise Conflict(f"batch {name} exists for {row.pool_kind} {row.pool!r}, not {req.pool!r}")
        if new:
            log.info("batch %s: %d replicas of %s %s", name, row.replicas, row.pool_kind, row.pool)
            self.runner.spawn(self.bind(name))
        return await self._read(name, outputs=False)

    async def get(self, name: str) -> Batch:
        return await self._read(name, outputs=True)

    async def list(self, pool: str | None = None) -> list[Batch]:
        found = await self.runner.run(self.store.batches_with_tasks, pool=pool)
        return [to_api(b, tasks, outputs=False) for b, tasks in found]

    async def _read(self, name: str, *, outputs: bool) -> Batch:
        b, tasks = await self.runner.run(self.store.batch_with_tasks, name)
        if b is None:
            raise NotFound(f"no batch named {name!r}")
        return to_api(b, tasks, outputs=outputs)

    async def watch(self, name: str) -> AsyncIterator[Batch]:
        """The batch now, then after each change, until it is finished (see ClaimsBackend.watch_batch)."""
        ev = asyncio.Event()
        self._watchers.setdefault(name, set()).add(ev)
        try:
            last: Batch | None = None
            while True:
                ev.clear()
                try:
                    batch = await self._read(name, outputs=True)
                except NotFound:
                    if last is None:
                        raise
                    raise NotFound(f"batch {name} was deleted") from None
                if batch != last:
                    yield batch
                    if batch.finished:
                        return
                    last = batch
                    continue  # changes that came meanwhile: look again before waiting
                await ev.wait()
                await asyncio.sleep(COALESCE)
        finally:
            subs = self._watchers.get(name)
            if subs is not None:
                subs.discard(ev)
                if not subs:
                    self._watchers.pop(name, None)

    async def delete(self, name: str) -> None:
        """Running tasks are killed with their sandboxes (deleted); the sandboxes of ended tasks (Retain) are
        released like a claim's (recycled into their Pool, or deleted). Returns once they are gone, or after
        DELETE_GRACE seconds."""
        b = await self.runner.run(self.store.batch, name)
        if b is None:
            raise NotFound(f"no batch named {name!r}")
        for key in [k for k in self._followers if k[0] == name]:
            self._followers.pop(key).cancel()
        removed = await self.runner.run(self.store.remove_batch, name)
        running = {k for k in self._running if k[0] == name}
        self._running -= running
        metrics.batch_tasks_running(self.s.stack, b.pool, -len(running))
        for waiting in self._waiting.values():
            waiting.discard(name)
        self._binding.pop(name, None)
        self._changed(name)
        log.info("batch %s deleted (%d sandboxes to release)", name, len(removed))
        jobs = [self.runner.spawn(self.sandboxes.release(sandbox, b.holder(index)) if ended
                                  else self.sandboxes.discard(sandbox)) for sandbox, index, ended in removed]
        if jobs:
            await asyncio.wait(jobs, timeout=DELETE_GRACE)

    # --- binding ------------------------------------------------------------------------------------------------
    def pool_changed(self, pool: str | None) -> None:
        """A pool may have room again (a sandbox of it was released or deleted), or the pools file was reloaded
        (None): the batches waiting for it bind again."""
        names: set[str] = set()
        for p in [pool] if pool is not None else list(self._waiting):
            names |= self._waiting.pop(p, set())
        for name in names:
            self.runner.spawn(self.bind(name))

    async def bind(self, name: str) -> None:
        """Bind the batch's pending indexes: warm first, cold for the rest, a Pool's within poolMax; the indexes that
        do not fit wait for room."""
        lock = self._binding.setdefault(name, asyncio.Lock())
        async with lock:
            b, tasks = await self.runner.run(self.store.batch_with_tasks, name)
            pending = [t.idx for t in tasks if t.phase == vocab.PENDING]
            if b is None or b.phase or not pending:
                return
            found = self.desired().pool(b.pool)
            if found is None:
                self._waiting.setdefault(b.pool, set()).add(name)
                await self._message(b, f"{b.pool_kind} {b.pool!r} is not in the pools file; waiting for it")
                return
            kind, spec = found
            tmpl = self.desired().template(template_of(spec))
            limit = spec.spec.capacity.pool_max if isinstance(spec, Pool) else None
            if limit is not None:  # registered before the binding: a release meanwhile binds again
                self._waiting.setdefault(b.pool, set()).add(name)

            def order(members: list[Member]) -> list[Member]:
                return adoption_order(members, tmpl.blueprint_hash(), set())

            def cold() -> SandboxRow:
                return SandboxRow(name=f"corral-{self.s.stack}-{b.pool}-{secrets.token_hex(3)}", template=tmpl.name,
                                  state="creating", created=now(), pool=b.pool, pool_kind=kind,
                                  hash=tmpl.blueprint_hash(), image=tmpl.image)

            bound = await self.runner.run(self.store.bind_batch, b, pending, order, cold, limit)
            left = len(pending) - len(bound)
            if not left:
                self._waiting.get(b.pool, set()).discard(name)
            for index, row in bound:
                if row.launch_type == vocab.API_COLD:
                    self.runner.spawn(self._cold_start(b, index, row, tmpl))
                else:
                    self._follow(b, index)
            if bound:
                self.wake(b.pool)
            await self._message(b, f"Pool {b.pool} is at poolMax ({limit}); {left} indexes wait for room"
                                if left else None)
            self._changed(name)

    async def _message(self, b: BatchRow, message: str | None) -> None:
        if message != b.message:
            b.message = message
            await self.runner.run(self.store.update_batch, b.name, message=message)
            self._changed(b.name)

    async def _cold_start(self, b: BatchRow, index: int, row: SandboxRow, tmpl: DockerTemplate) -> None:
        holder = b.holder(index)
        try:
            async with self.cold:
                await self.sandboxes.start(row, tmpl, {}, self.sandboxes.token(row.name, holder))
        except Exception as exc:  # noqa: BLE001 - this index fails, the others go on
            log.warning("batch %s index %d: cold start failed: %s", b.name, index, exc)
            await self._end(b, index, vocab.FAILED, vocab.R_START_FAILED, f"cold start failed: {exc}",
                            release=False)
            return
        if await self.runner.run(self.store.finish_batch_cold, b.name, index, row.name):
            self._follow(b, index)
        else:  # the batch went while its sandbox was starting
            await self.sandboxes.release(row.name, holder)

    # --- the tasks ----------------------------------------------------------------------------------------------
    def _follow(self, b: BatchRow, index: int) -> None:
        key = (b.name, index)
        if key in self._followers and not self._followers[key].done():
            return
        task = self.runner.spawn(self._run(b, index))
        self._followers[key] = task
        task.add_done_callback(lambda t: self._followers.pop(key, None) if self._followers.get(key) is t else None)

    def _task_and_sandbox(self, batch: str, index: int) -> tuple[TaskRow | None, SandboxRow | None]:
        t = self.store.task(batch, index)
        return t, self.store.sandbox(t.sandbox) if t and t.sandbox else None

    async def _run(self, b: BatchRow, index: int, *, patience: float = EXECD_PATIENCE) -> None:
        """Start (or find) index `index`'s task and follow it to its end; its outcome goes into the store."""
        task = BatchTask.model_validate_json(b.task)
        label, holder = core.claim_label(b.name, index), b.holder(index)
        contact, backoff, handed = Contact(), 0.5, False
        while True:
            t, row = await self.runner.run(self._task_and_sandbox, b.name, index)
            if t is None or t.phase in core.INDEX_ENDED:
                return
            if row is None or row.claim != label or row.state != "ready":
                return  # lost: recovery fails the index (sandbox_lost)
            url, token = self.sandboxes.url(row), self.sandboxes.token(row.name, holder)
            attempt = time.monotonic()
            try:
                if not t.command_id:
                    if t.launch_type == vocab.API_WARM and not handed:
                        await self._hand_over(row, holder)
                        handed = True
                    t.command_id = await start(self.http, url, token, task, index, task_key(b.uid, index, row.name))
                    contact.heard()
                    await self.runner.run(self.store.update_task, b.name, index, command_id=t.command_id,
                                          phase=core.RUNNING)
                    self._count_running(b, index)
                    self._changed(b.name)
                final = await wait(self.http, url, token, t.command_id, contact)
            except StartRefused as exc:
                await self._end(b, index, vocab.FAILED, vocab.R_START_FAILED, str(exc))
                return
            except (httpx.HTTPError, ValueError) as exc:
                silent = contact.silent()
                if silent >= patience:
                    await self._end(b, index, vocab.FAILED, core.R_EXECD_UNREACHABLE,
                                    f"execd of sandbox {row.name} did not answer for {silent:.0f} s "
                                    f"(last: {exc or type(exc).__name__})")
                    return
                if contact.at >= attempt:  # it answered during this attempt (a stream that broke): start over
                    backoff = 0.5
                pause = min(backoff, patience - silent)
                log.info("batch %s index %d: execd of %s: %s; again in %.1fs", b.name, index, row.name,
                         exc or type(exc).__name__, pause)
                await asyncio.sleep(pause)
                backoff = min(MAX_BACKOFF, backoff * 2)
                continue
            if final is None:
                await self._end(b, index, vocab.FAILED, core.R_TASK_LOST,
                                f"execd of sandbox {row.name} no longer knows the task's command {t.command_id} "
                                "(it restarted)")
                return
            # its output before the end is recorded: the end releases the sandbox
            tail = await output_tail(self.http, url, token, t.command_id)
            outcome = core.task_outcome(final.get("exit_code"), signal=final.get("signal"),
                                        timed_out=bool(final.get("timed_out")),
                                        interrupted=bool(final.get("interrupted")))
            await self._end(b, index, outcome.phase, outcome.reason, outcome.message, outcome.exit_code, tail)
            return

    async def _hand_over(self, row: SandboxRow, holder: Any) -> None:
        """A warm sandbox's execd takes the index's token (authenticated with the idle one). 401: it has it already
        (a restarted operator rotated it before)."""
        try:
            await self.sandboxes.rotate(row, self.sandboxes.token(row.name), self.sandboxes.token(row.name, holder))
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code != 401:
                raise

    # --- ends ---------------------------------------------------------------------------------------------------
    def _count_running(self, b: BatchRow, index: int) -> None:
        if (b.name, index) not in self._running:
            self._running.add((b.name, index))
            metrics.batch_tasks_running(self.s.stack, b.pool, 1)

    async def _end(self, b: BatchRow, index: int, phase: str, reason: str, message: str,
                   exit_code: int | None = None, tail: Tail | None = None, *, release: bool | None = None) -> None:
        """Record how index `index` ended (once) and release its sandbox (shutdownPolicy), then settle the batch."""
        if release is None:
            release = b.shutdown_policy != "Retain"
        ended, sandbox = await self.runner.run(
            self.store.end_task, b.name, index, phase=phase, reason=reason, message=message, exit_code=exit_code,
            output=tail.text if tail else None, output_truncated=bool(tail and tail.truncated), release=release)
        if not ended:
            return
        if (b.name, index) in self._running:
            self._running.discard((b.name, index))
            metrics.batch_tasks_running(self.s.stack, b.pool, -1)
        metrics.batch_task_ended(b.pool, reason)
        self._changed(b.name)
        if sandbox:
            self.runner.spawn(self.sandboxes.release(sandbox, b.holder(index)))
        await self._settle(b.name)

    async def _settle(self, name: str) -> None:
        """Record the batch's final phase once every index ended (its TTL counts from then)."""
        b, tasks = await self.runner.run(self.store.batch_with_tasks, name)
        if b is None or b.phase:
            return
        phase, c = phase_of(b, tasks)
        if phase not in core.FINAL_BATCH_PHASES:
            return
        finished = now()
        if await self.runner.run(self.store.finish_batch, name, phase, finished):
            metrics.batch_finished(b.pool, phase, finished - b.created)
            log.info("batch %s %s: %d succeeded, %d failed", name, phase, c.succeeded, c.failed)
            self._deadline.set()
            self._changed(name)

    def _changed(self, name: str) -> None:
        for ev in self._watchers.get(name, ()):
            ev.set()

    # --- recovery -----------------------------------------------------------------------------------------------
    async def sandbox_lost(self, row: SandboxRow, why: str) -> None:
        """The container of an index's sandbox is gone (recovery): that index fails, the rest go on."""
        parsed = core.parse_claim_label(row.claim)
        if parsed is None:
            return
        name, index = parsed
        follower = self._followers.pop((name, index), None)
        if follower is not None:
            follower.cancel()
        b = await self.runner.run(self.store.batch, name)
        if b is not None:
            await self._end(b, index, vocab.FAILED, vocab.R_SANDBOX_LOST, why, release=False)

    async def start_cut_short(self, row: SandboxRow) -> None:
        """The cold sandbox of an index was still starting when the operator stopped (recovery removed it): the
        index is Pending again (its task never started) and is bound anew by `resume`."""
        parsed = core.parse_claim_label(row.claim)
        if parsed is not None:
            await self.runner.run(self.store.unbind_task, parsed[0], parsed[1], row.name)

    async def resume(self) -> None:
        """After a start (and the resync): follow every task that was bound or running, by its command id; bind
        what is pending; arm the TTLs of finished batches."""
        for b, tasks in await self.runner.run(self.store.batches_with_tasks):
            if b.phase:
                continue
            for t in tasks:
                if t.phase == core.RUNNING:
                    self._count_running(b, t.idx)
                if t.phase not in (core.BOUND, core.RUNNING):
                    continue
                row = await self.runner.run(self.store.sandbox, t.sandbox) if t.sandbox else None
                if row is None or row.claim != core.claim_label(b.name, t.idx):
                    await self._end(b, t.idx, vocab.FAILED, vocab.R_SANDBOX_LOST,
                                    f"sandbox {t.sandbox} was gone when the operator started", release=False)
                else:
                    self._follow(b, t.idx)
            self.runner.spawn(self.bind(b.name))
            await self._settle(b.name)
        self._deadline.set()

    async def deadlines(self) -> None:
        """Delete finished batches whose ttlSecondsAfterFinished passed, sleeping until the next one."""
        while True:
            self._deadline.clear()
            finished = await self.runner.run(self.store.batches, finished=True)
            expiries = [(lifecycle.finished_expiry(b.finished_at or b.created, b.ttl_after_finished), b.name)
                        for b in finished if b.ttl_after_finished is not None]
            for expiry, name in expiries:
                if lifecycle.due(expiry, now()):
                    log.info("batch %s: ttlSecondsAfterFinished passed; deleting", name)
                    try:
                        await self.delete(name)
                    except NotFound:
                        pass
                    except Exception:  # noqa: BLE001
                        log.exception("deleting batch %s", name)
            upcoming = [e for e, _ in expiries if e is not None and e > now()]
            timeout = max(0.05, min(upcoming) - now()) if upcoming else None
            try:
                await asyncio.wait_for(self._deadline.wait(), timeout)
            except TimeoutError:
                pass
