"""SandboxClaim: warm adoption from the cache (one conditional write), cold start otherwise, and the lifecycle.

A warm claim costs two API writes: the adoption patch of the sandbox (conditional on its resourceVersion, so two
claims can never take the same one; a 409 moves on to the next candidate) and the claim's status. Env goes to the
warm sandbox through execd, not through a new pod. Every user error ends in a Failed condition saying why.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import httpx

from corral.api import CorralValidationError, SandboxClaimSpec, SandboxTemplateSpec, validate
from corral.execd import wire

from ..builders import owner_ref, retain_patch, sandbox_labels, sandbox_manifest
from ..cache import _ts
from ..constants import A_CLAIM_UID, A_LAUNCH, L_CLAIM
from ..context import Context
from ..core import lifecycle, metrics
from ..core import vocabulary as v
from ..core.admission import Refusal, admit_claim, template_env_names
from ..kube import ignore, status_code
from ..planning import Member, adoption_candidates
from .conditions import now_iso, set_condition
from .handover import ExecdUnreachable, hand_over, take_back

log = logging.getLogger("corral.operator.claim")


class ClaimError(Exception):
    """A claim that can never succeed as written (a permanent, user-facing failure)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def admission(spec: SandboxClaimSpec, template: SandboxTemplateSpec) -> Refusal | None:
    """The core's claim admission (env and volume policies) for a SandboxClaim and its template."""
    return admit_claim(env=[e.name for e in spec.env], template_env=template_env_names(template.pod_template.spec),
                       env_policy=template.env_vars_injection_policy, volumes=len(spec.volume_claim_templates),
                       volume_policy=template.volume_claim_templates_policy)


async def _status(ctx: Context, body: dict[str, Any], patch: dict[str, Any]) -> None:
    meta = body["metadata"]
    await ctx.kube.patch("SandboxClaim", meta["name"], meta["namespace"], {"status": patch}, status=True)
    if patch.get("phase") in (v.BOUND, *v.FINAL_RESOURCE_PHASES):
        ctx.phase_written[(meta["namespace"], meta["name"])] = patch["phase"]


async def finish(ctx: Context, body: dict[str, Any], phase: str, reason: str, message: str) -> None:
    meta, status = body["metadata"], body.get("status") or {}
    gen = meta.get("generation")
    conditions = set_condition(status.get("conditions"), v.BOUND, False, reason, message, gen)
    if phase == v.FAILED:
        conditions = set_condition(conditions, v.FAILED, True, reason, message, gen)
    metrics.claim_ended((body["spec"].get("poolRef") or {}).get("name", ""), status.get("launchType"), reason)
    await _status(ctx, body, {"phase": phase, "finishedTime": now_iso(), "observedGeneration": gen,
                              "conditions": conditions})
    log.info("claim %s/%s %s: %s (%s)", meta["namespace"], meta["name"], phase, reason, message)


async def reconcile_claim(ctx: Context, ns: str, name: str) -> None:
    key = (ns, name)
    body = ctx.cache.claim(ns, name)
    if body is None:
        ctx.bound.pop(key, None)
        ctx.first_seen.pop(key, None)
        ctx.phase_written.pop(key, None)
        return
    meta, status = body["metadata"], body.get("status") or {}
    ctx.cancel_at("SandboxClaim", ns, name)  # each pass re-arms only the deadlines still ahead
    if meta.get("deletionTimestamp"):
        return
    phase = status.get("phase")
    written = ctx.phase_written.get(key)
    if written is not None:
        if written != phase:
            return  # our own status write is on its way through the watch; acting now would write it twice
        del ctx.phase_written[key]
    now = time.time()
    try:
        spec = validate(SandboxClaimSpec, body["spec"])
    except CorralValidationError as exc:
        if phase not in v.FINAL_RESOURCE_PHASES:
            await finish(ctx, body, v.FAILED, v.R_INVALID_SPEC, str(exc))
        return

    if phase in v.FINAL_RESOURCE_PHASES:
        await _after_finish(ctx, body, spec, now)
        return
    sandbox = ctx.cache.claim_sandbox(ns, name)
    if sandbox is not None:
        ctx.bound.pop(key, None)
    if phase == v.BOUND:
        await _bound(ctx, body, spec, sandbox, now)
        return
    try:
        await _pending(ctx, body, spec, sandbox, now)
    except ClaimError as exc:
        await _release_for_failure(ctx, ns, name)
        await finish(ctx, body, v.FAILED, exc.reason, str(exc))


async def _pending(ctx: Context, body: dict[str, Any], spec: SandboxClaimSpec, sandbox: Member | None,
                   now: float) -> None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    key = (ns, name)
    first = ctx.first_seen.setdefault(key, now)
    deadline = lifecycle.claim_deadline(_ts(meta.get("creationTimestamp")), spec.timeout_seconds)
    kind, pool_name = spec.pool_ref.kind, spec.pool_ref.name

    ctx.claim_decided(kind, ns, pool_name)  # the pool's refill waits for the quiet moment after a claim stream
    pool = ctx.cache.pool_of_kind(ns, kind, pool_name)
    template = ctx.cache.template(ns, pool["spec"]["templateRef"]["name"]) if pool else None
    if pool is None or template is None:
        what = f"{kind} {pool_name!r}" if pool is None else f"SandboxTemplate {pool['spec']['templateRef']['name']!r}"
        if now >= deadline:
            raise ClaimError(v.R_TIMEOUT, f"{what} does not exist in {ns} (waited {spec.timeout_seconds}s)")
        await _waiting(ctx, body, v.R_POOL_NOT_FOUND if pool is None else v.R_TEMPLATE_NOT_FOUND,
                       f"{what} does not exist in {ns}; waiting up to timeoutSeconds")
        ctx.request_at("SandboxClaim", ns, name, deadline)
        return
    try:
        tspec, bp_hash = ctx.template_spec(template)
    except CorralValidationError as exc:
        raise ClaimError(v.R_INVALID_TEMPLATE, str(exc)) from None
    env = [e.to_k8s() for e in spec.env]
    if refusal := admission(spec, tspec):
        raise ClaimError(refusal.reason, refusal.message)

    bound_name = ctx.bound.get(key)
    if sandbox is None and bound_name:
        sb = ctx.cache.sandbox(ns, bound_name)
        sandbox = None if sb is None else _member(sb)
    if sandbox is not None or bound_name:
        if sandbox is not None and sandbox.ready:
            if env and sandbox.launch_type == v.WARM:
                await _inject_env(ctx, body, sandbox, env)  # idempotent: covers a restart between adoption and binding
            await _bind(ctx, body, sandbox, sandbox.launch_type or v.COLD, pool_name, first)
        elif now >= deadline:
            raise ClaimError(v.R_TIMEOUT, f"sandbox {sandbox.name if sandbox else bound_name} was not ready "
                                        f"within {spec.timeout_seconds}s")
        else:
            ctx.request_at("SandboxClaim", ns, name, deadline)
        return
    if now >= deadline:
        raise ClaimError(v.R_TIMEOUT, f"no sandbox within {spec.timeout_seconds}s")

    if not spec.volume_claim_templates:
        adopted = await _adopt(ctx, body, kind, pool_name, bp_hash)
        if adopted is not None:
            if env:
                await _inject_env(ctx, body, adopted, env)
            if spec.additional_pod_metadata.labels or spec.additional_pod_metadata.annotations:
                md = spec.additional_pod_metadata
                await ignore({404}, ctx.kube.patch("Pod", adopted.name, ns, {"metadata": {
                    "labels": md.labels, "annotations": md.annotations}}))
            await _bind(ctx, body, adopted, v.WARM, pool_name, first)
            return
    await _cold(ctx, body, spec, kind, pool, template, tspec, bp_hash, env)
    ctx.request(kind, ns, pool_name)  # the pool may have been waiting for this decision to refill
    ctx.request_at("SandboxClaim", ns, name, deadline)


def _member(sandbox_body: dict[str, Any]) -> Member:
    from ..cache import member_of

    return member_of(sandbox_body)


async def _waiting(ctx: Context, body: dict[str, Any], reason: str, message: str) -> None:
    status = body.get("status") or {}
    gen = body["metadata"].get("generation")
    conditions = set_condition(status.get("conditions"), v.BOUND, False, reason, message, gen)
    same_reason = [c for c in status.get("conditions") or [] if c.get("reason") == reason]
    if status.get("phase") != v.PENDING or same_reason == []:
        await _status(ctx, body, {"phase": v.PENDING, "observedGeneration": gen, "conditions": conditions})


async def _adopt(ctx: Context, body: dict[str, Any], kind: str, pool: str, bp_hash: str) -> Member | None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    reserved = {n for (rns, n) in ctx.reserved if rns == ns}
    for m in adoption_candidates(ctx.cache.members(ns, kind, pool), bp_hash, reserved):
        ctx.reserved[(ns, m.name)] = (ns, name)
        patch: dict[str, Any] = {"metadata": {
            "resourceVersion": m.resource_version,
            "labels": {L_CLAIM: name},
            "annotations": {A_LAUNCH: v.WARM, A_CLAIM_UID: meta["uid"]},  # its execd token derives from it
        }}
        if kind == "WarmPool":  # the claim owns it from now on: deleting the claim deletes the sandbox
            patch["metadata"]["ownerReferences"] = [owner_ref(body)]
        try:
            await ctx.kube.patch("Sandbox", m.name, ns, patch)
        except Exception as exc:  # noqa: BLE001
            ctx.reserved.pop((ns, m.name), None)
            if status_code(exc) in (404, 409, 422):
                continue  # taken or gone since the cache saw it: next candidate
            raise
        ctx.bound[(ns, name)] = m.name
        if kind == "WarmPool":
            ctx.request(kind, ns, pool)  # replenish now, without waiting for the watch event
        return m
    return None


async def _inject_env(ctx: Context, body: dict[str, Any], m: Member, env: list[dict[str, str]]) -> None:
    """The claim's env into its warm sandbox's execd, which takes the claim's token first (handover.py)."""
    pod = ctx.cache.pod(m.namespace, m.name)
    if not m.endpoint or pod is None:
        raise ClaimError(v.R_ENV_INJECTION_FAILED, f"sandbox {m.name} has no execd endpoint")
    try:
        token = await hand_over(ctx, m.namespace, m.name, m.uid, pod.uid, f"http://{m.endpoint}",
                                body["metadata"]["uid"])
        resp = await ctx.http().put(f"http://{m.endpoint}{wire.ENV_PATH}",
                                    json={"env": {e["name"]: e.get("value", "") for e in env}, "merge": True},
                                    headers={"Authorization": f"Bearer {token}"}, timeout=5)
        resp.raise_for_status()
    except (httpx.HTTPError, ExecdUnreachable) as exc:
        raise ClaimError(v.R_ENV_INJECTION_FAILED,
                         f"could not set env in sandbox {m.name} through execd: {exc}") from None


async def _bind(ctx: Context, body: dict[str, Any], m: Member, launch: str, pool: str, first_seen: float) -> None:
    meta = body["metadata"]
    gen = meta.get("generation")
    status = body.get("status") or {}
    await _status(ctx, body, {
        "phase": v.BOUND,
        "sandbox": {"name": m.name, "podIPs": list(m.pod_ips), "endpoint": m.endpoint},
        "launchType": launch,
        "boundTime": now_iso(),
        "observedGeneration": gen,
        "conditions": set_condition(status.get("conditions"), v.BOUND, True, v.R_BOUND,
                                    f"bound to sandbox {m.name} ({launch.lower()} start)", gen),
    })
    metrics.claim_bound(pool, launch, time.time() - first_seen)
    ctx.first_seen.pop((meta["namespace"], meta["name"]), None)


async def _cold(ctx: Context, body: dict[str, Any], spec: SandboxClaimSpec, kind: str, pool: dict[str, Any],
                template: dict[str, Any], tspec: SandboxTemplateSpec, bp_hash: str, env: list[dict[str, str]]) -> None:
    if kind == "Pool":
        async with ctx.pool_lock(body["metadata"]["namespace"], pool["metadata"]["name"]):
            await _cold_in_pool(ctx, body, spec, pool, template, tspec, bp_hash, env)
        return
    await _cold_create(ctx, body, spec, kind, pool, template, tspec, bp_hash, env)


async def _cold_in_pool(ctx: Context, body: dict[str, Any], spec: SandboxClaimSpec, pool: dict[str, Any],
                        template: dict[str, Any], tspec: SandboxTemplateSpec, bp_hash: str,
                        env: list[dict[str, str]]) -> None:
    """A cold start inside a Pool counts against poolMax, including creates not yet seen in the cache."""
    ns, pool_name = pool["metadata"]["namespace"], pool["metadata"]["name"]
    members = ctx.cache.members(ns, "Pool", pool_name)
    in_flight = ctx.creates.outstanding(("Pool", ns, pool_name), {m.name for m in members})
    pool_max = int((pool["spec"].get("capacity") or {}).get("poolMax", 10))
    if len(members) + in_flight >= pool_max:
        await _waiting(ctx, body, v.R_POOL_EXHAUSTED, f"Pool {pool_name} is at poolMax ({pool_max}); waiting")
        return
    created = await _cold_create(ctx, body, spec, "Pool", pool, template, tspec, bp_hash, env)
    ctx.creates.expect(("Pool", ns, pool_name), created)


async def _cold_create(ctx: Context, body: dict[str, Any], spec: SandboxClaimSpec, kind: str, pool: dict[str, Any],
                       template: dict[str, Any], tspec: SandboxTemplateSpec, bp_hash: str,
                       env: list[dict[str, str]]) -> str:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    blueprint = copy.deepcopy(template["spec"])
    pod_template = blueprint["podTemplate"]
    main = pod_template["spec"]["containers"][0]
    if env:
        names = {e["name"] for e in env}
        main["env"] = [e for e in main.get("env") or [] if e.get("name") not in names] + env
    md = spec.additional_pod_metadata
    pt_meta = pod_template.setdefault("metadata", {})
    pt_meta["labels"] = {**pt_meta.get("labels", {}), **md.labels}
    pt_meta["annotations"] = {**pt_meta.get("annotations", {}), **md.annotations}
    if spec.volume_claim_templates:
        extra = [v.to_k8s() for v in spec.volume_claim_templates]
        if tspec.volume_claim_templates_policy == "Overrides":
            blueprint["volumeClaimTemplates"] = extra
        else:
            blueprint["volumeClaimTemplates"] = list(blueprint.get("volumeClaimTemplates") or []) + extra
    tname = template["metadata"]["name"]
    if kind == "Pool":
        labels = sandbox_labels(tname, pool=pool["metadata"]["name"], pool_kind="Pool", claim=name, bp_hash=bp_hash)
        owner = owner_ref(pool)
    else:
        labels = sandbox_labels(tname, claim=name, bp_hash=bp_hash)
        owner = owner_ref(body)
    sandbox_name = f"{name}-{meta['uid'][:5]}"
    manifest = sandbox_manifest(name=sandbox_name, namespace=ns, template_name=tname, blueprint=blueprint,
                                labels=labels, owner=owner, annotations={A_LAUNCH: v.COLD, A_CLAIM_UID: meta["uid"]})
    await ignore({409}, ctx.kube.create(manifest))
    ctx.bound[(ns, name)] = sandbox_name
    return sandbox_name


async def _still_there(ctx: Context, ns: str, sandbox: str, claim: str) -> bool:
    """Whether the claim's sandbox exists (not being deleted, still bound to it), asked of the API server: one read,
    only on the rare path where the index has no such sandbox, before a claim is failed for good."""
    try:
        obj = await ctx.kube.get("Sandbox", sandbox, ns)
    except Exception as exc:  # noqa: BLE001 - 404 is the answer; anything else: don't fail the claim on a hunch
        return status_code(exc) != 404
    meta = obj.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (meta.get("labels") or {}).get(L_CLAIM) == claim


async def _bound(ctx: Context, body: dict[str, Any], spec: SandboxClaimSpec, sandbox: Member | None,
                 now: float) -> None:
    meta, status = body["metadata"], body.get("status") or {}
    ns, name = meta["namespace"], meta["name"]
    shutdown = spec.lifecycle.shutdown_time.timestamp() if spec.lifecycle.shutdown_time else 0.0
    policy = spec.lifecycle.shutdown_policy
    if sandbox is None:
        expected = (status.get("sandbox") or {}).get("name")
        if (ns, name) in ctx.bound:
            return  # our own adoption, not reported by the watch yet
        if lifecycle.due(shutdown or None, now):
            await finish(ctx, body, v.FINISHED, v.R_SHUTDOWN_TIME, f"shut down at shutdownTime ({policy})")
            return
        if expected and await _still_there(ctx, ns, expected, name):
            # The index is behind the cluster: kopf re-lists one watch stream at a time (after a 410 Gone, say), so
            # claims can be current while sandboxes are not. (A takeover is covered by corral.operator.resync.) The
            # sandbox's own watch event will bring the claim back; check again soon regardless.
            ctx.request_at("SandboxClaim", ns, name, now + 1.0)
            return
        await finish(ctx, body, v.FAILED, v.R_SANDBOX_LOST,
                     f"sandbox {expected} was deleted while the claim was bound")
        return
    if not shutdown:
        return
    if not lifecycle.due(shutdown, now):
        ctx.request_at("SandboxClaim", ns, name, shutdown)
        return
    if policy == "Retain":
        await take_back(ctx, ns, sandbox.name, sandbox.uid, sandbox.claim_uid)  # the claim's token dies with it
        patch = retain_patch(name, spec.pool_ref.name, now_iso())
        await ignore({404}, ctx.kube.patch("Sandbox", sandbox.name, ns, patch))
        await finish(ctx, body, v.FINISHED, v.R_SHUTDOWN_TIME, f"shutdownTime reached; sandbox {sandbox.name} retained")
    elif policy == "DeleteForeground":
        if not sandbox.deleting:
            await ignore({404}, ctx.kube.delete("Sandbox", sandbox.name, ns, foreground=True))
        # Finished once the sandbox is gone (its deletion event brings us back here).
    else:
        await ignore({404}, ctx.kube.delete("Sandbox", sandbox.name, ns))
        await finish(ctx, body, v.FINISHED, v.R_SHUTDOWN_TIME, f"shutdownTime reached; sandbox {sandbox.name} deleted")


async def _after_finish(ctx: Context, body: dict[str, Any], spec: SandboxClaimSpec, now: float) -> None:
    ttl = spec.lifecycle.ttl_seconds_after_finished
    if ttl is None:
        return
    meta = body["metadata"]
    finished = _ts((body.get("status") or {}).get("finishedTime")) or now
    expiry = lifecycle.finished_expiry(finished, ttl)
    if lifecycle.due(expiry, now):
        log.info("claim %s/%s: ttlSecondsAfterFinished passed; deleting", meta["namespace"], meta["name"])
        await ignore({404, 409}, ctx.kube.delete("SandboxClaim", meta["name"], meta["namespace"], uid=meta["uid"]))
    else:
        ctx.request_at("SandboxClaim", meta["namespace"], meta["name"], expiry)


async def _release_for_failure(ctx: Context, ns: str, name: str) -> None:
    """A failed claim holds no sandbox: delete one made or adopted for it (Pool members are recycled by their pool)."""
    m = ctx.cache.claim_sandbox(ns, name)
    sandbox_name = m.name if m else ctx.bound.get((ns, name))
    ctx.bound.pop((ns, name), None)
    if not sandbox_name:
        return
    if m is not None and m.pool_kind == "Pool":
        ctx.request("Pool", ns, m.pool or "")
        return
    await ignore({404}, ctx.kube.delete("Sandbox", sandbox_name, ns))
