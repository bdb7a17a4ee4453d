"""SandboxClaim: warm adoption from the cache (one conditional write), cold start otherwise, and the lifecycle.

A warm claim costs two API writes: the adoption patch of the sandbox (conditional on its resourceVersion, so two
claims can never take the same one; a 409 moves on to the next candidate) and the claim's status. A pass writes the
claim's status only over the version of the claim it decided on (a replica whose view is behind, during a shard
handover, writes nothing over another's binding). Env goes to the
warm sandbox through execd, not through a new pod. Every user error ends in a Failed condition saying why.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import httpx

from corral.api import CorralValidationError, SandboxClaimSpec, SandboxTemplateSpec
from corral.api.claim import ClaimedSandbox, SandboxClaimStatus
from corral.execd import wire

from ..builders import owner_ref, retain_patch, sandbox_labels, sandbox_manifest
from ..cache import member_of
from ..constants import A_CLAIM_UID, A_LAUNCH, L_CLAIM
from ..context import Context
from ..core import lifecycle, metrics
from ..core import vocabulary as v
from ..core.admission import Refusal, admit_claim, template_env_names
from ..kube import ignore, status_code
from ..metrics import lost_bind
from ..planning import Member, adoption_candidates
from ..views import ClaimView, PoolView, SandboxView, TemplateView, checked, status_patch
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
    if not spec.env and not spec.volume_claim_templates:
        return None  # the common claim: nothing to admit (and no walk over the template's containers)
    return admit_claim(env=[e.name for e in spec.env], template_env=template_env_names(template.pod_template.spec),
                       env_policy=template.env_vars_injection_policy, volumes=len(spec.volume_claim_templates),
                       volume_policy=template.volume_claim_templates_policy)


async def _status(ctx: Context, claim: ClaimView, *, resource_version: str | None = None, **fields: Any) -> None:
    """Write the claim's status (SandboxClaimStatus fields), conditional on `resource_version` if given; a phase that
    ends its wait is remembered until the watch shows it (see `reconcile_claim`)."""
    patch: dict[str, Any] = {"status": checked(SandboxClaimStatus, status_patch(SandboxClaimStatus, **fields))}
    if resource_version:
        patch["metadata"] = {"resourceVersion": resource_version}
    await ctx.kube.patch("SandboxClaim", claim.name, claim.namespace, patch, status=True)
    if fields.get("phase") in (v.BOUND, *v.FINAL_RESOURCE_PHASES):
        ctx.claims.phase_written(claim.namespace, claim.name, fields["phase"])


async def finish(ctx: Context, claim: ClaimView, phase: str, reason: str, message: str) -> bool:
    """End the claim (Failed or Finished), over the version of the claim this pass decided on: a replica whose view
    is behind (a shard changing hands, corral.operator.shards) never fails a claim that another replica has bound
    meanwhile. On a conflict nothing is written (False): the change that caused it brings the claim back."""
    gen = claim.generation
    conditions = set_condition(claim.conditions, v.BOUND, False, reason, message, gen)
    if phase == v.FAILED:
        conditions = set_condition(conditions, v.FAILED, True, reason, message, gen)
    if not await _decided(ctx, claim, phase, phase=phase, finished_time=now_iso(), observed_generation=gen,
                          conditions=conditions):
        return False
    metrics.claim_ended(claim.pool_name, claim.launch_type, reason)
    log.info("claim %s/%s %s: %s (%s)", claim.namespace, claim.name, phase, reason, message)
    return True


async def _decided(ctx: Context, claim: ClaimView, what: str, **fields: Any) -> bool:
    """A status write conditional on the claim's version this pass looked at; False (nothing written) if the claim
    changed since."""
    try:
        await _status(ctx, claim, resource_version=claim.resource_version or None, **fields)
    except Exception as exc:  # noqa: BLE001
        if status_code(exc) != 409:
            raise
        log.info("claim %s/%s changed since this pass looked at it; not written: %s", claim.namespace, claim.name,
                 what)
        return False
    return True


async def reconcile_claim(ctx: Context, ns: str, name: str) -> None:
    body = ctx.cache.claim(ns, name)
    if body is None:
        ctx.claims.claim_gone(ns, name)
        await _release_deleted(ctx, ns, name)
        return
    claim = ClaimView(body)
    ctx.cancel_at("SandboxClaim", ns, name)  # each pass re-arms only the deadlines still ahead
    if claim.deleting:
        return
    phase = claim.phase
    if ctx.claims.awaiting_echo(ns, name, phase):
        return  # our own status write is on its way through the watch; acting now would write it twice
    now = time.time()
    try:
        spec = ctx.claims.spec(body, keep=phase not in v.FINAL_RESOURCE_PHASES)
    except CorralValidationError as exc:
        if phase not in v.FINAL_RESOURCE_PHASES:
            await finish(ctx, claim, v.FAILED, v.R_INVALID_SPEC, str(exc))
        return

    if phase in v.FINAL_RESOURCE_PHASES:
        await _after_finish(ctx, claim, spec, now)
        return
    sandbox = ctx.cache.claim_sandbox(ns, name)
    if sandbox is not None:
        ctx.claims.binding_seen(ns, name)
    if phase == v.BOUND:
        await _bound(ctx, claim, spec, sandbox, now)
        return
    try:
        await _pending(ctx, claim, spec, sandbox, now)
    except ClaimError as exc:
        # Failed first, then the sandbox goes: a replica whose view of the claim is behind (another bound it
        # meanwhile) writes nothing, and so deletes nothing (a failed delete is retried by `_after_finish`).
        if await finish(ctx, claim, v.FAILED, exc.reason, str(exc)):
            await _release_for_failure(ctx, ns, name)


async def _release_deleted(ctx: Context, ns: str, name: str) -> None:
    """A deleted claim's sandbox and its pod go now, deleted by the operator, not when the garbage collector gets to
    them. The GC would (the claim owns the sandbox, the sandbox its pod), but it is kube-controller-manager's, on a
    rate-limited client shared with every other controller: at a steady 20 claims/s released after 1 s, released
    sandboxes and pods piled up by ~12 and ~17 a second on the test bed (all of them held by the operator's caches).
    Only a sandbox still labelled for the claim and owned by a SandboxClaim of that name, none of which exists now
    (a retained sandbox has neither), each delete conditional on the uid seen; the GC then finds nothing left."""
    for m in ctx.cache.claim_sandboxes(ns, name):
        sandbox = ctx.cache.sandbox(ns, m.name)
        owners = ((sandbox or {}).get("metadata") or {}).get("ownerReferences") or []
        if m.deleting or not any(o.get("kind") == "SandboxClaim" and o.get("name") == name for o in owners):
            continue
        await ignore({404, 409}, ctx.kube.delete("Sandbox", m.name, ns, uid=m.uid))
        pod = ctx.cache.pod(ns, m.name)
        if pod is not None and not pod.deleting:
            await ignore({404, 409}, ctx.kube.delete("Pod", m.name, ns, uid=pod.uid))


async def _pending(ctx: Context, claim: ClaimView, spec: SandboxClaimSpec, sandbox: Member | None,
                   now: float) -> None:
    ns, name = claim.key
    first = ctx.claims.first_seen(ns, name, now)
    deadline = lifecycle.claim_deadline(claim.created, spec.timeout_seconds)
    kind, pool_name = spec.pool_ref.kind, spec.pool_ref.name

    pool_body = ctx.cache.pool_of_kind(ns, kind, pool_name)
    pool = None if pool_body is None else PoolView(pool_body)
    template_body = ctx.cache.template(ns, pool.template_name) if pool else None
    if pool is None or template_body is None:
        what = f"{kind} {pool_name!r}" if pool is None else f"SandboxTemplate {pool.template_name!r}"
        if now >= deadline:
            raise ClaimError(v.R_TIMEOUT, f"{what} does not exist in {ns} (waited {spec.timeout_seconds}s)")
        await _waiting(ctx, claim, v.R_POOL_NOT_FOUND if pool is None else v.R_TEMPLATE_NOT_FOUND,
                       f"{what} does not exist in {ns}; waiting up to timeoutSeconds")
        ctx.request_at("SandboxClaim", ns, name, deadline)
        return
    ctx.pacing.claim_decided(kind, ns, pool_name)  # the pool's refill waits for the quiet moment after a claim stream
    template = TemplateView(template_body)
    try:
        tspec, bp_hash = ctx.templates.spec(template_body)
    except CorralValidationError as exc:
        raise ClaimError(v.R_INVALID_TEMPLATE, str(exc)) from None
    env = [e.to_k8s() for e in spec.env]
    if refusal := admission(spec, tspec):
        raise ClaimError(refusal.reason, refusal.message)

    bound_name = ctx.claims.bound_to(ns, name)
    if sandbox is None and bound_name:
        sb = ctx.cache.sandbox(ns, bound_name)
        sandbox = None if sb is None else member_of(sb)
    if sandbox is not None or bound_name:
        if sandbox is not None and sandbox.ready:
            if env and sandbox.launch_type == v.WARM:
                await _inject_env(ctx, claim, sandbox, env)  # idempotent: covers a restart between adoption and binding
            await _bind(ctx, claim, sandbox, sandbox.launch_type or v.COLD, pool_name, first)
        elif now >= deadline:
            raise ClaimError(v.R_TIMEOUT, f"sandbox {sandbox.name if sandbox else bound_name} was not ready "
                                        f"within {spec.timeout_seconds}s")
        else:
            ctx.request_at("SandboxClaim", ns, name, deadline)
        return
    if now >= deadline:
        raise ClaimError(v.R_TIMEOUT, f"no sandbox within {spec.timeout_seconds}s")

    if not spec.volume_claim_templates:
        adopted = await _adopt(ctx, claim, kind, pool_name, bp_hash)
        if adopted is not None:
            if env:
                await _inject_env(ctx, claim, adopted, env)
            if spec.additional_pod_metadata.labels or spec.additional_pod_metadata.annotations:
                md = spec.additional_pod_metadata
                await ignore({404}, ctx.kube.patch("Pod", adopted.name, ns, {"metadata": {
                    "labels": md.labels, "annotations": md.annotations}}))
            await _bind(ctx, claim, adopted, v.WARM, pool_name, first)
            return
    await _cold(ctx, claim, spec, pool, template, tspec, bp_hash, env)
    ctx.request(kind, ns, pool_name)  # the pool may have been waiting for this decision to refill
    ctx.request_at("SandboxClaim", ns, name, deadline)


async def _waiting(ctx: Context, claim: ClaimView, reason: str, message: str) -> None:
    gen = claim.generation
    if claim.phase != v.PENDING or not any(c.get("reason") == reason for c in claim.conditions):
        conditions = set_condition(claim.conditions, v.BOUND, False, reason, message, gen)
        await _decided(ctx, claim, reason, phase=v.PENDING, observed_generation=gen, conditions=conditions)


async def _adopt(ctx: Context, claim: ClaimView, kind: str, pool: str, bp_hash: str) -> Member | None:
    ns, name = claim.key
    for m in adoption_candidates(ctx.cache.members(ns, kind, pool), bp_hash, ctx.claims.reserved_in(ns)):
        ctx.claims.reserve(ns, m.name, name)
        patch: dict[str, Any] = {"metadata": {
            "resourceVersion": m.resource_version,
            "labels": {L_CLAIM: name},
            "annotations": {A_LAUNCH: v.WARM, A_CLAIM_UID: claim.uid},  # its execd token derives from it
        }}
        if kind == "WarmPool":  # the claim owns it from now on: deleting the claim deletes the sandbox
            patch["metadata"]["ownerReferences"] = [owner_ref(claim.body)]
        try:
            await ctx.kube.patch("Sandbox", m.name, ns, patch)
        except Exception as exc:  # noqa: BLE001
            ctx.claims.unreserve(ns, m.name)
            if status_code(exc) in (404, 409, 422):
                continue  # taken or gone since the cache saw it: next candidate
            raise
        ctx.claims.bind(ns, name, m.name)
        if kind == "WarmPool":
            ctx.request(kind, ns, pool)  # replenish now, without waiting for the watch event
        return m
    return None


async def _inject_env(ctx: Context, claim: ClaimView, m: Member, env: list[dict[str, str]]) -> None:
    """The claim's env into its warm sandbox's execd, which takes the claim's token first (handover.py)."""
    pod = ctx.cache.pod(m.namespace, m.name)
    if not m.endpoint or pod is None:
        raise ClaimError(v.R_ENV_INJECTION_FAILED, f"sandbox {m.name} has no execd endpoint")
    try:
        token = await hand_over(ctx, m.namespace, m.name, m.uid, pod.uid, f"http://{m.endpoint}", claim.uid)
        resp = await ctx.http().put(f"http://{m.endpoint}{wire.ENV_PATH}",
                                    json={"env": {e["name"]: e.get("value", "") for e in env}, "merge": True},
                                    headers={"Authorization": f"Bearer {token}"}, timeout=5)
        resp.raise_for_status()
    except (httpx.HTTPError, ExecdUnreachable) as exc:
        raise ClaimError(v.R_ENV_INJECTION_FAILED,
                         f"could not set env in sandbox {m.name} through execd: {exc}") from None


async def _bind(ctx: Context, claim: ClaimView, m: Member, launch: str, pool: str, first_seen: float) -> None:
    """The claim's Bound status, written only over the version of the claim this pass decided on: of two replicas
    binding one claim at once (a shard changing hands, corral.operator.shards), one write wins; the other finds the
    claim bound to another sandbox and gives back the one it took (`_lost_bind`). A 409 for any other change (a
    label, our own earlier Pending write) is retried over the fresh version, after one read."""
    gen = claim.generation
    sandbox = status_patch(ClaimedSandbox, name=m.name, pod_ips=list(m.pod_ips), endpoint=m.endpoint)
    body, rv = claim.body, claim.body["metadata"].get("resourceVersion")
    for attempt in range(4):
        try:
            await _status(
                ctx, ClaimView(body), resource_version=rv, phase=v.BOUND, sandbox=sandbox, launch_type=launch,
                bound_time=now_iso(), observed_generation=gen,
                conditions=set_condition(ClaimView(body).conditions, v.BOUND, True, v.R_BOUND,
                                         f"bound to sandbox {m.name} ({launch.lower()} start)", gen))
            break
        except Exception as exc:  # noqa: BLE001
            if status_code(exc) != 409 or attempt == 3:
                raise
        body = await ctx.kube.get("SandboxClaim", claim.name, claim.namespace)
        rv = body["metadata"].get("resourceVersion")
        current = ClaimView(body)
        if current.phase == v.BOUND and current.sandbox_name == m.name and body["metadata"].get("uid") == claim.uid:
            ctx.claims.phase_written(claim.namespace, claim.name, v.BOUND)
            break  # another pass wrote this very binding
        if body["metadata"].get("uid") != claim.uid or current.phase in v.FINAL_RESOURCE_PHASES or \
                (current.sandbox_name and current.sandbox_name != m.name):
            await _lost_bind(ctx, claim, m, current.sandbox_name)
            return
    metrics.claim_bound(pool, launch, time.time() - first_seen)
    ctx.claims.decided(claim.namespace, claim.name)


async def _lost_bind(ctx: Context, claim: ClaimView, m: Member, winner: str | None) -> None:
    """Another pass (another replica) bound the claim first: the sandbox this one adopted or created for it is
    nobody's. It is deleted (conditional on its uid): it may hold the claim's execd token and env, and its pool
    refills."""
    log.warning("claim %s/%s was bound to %s by another replica meanwhile; deleting sandbox %s taken for it",
                claim.namespace, claim.name, winner, m.name)
    lost_bind(m.uid)
    ctx.claims.unbind(claim.namespace, claim.name)
    if m.name != winner:
        await ignore({404, 409}, ctx.kube.delete("Sandbox", m.name, claim.namespace, uid=m.uid or None))


async def _cold(ctx: Context, claim: ClaimView, spec: SandboxClaimSpec, pool: PoolView, template: TemplateView,
                tspec: SandboxTemplateSpec, bp_hash: str, env: list[dict[str, str]]) -> None:
    if pool.kind == "Pool":
        async with ctx.pool_locks.hold(pool.namespace, pool.name):
            await _cold_in_pool(ctx, claim, spec, pool, template, tspec, bp_hash, env)
        return
    await _cold_create(ctx, claim, spec, pool, template, tspec, bp_hash, env)


async def _cold_in_pool(ctx: Context, claim: ClaimView, spec: SandboxClaimSpec, pool: PoolView,
                        template: TemplateView, tspec: SandboxTemplateSpec, bp_hash: str,
                        env: list[dict[str, str]]) -> None:
    """A cold start inside a Pool counts against poolMax, including creates not yet seen in the cache."""
    ns, pool_name = pool.key
    members = ctx.cache.members(ns, "Pool", pool_name)
    in_flight = ctx.creates.outstanding(("Pool", ns, pool_name), {m.name for m in members})
    pool_max = pool.pool_max
    if len(members) + in_flight >= pool_max:
        await _waiting(ctx, claim, v.R_POOL_EXHAUSTED, f"Pool {pool_name} is at poolMax ({pool_max}); waiting")
        return
    created = await _cold_create(ctx, claim, spec, pool, template, tspec, bp_hash, env)
    ctx.creates.expect(("Pool", ns, pool_name), created)


async def _cold_create(ctx: Context, claim: ClaimView, spec: SandboxClaimSpec, pool: PoolView,
                       template: TemplateView, tspec: SandboxTemplateSpec, bp_hash: str,
                       env: list[dict[str, str]]) -> str:
    ns, name = claim.key
    blueprint = copy.deepcopy(template.spec)
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
    tname = template.name
    if pool.kind == "Pool":
        labels = sandbox_labels(tname, pool=pool.name, pool_kind="Pool", claim=name, bp_hash=bp_hash)
        owner = owner_ref(pool.body)
    else:
        labels = sandbox_labels(tname, claim=name, bp_hash=bp_hash)
        owner = owner_ref(claim.body)
    sandbox_name = f"{name}-{claim.uid[:5]}"
    manifest = sandbox_manifest(name=sandbox_name, namespace=ns, template_name=tname, blueprint=blueprint,
                                labels=labels, owner=owner, annotations={A_LAUNCH: v.COLD, A_CLAIM_UID: claim.uid})
    await ignore({409}, ctx.kube.create(manifest))
    ctx.claims.bind(ns, name, sandbox_name)
    return sandbox_name


async def _still_there(ctx: Context, ns: str, sandbox: str, claim: str) -> bool:
    """Whether the claim's sandbox exists (not being deleted, still bound to it), asked of the API server: one read,
    only on the rare path where the index has no such sandbox, before a claim is failed for good."""
    try:
        obj = await ctx.kube.get("Sandbox", sandbox, ns)
    except Exception as exc:  # noqa: BLE001 - 404 is the answer; anything else: don't fail the claim on a hunch
        return status_code(exc) != 404
    live = SandboxView(obj)
    return not live.deleting and live.claim_label == claim


async def _bound(ctx: Context, claim: ClaimView, spec: SandboxClaimSpec, sandbox: Member | None,
                 now: float) -> None:
    ns, name = claim.key
    shutdown = spec.lifecycle.shutdown_time.timestamp() if spec.lifecycle.shutdown_time else 0.0
    policy = spec.lifecycle.shutdown_policy
    if sandbox is not None and claim.sandbox_name:
        sandbox = await _drop_extras(ctx, claim, claim.sandbox_name) or sandbox
    if sandbox is None:
        expected = claim.sandbox_name
        if ctx.claims.is_bound(ns, name):
            return  # our own adoption, not reported by the watch yet
        if lifecycle.due(shutdown or None, now):
            await finish(ctx, claim, v.FINISHED, v.R_SHUTDOWN_TIME, f"shut down at shutdownTime ({policy})")
            return
        if expected and await _still_there(ctx, ns, expected, name):
            # The index is behind the cluster: kopf re-lists one watch stream at a time (after a 410 Gone, say), so
            # claims can be current while sandboxes are not. (A takeover is covered by corral.operator.resync.) The
            # sandbox's own watch event will bring the claim back; check again soon regardless.
            ctx.request_at("SandboxClaim", ns, name, now + 1.0)
            return
        await finish(ctx, claim, v.FAILED, v.R_SANDBOX_LOST,
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
        await finish(ctx, claim, v.FINISHED, v.R_SHUTDOWN_TIME,
                     f"shutdownTime reached; sandbox {sandbox.name} retained")
    elif policy == "DeleteForeground":
        if not sandbox.deleting:
            await ignore({404}, ctx.kube.delete("Sandbox", sandbox.name, ns, foreground=True))
        # Finished once the sandbox is gone (its deletion event brings us back here).
    else:
        await ignore({404}, ctx.kube.delete("Sandbox", sandbox.name, ns))
        await finish(ctx, claim, v.FINISHED, v.R_SHUTDOWN_TIME,
                     f"shutdownTime reached; sandbox {sandbox.name} deleted")


async def _drop_extras(ctx: Context, claim: ClaimView, bound_to: str) -> Member | None:
    """The sandbox the claim's status names; any other sandbox labelled for the claim is deleted (conditional on its
    uid). There is one only when two replicas acted on the claim at once (a shard changing hands, see
    corral.operator.shards): the one that lost the status write may have started a cold sandbox meanwhile, or died
    before giving back what it adopted."""
    found = None
    for m in ctx.cache.claim_sandboxes(claim.namespace, claim.name):
        if m.name == bound_to:
            found = m
        elif not m.deleting:
            log.warning("claim %s/%s is bound to %s; deleting sandbox %s also labelled for it", claim.namespace,
                        claim.name, bound_to, m.name)
            lost_bind(m.uid)
            await ignore({404, 409}, ctx.kube.delete("Sandbox", m.name, claim.namespace, uid=m.uid or None))
    return found


async def _after_finish(ctx: Context, claim: ClaimView, spec: SandboxClaimSpec, now: float) -> None:
    if claim.phase == v.FAILED:
        m = ctx.cache.claim_sandbox(claim.namespace, claim.name)
        if (m is not None and not m.deleting and m.pool_kind != "Pool") or ctx.claims.is_bound(*claim.key):
            await _release_for_failure(ctx, claim.namespace, claim.name)  # a failed claim holds no sandbox
    ttl = spec.lifecycle.ttl_seconds_after_finished
    if ttl is None:
        return
    expiry = lifecycle.finished_expiry(claim.finished_at or now, ttl)
    if lifecycle.due(expiry, now):
        log.info("claim %s/%s: ttlSecondsAfterFinished passed; deleting", claim.namespace, claim.name)
        await ignore({404, 409}, ctx.kube.delete("SandboxClaim", claim.name, claim.namespace, uid=claim.uid))
    else:
        ctx.request_at("SandboxClaim", claim.namespace, claim.name, expiry)


async def _release_for_failure(ctx: Context, ns: str, name: str) -> None:
    """A failed claim holds no sandbox: delete one made or adopted for it (Pool members are recycled by their pool)."""
    m = ctx.cache.claim_sandbox(ns, name)
    sandbox_name = m.name if m else ctx.claims.bound_to(ns, name)
    ctx.claims.unbind(ns, name)
    if not sandbox_name:
        return
    if m is not None and m.pool_kind == "Pool":
        ctx.request("Pool", ns, m.pool or "")
        return
    await ignore({404}, ctx.kube.delete("Sandbox", sandbox_name, ns))
