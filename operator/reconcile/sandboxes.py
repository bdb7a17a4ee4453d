"""Sandbox: its pod (+ PVCs, + optional Service) from the blueprint with execd injected; status mirrors the pod."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from lightkube import ApiError

from corral.execd import wire

from ..builders import pod_manifest, pvc_manifests, service_manifest
from ..cache import PodInfo, _ts
from ..constants import A_LAUNCH, L_CLAIM, L_HASH, L_POOL, L_POOL_KIND
from ..context import Context
from ..core.batches import claim_ref
from ..kube import ignore, status_code
from ..tokens import key_secret, key_secret_manifest
from .conditions import condition, differs, set_condition

log = logging.getLogger("corral.operator.sandbox")

POD_CREATE_GRACE = 30.0  # seconds we trust our own pod create before trying again
ECHO = ("claimRef", "launchType")  # status fields that only repeat the sandbox's own labels/annotations


def desired_status(body: dict[str, Any], pod: PodInfo | None, suspended: bool) -> dict[str, Any]:
    meta, spec, status = body["metadata"], body["spec"], body.get("status") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    port = int((spec.get("execd") or {}).get("port", wire.PORT))
    gen = meta.get("generation")
    ready = bool(pod and pod.ready and not pod.deleting and not suspended)
    if suspended:
        phase, reason, message = "Suspended", "Suspended", "operatingMode is Suspended: the pod is deleted, PVCs kept"
    elif pod is None:
        phase, reason, message = "Pending", "PodCreating", "the pod is being created"
    elif pod.deleting:
        phase, reason, message = "Pending", "PodTerminating", "the pod is terminating and will be recreated"
    else:
        phase = pod.phase or "Pending"
        reason = "PodReady" if ready else f"Pod{phase}"
        message = "" if ready else (pod.message or f"pod is {phase}")
    ips = [] if suspended or pod is None else list(pod.pod_ips)
    return {
        "phase": phase,
        "podIPs": ips,
        "endpoint": f"{ips[0]}:{port}" if ips and not suspended else None,
        "nodeName": pod.node if pod and not suspended else None,
        "launchType": annotations.get(A_LAUNCH),
        "blueprintHash": labels.get(L_HASH),
        "claimRef": claim_ref(labels.get(L_CLAIM)),
        "observedGeneration": gen,
        "conditions": set_condition(status.get("conditions"), "Ready", ready, reason, message, gen),
    }


async def reconcile_sandbox(ctx: Context, ns: str, name: str) -> None:
    body = ctx.cache.sandbox(ns, name)
    key = (ns, name)
    if body is None:
        ctx.pod_creates.pop(key, None)
        ctx.settling.pop(key, None)
        ctx.installed.pop(key, None)
        if ns in ctx.key_secrets and not ctx.cache.any_in("Sandbox", ns):  # the namespace may go and come back
            ctx.key_secrets.discard(ns)
        return
    meta, spec = body["metadata"], body["spec"]
    ctx.cancel_at("Sandbox", ns, name)  # each pass re-arms only the deadlines still ahead
    if meta.get("deletionTimestamp"):
        return
    now = time.time()
    shutdown = _ts(spec.get("shutdownTime"))
    if shutdown:
        if shutdown <= now:
            log.info("sandbox %s/%s reached its shutdownTime; deleting", ns, name)
            await ignore({404, 409}, ctx.kube.delete("Sandbox", name, ns, uid=meta["uid"]))
            return
        ctx.request_at("Sandbox", ns, name, shutdown)

    pod = ctx.cache.pod(ns, name)
    if pod is not None:
        ctx.pod_creates.pop(key, None)
    elif ctx.terminating_since(ns, _ts(meta.get("creationTimestamp"))):
        return  # its namespace is being deleted: no pod to repair, no status worth writing
    suspended = spec.get("operatingMode") == "Suspended"
    if suspended:
        if pod is not None and not pod.deleting:
            await ignore({404}, ctx.kube.delete("Pod", name, ns, uid=pod.uid))
    elif pod is None:
        created_at = ctx.pod_creates.get(key)
        lost = bool((body.get("status") or {}).get("nodeName"))  # it had a pod: a repair, not a first create
        async with ctx.pod_repair(ns) if lost else contextlib.nullcontext():
            if lost and ctx.terminating_since(ns, _ts(meta.get("creationTimestamp"))):
                return  # the repair ahead of this one found the namespace going
            if lost and not await _still_there(ctx, body):
                return  # the pod went with its sandbox (a scale-down, say); the sandbox's deletion event is on its way
            if created_at is None or now - created_at > POD_CREATE_GRACE:
                try:
                    await _create_pod(ctx, body)
                except ApiError as exc:
                    if status_code(exc) == 403 and "being terminated" in str(exc):
                        ctx.namespace_terminating(ns, now)
                        return  # the namespace is going away with everything in it: nothing to repair
                    raise
                ctx.pod_creates[key] = now
                ctx.request_at("Sandbox", ns, name, now + POD_CREATE_GRACE + 1)
    elif pod.phase in ("Failed", "Succeeded") and not pod.deleting:
        log.info("sandbox %s/%s: pod ended (%s); replacing it", ns, name, pod.phase)
        await ignore({404, 409}, ctx.kube.delete("Pod", name, ns, uid=pod.uid))

    desired = desired_status(body, pod, suspended)
    status = body.get("status") or {}
    if differs(status, desired):
        labels = meta.get("labels") or {}
        if labels.get(L_POOL) and not differs(status, {**desired, **{k: status.get(k) for k in ECHO}}):
            # Only the echo of an adoption (claimRef, launchType) changed: it waits for a quiet second after a
            # stream of claims on the pool (the claim already has everything it needs from the sandbox).
            wait = ctx.claims_streaming(labels.get(L_POOL_KIND, "WarmPool"), ns, labels[L_POOL], now,
                                        quiet=max(1.0, ctx.settings.claim_quiet))
            if wait is not None:
                ctx.request_at("Sandbox", ns, name, wait)
                return
        ready = lambda s: (condition(s.get("conditions"), "Ready") or {}).get("status") == "True"  # noqa: E731
        if not suspended and not ready(status) and not ready(desired) and ctx.settings.sandbox_settle:
            # A starting pod: its intermediate phases (created, scheduled, running) wait a moment, so a pod that
            # gets Ready meanwhile costs one status write, not one per phase.
            first = ctx.settling.setdefault(key, now)
            if now - first < ctx.settings.sandbox_settle:
                ctx.request_at("Sandbox", ns, name, first + ctx.settings.sandbox_settle)
                return
        ctx.settling.pop(key, None)
        await ctx.kube.patch("Sandbox", name, ns, {"status": desired}, status=True)


async def _still_there(ctx: Context, body: dict[str, Any]) -> bool:
    """A sandbox whose pod vanished: is it still there, or is the watch just late to say it was deleted? One read,
    only on this (rare) path, so a scale-down never recreates the pods it is deleting."""
    meta = body["metadata"]
    try:
        live = await ctx.kube.get("Sandbox", meta["name"], meta["namespace"])
    except ApiError as exc:
        if status_code(exc) == 404:
            return False
        raise
    return live["metadata"].get("uid") == meta.get("uid") and not live["metadata"].get("deletionTimestamp")


async def _create_pod(ctx: Context, body: dict[str, Any]) -> None:
    meta = body["metadata"]
    for pvc in pvc_manifests(body):
        await ignore({409}, ctx.kube.create(pvc))
    svc = service_manifest(body)
    if svc:
        await ignore({409}, ctx.kube.create(svc))
    ns = meta["namespace"]
    if ns not in ctx.key_secrets:  # once per namespace and process; a 409 (made before a restart) is as good
        await ignore({409}, ctx.kube.create(key_secret_manifest(ctx.token_key, ns)))
        ctx.key_secrets.add(ns)
    pod = pod_manifest(body, execd_image=ctx.settings.execd_image, key_secret=key_secret(ctx.token_key, ns))
    await ignore({409}, ctx.kube.create(pod))  # deterministic name: a duplicate create is a no-op
