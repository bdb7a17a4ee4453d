"""The kopf entry points: indices fed by the watch streams, and event handlers that only request reconciles.

No handler here writes to the API: they update the cache (kopf indices) and enqueue keys; the reconcilers in
corral.operator.reconcile do the work, one key at a time, with bounded concurrency. kopf stores no state on the
objects (on.event handlers need no finalizers or progress annotations). The hot kinds (SandboxClaims, Sandboxes,
Pods of Corral's sandboxes) are not kopf's: corral.operator.informer follows them, started and stopped here.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import kopf
from lightkube import ApiError

from . import metrics
from .cache import KOPF_INDICES, Cache, EventsOnlyDiffBase
from .claimsapi import kube_server as claims_api
from .constants import GROUP, VERSION
from .context import Context, Settings
from .informer import WATCH_GRACE, Informers
from .kube import Kube, status_code
from .leadership import own_pod, pod_label_patch
from .reconcile.batches import reconcile_batch
from .reconcile.claims import reconcile_claim
from .reconcile.pools import reconcile_pool, reconcile_warmpool
from .reconcile.sandboxes import reconcile_sandbox
from .reconcile.templates import reconcile_template
from .resync import kopf_indices_complete, resync
from .shards import ShardSettings, keep_sweeping, start_shards
from .workqueue import WorkQueue

log = logging.getLogger("corral.operator")

STATE: dict[str, Context] = {}
STATE_TASKS: dict[str, asyncio.Task[None]] = {}
INFORMERS: dict[str, Informers] = {}
KOPF_INDEX_OBJECTS: dict[str, Any] = {}  # kopf's index objects, as kopf passes them to the startup handler

RECONCILERS = {
    "SandboxTemplate": reconcile_template,
    "Sandbox": reconcile_sandbox,
    "WarmPool": reconcile_warmpool,
    "Pool": reconcile_pool,
    "SandboxClaim": reconcile_claim,
    "SandboxBatch": reconcile_batch,
}


PRIORITY = {"SandboxClaim": 0, "SandboxBatch": 0, "Sandbox": 1, "WarmPool": 2, "Pool": 2, "SandboxTemplate": 3}


def ctx() -> Context:
    return STATE["ctx"]


async def dispatch(key: tuple[str, str, str]) -> None:
    kind, ns, name = key
    context = ctx()
    if not context.cache.ready:  # the informers' initial listings and kopf's indices first: no partial picture
        await context.cache.wait_ready()
    if not context.owns(kind, ns, name):  # sharded: its shard is another replica's (or went while the key waited)
        return
    try:
        await RECONCILERS[kind](context, ns, name)
        metrics.RECONCILES.labels(kind=kind, result="ok").inc()
    except ApiError as exc:
        if status_code(exc) == 404:  # the object went away meanwhile; its deletion event brings us back if needed
            metrics.RECONCILES.labels(kind=kind, result="gone").inc()
            return
        metrics.RECONCILES.labels(kind=kind, result="error").inc()
        raise
    except Exception:
        metrics.RECONCILES.labels(kind=kind, result="error").inc()
        raise


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **kwargs: Any) -> None:
    config = Settings.from_env()
    settings.persistence.finalizer = f"{GROUP}/kopf-finalizer"
    settings.peering.lifetime = config.peering_lifetime
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = EventsOnlyDiffBase(prefix=GROUP)  # no change handlers: no diffs
    settings.posting.level = logging.WARNING  # no Kubernetes Events for routine logs (they would be API writes)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # no "handler succeeded" line per watch event
    for noisy in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)  # no line per API request
    # Watch streams end at the API server after server_timeout, and client-side WATCH_GRACE later at most (a dead
    # connection). Not at kopf's inactivity timeout (70 s without an event): on a kind where nothing changes this API
    # server sends no bookmark either, so every idle kind's watch was re-opened every 70 s - requests for nothing,
    # while a batch's tasks run (the operator makes none then: tests/kube/test_operator_batches_at_scale.py).
    settings.watching.server_timeout = 600
    settings.watching.client_timeout = 600 + WATCH_GRACE
    settings.watching.inactivity_timeout = 600 + WATCH_GRACE  # never before the server timeout
    # No cap on kopf's per-object workers (our reconciles are bounded by the WorkQueue): with a cap, an operator
    # starting with more objects of one kind than the cap deadlocked (the first workers wait for every index to be
    # filled, the rest of the initial listing waits for a free worker).
    settings.queueing.worker_limit = None
    context = Context(settings=config, kube=Kube.from_env(config.kubeconfig), cache=Cache())
    context.queue = WorkQueue(dispatch, workers=config.workers, priority=lambda key: PRIORITY.get(key[0], 9))
    context.queue.start()
    STATE["ctx"] = context
    for name in KOPF_INDICES:  # kopf's (still empty) index objects, served until kopf says they are complete
        context.cache.attach(name, kwargs[name])
        KOPF_INDEX_OBJECTS[name] = kwargs[name]
    INFORMERS["hot"] = informers = Informers(context)
    informers.start()
    if config.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(config.metrics_port)
    if not config.token_secret:
        log.warning("CORRAL_TOKEN_SECRET is not set: execd tokens change when the operator restarts")
    log.info("corral operator started (workers=%d, execd image %s)", config.workers, config.execd_image)
    if shard_settings := ShardSettings.from_env(api_port=claims_api.ApiSettings.from_env().port):
        start_shards(context, shard_settings, os.environ.get("POD_ID", ""))  # standalone kopf, sharded reconciles
    else:
        await _follow_peering(context, settings)
    if context.leadership.active:  # else at the first takeover (_hold_or_resync)
        _check_kopf_indices(context)
    await claims_api.start(context)  # the claims HTTP API, if CORRAL_API_TOKEN(_FILE) is set


def _check_kopf_indices(context: Context) -> None:
    """Let the Cache know when kopf's indices are complete even if kopf never calls a handler (resync.py)."""
    running = STATE_TASKS.get("kopf")
    if context.cache.kopf_at is None and (running is None or running.done()):
        STATE_TASKS["kopf"] = asyncio.create_task(kopf_indices_complete(context, dict(KOPF_INDEX_OBJECTS)),
                                                  name="corral-kopf-ready")


async def _follow_peering(context: Context, settings: kopf.OperatorSettings) -> None:
    """Track whether this replica is the active one (see corral.operator.leadership) and mark its pod accordingly."""
    peering = settings.peering
    context.leadership.on_change(lambda active: _hold_or_resync(context, active))
    context.leadership.on_change(lambda _active: _mark_pod(context))
    context.leadership.on_change(lambda active: _sweep_shard_leases(context) if active else None)
    if peering.mandatory and not peering.standalone:
        if peering.clusterwide:
            context.leadership.start(context.kube.client, name=peering.name, me=os.environ.get("POD_ID", ""),
                                     priority=peering.priority)
        else:
            log.warning("namespaced kopf peering: the claims API does not follow it (run cluster-wide, the default)")
    await _mark_pod(context)
    if context.leadership.active:
        _sweep_shard_leases(context)


def _sweep_shard_leases(context: Context) -> None:
    """Sharding off: the active replica deletes the shard and member leases a sharded configuration left (once
    each is free or stale, corral.operator.shards.leftovers)."""
    if (task := STATE_TASKS.get("lease-sweep")) is not None and not task.done():
        return
    namespace, group = ShardSettings.home()
    STATE_TASKS["lease-sweep"] = asyncio.create_task(
        keep_sweeping(context.kube, namespace, group, 0, lambda: context.leadership.active), name="corral-lease-sweep")


def _hold_or_resync(context: Context, active: bool) -> None:
    """Standby: run nothing (kopf stops the events, this stops what was already queued or timed). Active again: check
    the indices kept from before the pause against the server first (corral.operator.resync). A replica that was
    never active has no such indices: kopf fills them before any handler runs."""
    assert context.queue is not None
    task: asyncio.Task[None] | None = STATE_TASKS.pop("resync", None)
    if task is not None:
        task.cancel()
    if not active:
        context.queue.hold()
    elif context.cache.ready:
        context.queue.hold()
        STATE_TASKS["resync"] = asyncio.create_task(resync(context), name="corral-resync")
    else:
        context.queue.release()
        _check_kopf_indices(context)


_MARKING = asyncio.Lock()


async def _mark_pod(context: Context) -> None:
    """Label (or unlabel) this replica's pod as the one the claims API Service routes to, as it is now: one patch at
    a time, each writing the state current when it starts, so the last one written is the last state."""
    if (pod := own_pod()) is None:
        return
    async with _MARKING:
        active = context.leadership.active
        try:
            await context.kube.patch("Pod", pod[1], pod[0], pod_label_patch(active))
        except Exception as exc:  # noqa: BLE001 - the Service then misses or keeps this replica until the next change
            log.warning("could not mark pod %s/%s as %s: %s", pod[0], pod[1], "active" if active else "standby", exc)


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if (running := STATE.get("ctx")) is not None and running.shards is not None:
        # Sharded: release the shards first, so the other replicas take them at once. The claims API then stops
        # (uvicorn lets requests in flight finish for a few seconds): a claim one of them waits for is bound by the
        # new holder meanwhile, and this replica's watches still see it. Released after the API instead, a
        # replica given a short grace (a force-deleted pod gets 2 s) was killed first: its shards waited the lease.
        await running.shards.stop()
    await claims_api.stop()
    for name in ("resync", "kopf", "lease-sweep"):
        if (task := STATE_TASKS.pop(name, None)) is not None:
            task.cancel()
    if (informers := INFORMERS.pop("hot", None)) is not None:
        await informers.stop()
    context = STATE.pop("ctx", None)
    if context is not None:
        context.batches.close()
        await context.leadership.stop()
        if context.leadership.active:
            context.leadership.active = False
            await _mark_pod(context)  # leave the claims API Service at once, not when the pod is gone
        if context.queue:
            await context.queue.stop()
        await context.kube.close()
        if context._http is not None:
            await context._http.aclose()


def _ns(namespace: str | None) -> str:
    """kopf types `namespace` for every resource; all the kinds watched here are namespaced, so it is always set."""
    assert namespace is not None, "a namespaced resource without a namespace"
    return namespace


def _body(body: Any) -> dict[str, Any]:
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"), "metadata": dict(body["metadata"]),
            "spec": dict(body.get("spec") or {}), "status": dict(body.get("status") or {})}


# ---- indices (filled before any handler runs) ----------------------------------------------------------------
# async: kopf runs a sync handler in its thread pool, a thread hop per index per event (measured ~10% of the
# operator's CPU in a claim burst); these are pure dict work.

@kopf.index(GROUP, VERSION, "sandboxtemplates")
async def templates_idx(namespace: str | None, name: str, body: Any, **_: Any) -> dict[Any, Any]:
    return {(_ns(namespace), name): _body(body)}


@kopf.index(GROUP, VERSION, "warmpools")
async def warmpools_idx(namespace: str | None, name: str, body: Any, **_: Any) -> dict[Any, Any]:
    return {(_ns(namespace), name): _body(body)}


@kopf.index(GROUP, VERSION, "pools")
async def pools_idx(namespace: str | None, name: str, body: Any, **_: Any) -> dict[Any, Any]:
    return {(_ns(namespace), name): _body(body)}


@kopf.index(GROUP, VERSION, "sandboxbatches")
async def batches_idx(namespace: str | None, name: str, body: Any, **_: Any) -> dict[Any, Any]:
    return {(_ns(namespace), name): _body(body)}


# ---- events -> reconcile requests ------------------------------------------------------------------------------

def _bind(kwargs: dict[str, Any]) -> Context:
    context = ctx()
    context.cache.bind(kwargs)
    return context


@kopf.on.event(GROUP, VERSION, "sandboxtemplates")
async def on_template(namespace: str | None, name: str, **kwargs: Any) -> None:
    metrics.EVENTS.labels(kind="SandboxTemplate").inc()
    _bind(kwargs).request("SandboxTemplate", _ns(namespace), name)


@kopf.on.event(GROUP, VERSION, "warmpools")
async def on_warmpool(namespace: str | None, name: str, **kwargs: Any) -> None:
    metrics.EVENTS.labels(kind="WarmPool").inc()
    context = _bind(kwargs)
    context.request("WarmPool", _ns(namespace), name)
    _wake_batches(context, "WarmPool", _ns(namespace), name)


@kopf.on.event(GROUP, VERSION, "pools")
async def on_pool(namespace: str | None, name: str, **kwargs: Any) -> None:
    metrics.EVENTS.labels(kind="Pool").inc()
    context = _bind(kwargs)
    context.request("Pool", _ns(namespace), name)
    _wake_batches(context, "Pool", _ns(namespace), name)


def _wake_batches(context: Context, kind: str, namespace: str, name: str) -> None:
    """Batches that waited for this pool (to appear, or to have room) look again."""
    for batch in context.batches.waiting_on(kind, namespace, name):
        context.request("SandboxBatch", namespace, batch)


@kopf.on.event(GROUP, VERSION, "sandboxbatches")
async def on_batch(event: kopf.RawEvent, namespace: str | None, name: str, body: Any, **kwargs: Any) -> None:
    namespace = _ns(namespace)
    metrics.EVENTS.labels(kind="SandboxBatch").inc()
    context = _bind(kwargs)
    context.request("SandboxBatch", namespace, name)
    claims_api.batch_event(namespace, name)  # wake API streams following this batch
    if event.get("type") == "DELETED":
        ref = (body.get("spec") or {}).get("poolRef") or {}
        if ref.get("kind") == "Pool":  # its sandboxes go back to the pool
            context.request("Pool", namespace, ref.get("name", ""))


# SandboxClaims, Sandboxes, Pods: corral.operator.informer (react_claim, react_sandbox, react_pod)


@kopf.on.probe(id="queue")
def queue_probe(**_: Any) -> dict[str, Any]:
    context = STATE.get("ctx")
    return {"cache_ready": bool(context and context.cache.ready),
            "timers": context.queue.pending_timers if context and context.queue else 0}

