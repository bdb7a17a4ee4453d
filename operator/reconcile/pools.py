"""WarmPool and Pool: keep the right number of idle sandboxes, in slow-start batches, counting what is in flight."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from corral.api import CorralValidationError, PoolSpec, WarmPoolSpec, validate
from corral.api.pool import PoolStatus
from corral.api.warmpool import WarmPoolStatus

from ..builders import owner_ref, sandbox_labels, sandbox_manifest
from ..constants import A_CLAIM_UID, L_CLAIM, L_POOL, L_POOL_KIND
from ..context import Context
from ..core import lifecycle, metrics
from ..core import vocabulary as v
from ..kube import ignore, status_code
from ..planning import Member, plan_pool, plan_warm_pool, pool_desired, slow_start, unready_from
from ..views import ClaimView, PoolView, TemplateView, checked, status_patch
from .conditions import condition, differs, set_condition
from .handover import take_back

log = logging.getLogger("corral.operator.pool")
STATUS: dict[str, type[WarmPoolStatus | PoolStatus]] = {"WarmPool": WarmPoolStatus, "Pool": PoolStatus}


def selector(kind: str, name: str) -> str:
    return f"{L_POOL}={name},{L_POOL_KIND}={kind}"


async def _fail_status(ctx: Context, pool: PoolView, reason: str, message: str) -> None:
    gen = pool.generation
    model = STATUS[pool.kind]
    desired = status_patch(model, observed_generation=gen,
                           conditions=set_condition(pool.conditions, "Ready", False, reason, message, gen))
    if differs(pool.status, desired):
        await ctx.kube.patch(pool.kind, pool.name, pool.namespace, {"status": checked(model, desired)}, status=True)


async def run_batches(n: int, make: Any, cap: int, label: str = "") -> tuple[int, Exception | None]:
    """Run `make()` n times in slow-start batches (1, 2, 4, ...). Stops at the first batch with an error."""
    done = 0
    for size in slow_start(n, cap):
        log.info("%s: create batch of %d", label, size)
        results = await asyncio.gather(*(make() for _ in range(size)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, Exception)]
        done += size - len(errors)
        if errors:
            return done, errors[0]
    return done, None


async def delete_batches(ctx: Context, victims: list[Member], cap: int) -> tuple[int, Exception | None]:
    """Delete sandboxes in slow-start batches, each only if unchanged since we looked (so never one that a claim
    just adopted: that write bumped its resourceVersion)."""
    queue = list(victims)
    done = 0
    for size in slow_start(len(queue), cap):
        batch, queue = queue[:size], queue[size:]
        results = await asyncio.gather(*(
            ignore({404, 409}, ctx.kube.delete("Sandbox", m.name, m.namespace, uid=m.uid,
                                               resource_version=m.resource_version))
            for m in batch), return_exceptions=True)
        errors = [r for r in results if isinstance(r, Exception)]
        done += size - len(errors)
        if errors:
            return done, errors[0]
    return done, None


async def _load(ctx: Context, kind: str, model: type[WarmPoolSpec | PoolSpec], ns: str,
                name: str) -> tuple[PoolView, Any, TemplateView, str] | None:
    """The pool, its validated spec, its template and blueprint hash; None (with a condition set) if it can't run."""
    body = ctx.cache.pool_of_kind(ns, kind, name)
    if body is None:  # gone: so is what was kept for it
        ctx.pacing.pool_gone(kind, ns, name)
        ctx.creates.forget((kind, ns, name))
        return None
    pool = PoolView(body)
    if pool.deleting:
        return None
    if ctx.namespaces.is_terminating(ns) and ctx.namespaces.terminating_since(ns, pool.created):
        return None  # its namespace is being deleted: nothing to refill, no status worth writing
    try:
        spec = validate(model, pool.spec)
    except CorralValidationError as exc:
        await _fail_status(ctx, pool, "InvalidSpec", str(exc))
        return None
    template, bp_hash = _template_or_none(ctx, ns, spec.template_ref.name)
    if template is None or bp_hash is None:
        await _fail_status(ctx, pool, "TemplateNotFound",
                           f"SandboxTemplate {spec.template_ref.name!r} does not exist (or is invalid) in {ns}")
        return None
    return pool, spec, template, bp_hash


def _template_or_none(ctx: Context, ns: str, name: str) -> tuple[TemplateView | None, str | None]:
    template = ctx.cache.template(ns, name)
    if template is None:
        return None, None
    try:
        return TemplateView(template), ctx.templates.spec(template)[1]
    except Exception:  # noqa: BLE001 - an invalid template is reported on the template itself
        return None, None


async def _create_member(ctx: Context, pool: PoolView, template: TemplateView, bp_hash: str) -> None:
    ns, name = pool.key
    manifest = sandbox_manifest(
        name=None, generate_name=f"{name}-", namespace=ns, template_name=template.name, blueprint=template.spec,
        labels=sandbox_labels(template.name, pool=name, pool_kind=pool.kind, bp_hash=bp_hash),
        owner=owner_ref(pool.body),
    )
    created = await ctx.kube.create(manifest)
    ctx.creates.expect((pool.kind, ns, name), created["metadata"]["name"])
    if pool.kind == "WarmPool":  # followed until Ready: the pool's ready lag (see PoolPacing.refill)
        ctx.pacing.refill_started(pool.kind, ns, name, created["metadata"]["name"], time.time())


async def reconcile_warmpool(ctx: Context, ns: str, name: str) -> None:
    ctx.cancel_at("WarmPool", ns, name)  # re-armed below if an unready sandbox still has a grace deadline
    loaded = await _load(ctx, "WarmPool", WarmPoolSpec, ns, name)
    if loaded is None:
        return
    pool, spec, template, bp_hash = loaded
    members = ctx.cache.members(ns, "WarmPool", name)
    idle = [m for m in members if not m.claim and not m.deleting and not ctx.claims.is_reserved(ns, m.name)]
    now = time.time()
    expected = ctx.creates.outstanding(("WarmPool", ns, name), {m.name for m in members})
    if ctx.pacing.following("WarmPool", ns, name):  # a refill in flight: is it Ready now (the pool's ready lag)?
        ctx.pacing.refills_seen("WarmPool", ns, name, {m.name: m.ready for m in members}, now)
    plan = plan_warm_pool(replicas=spec.replicas, idle=idle, current_hash=bp_hash,
                          strategy=spec.update_strategy.type, expected_creates=expected, now=now,
                          readiness_grace=lifecycle.readiness_grace(spec))
    error: Exception | None = None
    if plan.delete:
        log.info("warmpool %s/%s: deleting %d (%s)", ns, name, len(plan.delete), "; ".join(plan.reasons) or "surplus")
        _, error = await delete_batches(ctx, plan.delete, ctx.settings.max_batch)
    undecided = _claims_on(ctx, ns, "WarmPool", name)  # and wakes those waiting for this pool
    ready_idle = sum(1 for m in idle if m.ready and m not in plan.delete)
    if plan.create and ctx.pacing.waits_for_claims("WarmPool", ns, name, now, undecided=undecided,
                                                  ready_idle=ready_idle):
        # A burst of claims is decided (warm or cold) before the pool refills: the API server's capacity goes to the
        # claims first, and a burst of N claims against R ready sandboxes gets exactly R warm. The last decision
        # requests this pool again. (Not in an established stream while the pool has enough ready: see the pacing.)
        log.debug("warmpool %s/%s: refill of %d waits for %d undecided claims", ns, name, plan.create, undecided)
        plan.create = 0
    if plan.create:
        # Claims decided a moment ago are likely followed by more: refill in the quiet moment after them. A refill is
        # ~7 API writes per sandbox; during a stream of claims on a small control plane it delays every claim. A
        # stream that does not pause gets its refill in chunks at its own pace, and all of it at once when the ready
        # sandboxes would run under a tenth of the replicas before new ones are Ready (PoolPacing.refill).
        starting = sum(1 for m in idle if not m.ready and m not in plan.delete) + expected
        plan.create, wake = ctx.pacing.refill(
            "WarmPool", ns, name, now, deficit=plan.create, ready_idle=ready_idle, starting=starting,
            low_water=max(1, spec.replicas // 10))
        if wake is not None:
            ctx.request_at("WarmPool", ns, name, wake)
    if plan.create and error is None:
        log.info("warmpool %s/%s: creating %d", ns, name, plan.create)
        _, error = await run_batches(plan.create, lambda: _create_member(ctx, pool, template, bp_hash),
                                     ctx.settings.max_batch, f"warmpool {ns}/{name}")

    # Wake up when an unready sandbox would pass its readiness grace.
    _wake_at_grace(ctx, "WarmPool", ns, name, idle, spec)

    kept = [m for m in idle if m not in plan.delete]
    ready = sum(1 for m in kept if m.ready)
    gen = pool.generation
    ok = error is None and ready >= spec.replicas
    desired = status_patch(
        WarmPoolStatus, replicas=len(kept), ready_replicas=ready,
        updated_replicas=sum(1 for m in kept if m.blueprint_hash == bp_hash), selector=selector("WarmPool", name),
        observed_generation=gen,
        conditions=set_condition(pool.conditions, "Ready", ok,
                                 "Ready" if ok else ("CreateFailed" if error else "Scaling"),
                                 str(error) if error else f"{ready}/{spec.replicas} ready", gen))
    _gauges(ns, name, spec.replicas, ready, len(kept), len(members) - len(idle))
    await _write_status(ctx, pool, desired, now)
    _note_terminating(ctx, ns, error)
    if error is not None and status_code(error) not in (403, 422):
        raise error  # transient: retried with backoff by the queue (403/422 are reported in the status instead)


async def _write_status(ctx: Context, pool: PoolView, desired: dict[str, Any], now: float) -> None:
    """Write a pool's status if it changed. Routine changes (counts going up and down as sandboxes are claimed and
    refilled, Ready <-> Scaling with them) are coalesced (see `PoolPacing.status_wait`); an error or a new generation
    goes at once."""
    status = pool.status
    if not differs(status, desired):
        return
    kind, (ns, name) = pool.kind, pool.key
    reason = (condition(desired.get("conditions"), "Ready") or {}).get("reason")
    routine = reason in ("Ready", "Scaling") and not differs(
        status, {k: desired[k] for k in ("observedGeneration", "selector", "revision") if k in desired})
    wait = ctx.pacing.status_wait(kind, ns, name, now) if routine else None
    if wait is not None:
        ctx.request_at(kind, ns, name, wait)
        return
    await ctx.kube.patch(kind, name, ns, {"status": checked(STATUS[kind], desired)}, status=True)
    ctx.pacing.status_written(kind, ns, name, now)


def _note_terminating(ctx: Context, ns: str, error: Exception | None) -> None:
    if error is not None and status_code(error) == 403 and "being terminated" in str(error):
        ctx.namespace_terminating(ns, time.time())


WAITING_FOR_POOL = (v.R_POOL_NOT_FOUND, v.R_TEMPLATE_NOT_FOUND)


def _claims_on(ctx: Context, ns: str, kind: str, name: str) -> int:
    """Claims on this pool that have neither adopted a sandbox nor started a cold one yet; one pass over them, which
    also wakes those waiting for the pool.

    Claims that found this pool (or its template) missing wait for their timeout with nothing else to wake them: now
    that both are here, they go on. (A claim made before its pool; or a replica resuming from a peering pause, whose
    indices refill one watch stream at a time, that saw a claim before its pool.) No loop: a claim that finds both
    here decides (warm or cold) and never waits for this reason again."""
    n = 0
    for c in ctx.cache.claims_for(ns, kind, name):
        claim = ClaimView(c)
        if not claim.undecided:
            continue
        if claim.waiting_for(WAITING_FOR_POOL):
            ctx.request("SandboxClaim", ns, claim.name)
        if not ctx.claims.is_bound(ns, claim.name) and ctx.cache.claim_sandbox(ns, claim.name) is None:
            n += 1
    return n


async def reconcile_pool(ctx: Context, ns: str, name: str) -> None:
    async with ctx.pool_locks.hold(ns, name):
        await _reconcile_pool(ctx, ns, name)


async def _reconcile_pool(ctx: Context, ns: str, name: str) -> None:
    loaded = await _load(ctx, "Pool", PoolSpec, ns, name)
    if loaded is None:
        return
    pool, spec, template, bp_hash = loaded
    _claims_on(ctx, ns, "Pool", name)  # wakes those waiting for it
    members = ctx.cache.members(ns, "Pool", name)
    # Allocated sandboxes whose claim (or batch) is gone are released: recycled as the pool says.
    for m in members:
        if (m.claim and not m.deleting and ctx.cache.holder(ns, m.claim) is None
                and not ctx.claims.is_bound(ns, m.claim)):
            await recycle(ctx, m, spec.recycle_strategy)
    members = ctx.cache.members(ns, "Pool", name)
    idle = [m for m in members if not m.claim and not m.deleting and not ctx.claims.is_reserved(ns, m.name)]
    # Adopted but not yet reported by the watch (reserved) counts as allocated, or poolMax could be overshot.
    allocated = sum(1 for m in members if (m.claim or ctx.claims.is_reserved(ns, m.name)) and not m.deleting)
    terminating = sum(1 for m in members if m.deleting)
    expected = ctx.creates.outstanding(("Pool", ns, name), {m.name for m in members})
    cap = spec.capacity
    plan = plan_pool(buffer_min=cap.buffer_min, buffer_max=cap.buffer_max, pool_min=cap.pool_min,
                     pool_max=cap.pool_max, max_unavailable=spec.max_unavailable, idle=idle, allocated=allocated,
                     terminating=terminating, expected_creates=expected, current_hash=bp_hash, now=time.time(),
                     readiness_grace=lifecycle.readiness_grace(spec))
    error: Exception | None = None
    if plan.delete:
        log.info("pool %s/%s: deleting %d idle (%s)", ns, name, len(plan.delete), "; ".join(plan.reasons) or "surplus")
        _, error = await delete_batches(ctx, plan.delete, min(ctx.settings.max_batch, spec.max_unavailable))
    if plan.create:
        log.info("pool %s/%s: creating %d", ns, name, plan.create)
        _, error = await run_batches(plan.create, lambda: _create_member(ctx, pool, template, bp_hash),
                                     ctx.settings.max_batch, f"pool {ns}/{name}")
    gen = pool.generation
    kept_idle = [m for m in idle if m not in plan.delete]
    available = sum(1 for m in kept_idle if m.ready)
    desired = status_patch(
        PoolStatus, total=allocated + len(kept_idle) + terminating, allocated=allocated, available=available,
        updated=sum(1 for m in members if m.blueprint_hash == bp_hash and not m.deleting), revision=bp_hash,
        observed_generation=gen,
        conditions=set_condition(pool.conditions, "Ready", error is None,
                                 "Ready" if error is None else "CreateFailed", str(error or ""), gen))
    want = pool_desired(buffer_min=cap.buffer_min, pool_min=cap.pool_min, pool_max=cap.pool_max, allocated=allocated)
    _gauges(ns, name, want, available, len(kept_idle), allocated)
    await _write_status(ctx, pool, desired, time.time())
    # Claims waiting for capacity (PoolExhausted) try again when the pool can serve one: a ready idle sandbox, or room
    # under poolMax for a cold start. Not otherwise: a waiting claim requests its pool, and the two would re-queue
    # each other forever without any I/O, starving the event loop (the release of a sandbox brings this back here).
    room = allocated + len(kept_idle) + terminating + expected + plan.create < cap.pool_max
    if room or any(m.ready for m in kept_idle):
        for c in ctx.cache.claims_for(ns, "Pool", name):
            claim = ClaimView(c)
            if claim.phase == v.PENDING:
                ctx.request("SandboxClaim", ns, claim.name)
    _wake_at_grace(ctx, "Pool", ns, name, kept_idle, spec)
    _note_terminating(ctx, ns, error)
    if error is not None and status_code(error) not in (403, 422):
        raise error


def _wake_at_grace(ctx: Context, kind: str, ns: str, name: str, idle: list[Member], spec: Any) -> None:
    """Come back when an unready idle sandbox would pass its readiness grace (counted from when it turned unready:
    a sandbox whose execd died long after it started)."""
    unready = [lifecycle.grace_deadline(unready_from(m), lifecycle.readiness_grace(spec)) for m in idle if not m.ready]
    if unready:
        ctx.request_at(kind, ns, name, min(unready) + 0.5)


async def recycle(ctx: Context, m: Member, strategy: str) -> None:
    """Return a released Pool sandbox: Delete it, Restart its pod, or Noop (back to idle as it is)."""
    log.info("pool sandbox %s/%s released by %s: %s", m.namespace, m.name, m.claim, strategy)
    if strategy == "Delete":
        await ignore({404, 409}, ctx.kube.delete("Sandbox", m.name, m.namespace, uid=m.uid))
        return
    if strategy == "Noop":  # the same pod goes on: its execd must let go of the claim's token first
        await take_back(ctx, m.namespace, m.name, m.uid, m.claim_uid)
    patch = {"metadata": {"labels": {L_CLAIM: None}, "annotations": {A_CLAIM_UID: None},
                          "resourceVersion": m.resource_version}}
    await ignore({404, 409}, ctx.kube.patch("Sandbox", m.name, m.namespace, patch))
    if strategy == "Restart":  # a new pod: a new idle token
        ctx.tokens.take(m.namespace, m.name)
        await ignore({404}, ctx.kube.delete("Pod", m.name, m.namespace))


def _gauges(ns: str, name: str, desired: int, ready: int, idle: int, allocated: int) -> None:
    metrics.pool_sandboxes(ns, name, desired=desired, ready=ready, idle=idle, allocated=allocated)
