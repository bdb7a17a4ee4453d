"""Sandbox: its pod (+ PVCs, + optional Service) from the blueprint with execd injected; status mirrors the pod."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, get_args

from lightkube import ApiError

from corral.api.sandbox import SandboxPhase, SandboxStatus

from ..builders import pod_manifest, pvc_manifests, service_manifest
from ..cache import PodInfo
from ..context import Context
from ..core.batches import claim_ref
from ..kube import ignore, status_code
from ..tokens import key_secret, key_secret_manifest
from ..views import SandboxView, checked, status_patch
from .conditions import condition, differs, set_condition

log = logging.getLogger("corral.operator.sandbox")

ECHO = ("claimRef", "launchType")  # status fields that only repeat the sandbox's own labels/annotations
PHASES = frozenset(get_args(SandboxPhase))
POOL_SETTLE = 5.0  # seconds an idle pool sandbox's intermediate (not Ready) status waits for its pod to get Ready


def desired_status(sandbox: SandboxView, pod: PodInfo | None, suspended: bool) -> dict[str, Any]:
    gen = sandbox.generation
    ready = bool(pod and pod.ready and not pod.deleting and not suspended)
    if suspended:
        phase, reason, message = "Suspended", "Suspended", "operatingMode is Suspended: the pod is deleted, PVCs kept"
    elif pod is None:
        phase, reason, message = "Pending", "PodCreating", "the pod is being created"
    elif pod.deleting:
        phase, reason, message = "Pending", "PodTerminating", "the pod is terminating and will be recreated"
    else:
        pod_phase = pod.phase or "Pending"
        reason = "PodReady" if ready else f"Pod{pod_phase}"
        message = "" if ready else (pod.message or f"pod is {pod_phase}")
        phase = pod_phase if pod_phase in PHASES else "Pending"  # a pod's Unknown (its node is not answering)
    ips = [] if suspended or pod is None else list(pod.pod_ips)
    return status_patch(
        SandboxStatus, phase=phase, pod_ips=ips,
        endpoint=f"{ips[0]}:{sandbox.execd_port}" if ips and not suspended else None,
        node_name=pod.node if pod and not suspended else None, launch_type=sandbox.launch_type,
        blueprint_hash=sandbox.blueprint_hash, claim_ref=claim_ref(sandbox.claim_label), observed_generation=gen,
        conditions=set_condition(sandbox.conditions, "Ready", ready, reason, message, gen))


async def reconcile_sandbox(ctx: Context, ns: str, name: str) -> None:
    body = ctx.cache.sandbox(ns, name)
    key = (ns, name)
    if body is None:
        ctx.starts.sandbox_gone(key)
        ctx.claims.sandbox_gone(ns, name)
        ctx.tokens.sandbox_gone(ns, name, last_in_namespace=ctx.tokens.has_key_secret(ns)
                                and not ctx.cache.any_in("Sandbox", ns))  # the namespace may go and come back
        return
    sandbox = SandboxView(body)
    ctx.cancel_at("Sandbox", ns, name)  # each pass re-arms only the deadlines still ahead
    if sandbox.deleting:
        return
    now = time.time()
    shutdown = sandbox.shutdown_at
    if shutdown:
        if shutdown <= now:
            log.info("sandbox %s/%s reached its shutdownTime; deleting", ns, name)
            await ignore({404, 409}, ctx.kube.delete("Sandbox", name, ns, uid=sandbox.uid))
            return
        ctx.request_at("Sandbox", ns, name, shutdown)

    pod = ctx.cache.pod(ns, name)
    if pod is not None:
        ctx.starts.pod_seen(key)
    elif ctx.namespaces.terminating_since(ns, sandbox.created):
        return  # its namespace is being deleted: no pod to repair, no status worth writing
    suspended = sandbox.suspended
    if suspended:
        if pod is not None and not pod.deleting:
            await ignore({404}, ctx.kube.delete("Pod", name, ns, uid=pod.uid))
    elif pod is None:
        lost = sandbox.had_pod  # a repair, not a first create
        async with ctx.namespaces.pod_repair(ns) if lost else contextlib.nullcontext():
            if lost and ctx.namespaces.terminating_since(ns, sandbox.created):
                return  # the repair ahead of this one found the namespace going
            if lost and not await _still_there(ctx, sandbox):
                return  # the pod went with its sandbox (a scale-down, say); the sandbox's deletion event is on its way
            if ctx.starts.pod_create_due(key, now):
                try:
                    await _create_pod(ctx, sandbox)
                except ApiError as exc:
                    if status_code(exc) == 403 and "being terminated" in str(exc):
                        ctx.namespace_terminating(ns, now)
                        return  # the namespace is going away with everything in it: nothing to repair
                    raise
                ctx.request_at("Sandbox", ns, name, ctx.starts.pod_created(key, now))
    elif pod.phase in ("Failed", "Succeeded") and not pod.deleting:
        log.info("sandbox %s/%s: pod ended (%s); replacing it", ns, name, pod.phase)
        await ignore({404, 409}, ctx.kube.delete("Pod", name, ns, uid=pod.uid))

    desired = desired_status(sandbox, pod, suspended)
    status = sandbox.status
    if differs(status, desired):
        if sandbox.pool and not differs(status, {**desired, **{k: status.get(k) for k in ECHO}}):
            # Only the echo of an adoption (claimRef, launchType) changed: it waits for a quiet second after a
            # stream of claims on the pool (the claim already has everything it needs from the sandbox).
            wait = ctx.pacing.claims_streaming(sandbox.pool_kind, ns, sandbox.pool, now,
                                               quiet=max(1.0, ctx.settings.claim_quiet))
            if wait is not None:
                ctx.request_at("Sandbox", ns, name, wait)
                return
        ready = lambda s: (condition(s.get("conditions"), "Ready") or {}).get("status") == "True"  # noqa: E731
        if not suspended and not ready(status) and not ready(desired):
            # A starting pod: its intermediate phases (created, scheduled, running) wait a moment, so a pod that
            # gets Ready meanwhile costs one status write, not one per phase. An idle pool sandbox's wait longer
            # (POOL_SETTLE): nobody waits for it, and on a loaded control plane a refill's pod takes more than the
            # moment to get Ready, which cost every refilled sandbox two or three status writes, not one.
            settle = ctx.starts.settle
            if settle and sandbox.pool and not sandbox.claim_label:  # an idle pool sandbox
                settle = max(settle, POOL_SETTLE)
            until = ctx.starts.settle_until(key, now, settle)
            if until is not None:
                ctx.request_at("Sandbox", ns, name, until)
                return
        ctx.starts.settled(key)
        await ctx.kube.patch("Sandbox", name, ns, {"status": checked(SandboxStatus, desired)}, status=True)


async def _still_there(ctx: Context, sandbox: SandboxView) -> bool:
    """A sandbox whose pod vanished: is it still there, or is the watch just late to say it was deleted? One read,
    only on this (rare) path, so a scale-down never recreates the pods it is deleting."""
    try:
        live = SandboxView(await ctx.kube.get("Sandbox", sandbox.name, sandbox.namespace))
    except ApiError as exc:
        if status_code(exc) == 404:
            return False
        raise
    return live.uid == sandbox.uid and not live.deleting


async def _create_pod(ctx: Context, sandbox: SandboxView) -> None:
    body = sandbox.body
    for pvc in pvc_manifests(body):
        await ignore({409}, ctx.kube.create(pvc))
    svc = service_manifest(body)
    if svc:
        await ignore({409}, ctx.kube.create(svc))
    ns = sandbox.namespace
    if ctx.tokens.key_secret_needed(ns):  # once per namespace and process; a 409 (made before a restart) is as good
        await ignore({409}, ctx.kube.create(key_secret_manifest(ctx.token_key, ns)))
        ctx.tokens.key_secret_made(ns)
    pod = pod_manifest(body, execd_image=ctx.settings.execd_image, key_secret=key_secret(ctx.token_key, ns))
    await ignore({409}, ctx.kube.create(pod))  # deterministic name: a duplicate create is a no-op
