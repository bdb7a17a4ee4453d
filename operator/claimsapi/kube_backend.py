"""The claims API on Kubernetes: a `ClaimsBackend` over SandboxClaim custom resources, served from the operator.

One API serves one namespace (`CORRAL_API_NAMESPACE`, default `default`, the namespace the Pulumi components put
templates and pools in unless told otherwise; set it to the sandbox namespace, e.g. `corral-sandboxes`). The
operator must watch that namespace (it watches all by default).

    create   -> a SandboxClaim in that namespace; waits for Bound (-> Ready) or Failed through the operator's watch
                events (never polling), up to the request's timeoutSeconds; then 201, 202 (still Pending) or the
                Failed condition's message as a `claim_failed` error. An existing name is returned (safe retry).
    get/list -> the kopf indices the operator already keeps (no API call); a direct read only in the short window
                after a start before kopf has delivered its first event.
    delete   -> Delete policy: the claim is deleted (a WarmPool sandbox goes with it, garbage collected through its
                owner reference; a Pool sandbox is recycled by its Pool). Retain: shutdownTime=now and
                ttlSecondsAfterFinished=0, so the operator detaches the sandbox, then deletes the claim. The call
                returns once the claim is gone (or after a short grace).
    renew    -> spec.lifecycle.shutdownTime = now + ttl (the operator re-arms its timer).
    pause / resume / snapshot -> 400 `not_supported` (see NOT_SUPPORTED below); so do listing and removing
                snapshots: every snapshot route answers the same (there is nothing to list, and saying so beats an
                empty list that suggests snapshots exist elsewhere in this mode).
    retained -> Sandboxes kept after their claim ended (builders.is_retained: marked by the operator's Retain path),
                from the index; delete removes one such Sandbox (its pod and PVCs go with it), nothing else.
    batches  -> SandboxBatch objects (create, get and list from the index, delete); `watch_batch` is woken by the
                operator's SandboxBatch watch events. An ended index's output tail is the one the operator read when
                the task ended (reconcile/batchtasks.py, kept in context.batches.outputs: the end releases the
                sandbox); one not kept (the operator restarted, a Retain sandbox) is read from the sandbox's execd
                if it is still there, OUTPUT_READS at a time.
    execd    -> the bound sandbox's pod IP, its execd port and the claim's own token (put into execd on first use:
                reconcile/handover.py; derived, see corral.operator.tokens).

The HTTP server around it, in the operator's event loop, is kube_server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from datetime import UTC, datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from lightkube import ApiError

from corral.api import PoolSpec, WarmPoolSpec
from corral.api.wire import (
    Batch,
    BatchPhase,
    BatchRequest,
    BatchTaskResult,
    Claim,
    ClaimRequest,
    PoolStatus,
    RetainedSandbox,
    SandboxRef,
    Snapshot,
    SnapshotRequest,
)
from corral.execd import wire

from ..builders import is_retained
from ..cache import member_of
from ..constants import A_RETAINED_AT, A_RETAINED_FROM, A_RETAINED_POOL, API_VERSION, L_POOL, L_TEMPLATE
from ..core import batches as batchrules
from ..core import lifecycle as deadlines
from ..core import vocabulary as vocab
from ..core.outputs import Tail
from ..kube import RESOURCES, status_code
from ..planning import Member, pool_desired
from ..reconcile.batchtasks import output_tail
from ..reconcile.handover import ExecdUnreachable, hand_over
from .backend import BackendError, Conflict, ExecdTarget, Invalid, NotFound, Unavailable

log = logging.getLogger("corral.operator.claimsapi")

CLAIM_TIMEOUT_MIN = 300     # a claim's own timeoutSeconds (the CR's): at least this, whatever the request waits
DELETE_GRACE = 30.0         # how long DELETE waits for the claim (or batch) to disappear
OUTPUT_READS = 8            # output tails read from execd at a time (only those not kept when their task ended)
WATCH_CHECK = 30.0          # a batch's watcher re-checks this replica's leadership this often while nothing happens
CREATED_BY = {"app.kubernetes.io/created-by": "corral-api"}
USER_ERRORS = vocab.USER_ERRORS  # a Failed claim with one of these reasons answers 400, others 503
NOT_SUPPORTED = {
    "pause": "pause/resume is Docker-only: it freezes the processes and keeps their memory. Kubernetes has no "
             "freezer for a pod; the nearest thing, a Sandbox's operatingMode Suspended, deletes the pod (processes, "
             "memory, files outside PVCs and env injected into a warm sandbox are lost), which is not a pause",
    "snapshot": "snapshots are Docker-only (a commit of the container to an image); a pod's filesystem cannot be "
                "committed through the Kubernetes API",
}


class NotSupported(BackendError):
    status, code = 400, "not_supported"


class SandboxUnreachable(BackendError):
    """The claim's execd could not be given the claim's token (it does not answer): what the proxy says when it
    cannot connect."""

    status, code = 502, "sandbox_unreachable"


class ClaimFailed(BackendError):
    """The claim's Failed condition, as an error: 400 for a spec/policy problem, 503 otherwise (retry may work)."""

    code = "claim_failed"


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _lease_iso(end: float) -> str:
    """A lease's end as shutdownTime: whole seconds, rounded up, so a lease is never shorter than asked."""
    return _iso(datetime.fromtimestamp(math.ceil(end), UTC))


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def desired_size(kind: str, spec: dict[str, Any], allocated: int) -> int:
    """A pool's `desired` in the pool list: from the spec validated by the resource model (its defaults, not
    defaults of our own: a Pool's bufferMin is 0 unless set), sized by the core (planning.pool_desired)."""
    if kind == "WarmPool":
        return WarmPoolSpec.model_validate(spec).replicas
    cap = PoolSpec.model_validate(spec).capacity
    return pool_desired(buffer_min=cap.buffer_min, pool_min=cap.pool_min, pool_max=cap.pool_max, allocated=allocated)


def _api_error(exc: ApiError, what: str) -> BackendError:
    code = status_code(exc)
    message = f"{what}: {exc.status.message if exc.status else exc}"
    if code == 404:
        return NotFound(message)
    if code == 409:
        return Conflict(message)
    if code in (400, 422):
        return Invalid(message)
    return Unavailable(message)


T = TypeVar("T")
P = ParamSpec("P")


def active_replica(
    method: Callable[Concatenate[KubeBackend, P], Awaitable[T]],
) -> Callable[Concatenate[KubeBackend, P], Coroutine[Any, Any, T]]:
    """Serve only on the active replica: a kopf-paused one gets no watch events, so its indices are stale and a
    claim it creates would never be seen to bind. (The chart's claims API Service routes to the active replica's pod
    only; this covers a client that reaches a standby anyway.)"""

    @functools.wraps(method)
    async def serve(self: KubeBackend, *args: P.args, **kwargs: P.kwargs) -> T:
        if not self.ctx.leadership.active:
            raise Unavailable(f"this operator replica is on standby (kopf peering {self.ctx.leadership.peering!r}): "
                              "retry; the claims API Service routes to the active replica")
        return await method(self, *args, **kwargs)

    return serve


class KubeBackend:
    """ClaimsBackend over SandboxClaims in one namespace, reading the operator's kopf indices.

    `context` is the operator's Context: its counted API client, the execd token key, and its Cache over kopf's live
    indices (ready once kopf has delivered them complete: it calls no handler before every index is filled from the
    initial listing).
    """

    def __init__(self, context: Any, namespace: str) -> None:
        self.ctx, self.ns = context, namespace
        self._waiters: dict[tuple[str, str], set[asyncio.Event]] = {}
        self._reads = asyncio.Semaphore(OUTPUT_READS)

    # --- events (called by the operator's claim handler) -------------------------------------------------------------
    def claim_event(self, namespace: str, name: str, kind: str = "SandboxClaim") -> None:
        if namespace == self.ns:
            for ev in self._waiters.get((kind, name), ()):
                ev.set()

    def batch_event(self, namespace: str, name: str) -> None:
        self.claim_event(namespace, name, "SandboxBatch")

    @contextlib.contextmanager
    def _subscribe(self, name: str, kind: str = "SandboxClaim") -> Iterator[asyncio.Event]:
        ev = asyncio.Event()
        key = (kind, name)
        self._waiters.setdefault(key, set()).add(ev)
        try:
            yield ev
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(ev)
                if not waiters:
                    del self._waiters[key]

    # --- reads: the indices, or one direct read before they are complete ------------------------------------------
    def _ready(self) -> bool:
        return self.ctx.cache.ready

    async def _get(self, kind: str, name: str, *, confirm: bool = True) -> dict[str, Any] | None:
        """The object from the index; a miss is confirmed with one direct read (the watch may not have delivered
        an object created a moment ago), unless `confirm` is False (waits, woken by the watch itself)."""
        if self._ready():
            found = self.ctx.cache.get(kind, self.ns, name)
            if found is not None or not confirm:
                return found
        try:
            return await self.ctx.kube.get(kind, name, self.ns)
        except ApiError as exc:
            if status_code(exc) == 404:
                return None
            raise _api_error(exc, f"reading {kind} {name}") from None

    async def _list(self, kind: str) -> list[dict[str, Any]]:
        if self._ready():
            return self.ctx.cache.list(kind, self.ns)
        self.ctx.kube._count("list", kind)  # noqa: SLF001 - the same counter as every other operator call
        return [o.to_dict() if hasattr(o, "to_dict") else dict(o)
                async for o in self.ctx.kube.client.list(RESOURCES[kind], namespace=self.ns)]

    async def _members(self, kind: str, pool: str) -> list[Member]:
        if self._ready():
            return self.ctx.cache.members(self.ns, kind, pool)
        self.ctx.kube._count("list", "Sandbox")  # noqa: SLF001
        members = [member_of(o.to_dict() if hasattr(o, "to_dict") else dict(o)) async for o in
                   self.ctx.kube.client.list(RESOURCES["Sandbox"], namespace=self.ns, labels={L_POOL: pool})]
        return [m for m in members if (m.pool_kind or "WarmPool") == kind]

    async def _claim(self, name: str) -> dict[str, Any]:
        body = await self._get("SandboxClaim", name)
        if body is None:
            raise NotFound(f"no claim named {name!r} in namespace {self.ns}")
        return body

    # --- mapping ---------------------------------------------------------------------------------------------------
    def to_api(self, body: dict[str, Any]) -> Claim:
        meta, spec, st = body["metadata"], body.get("spec") or {}, body.get("status") or {}
        lifecycle, ref = spec.get("lifecycle") or {}, spec.get("poolRef") or {}
        phase: vocab.ApiPhase = vocab.api_phase(st.get("phase"))
        message = None
        if phase in ("Failed", "Expired"):
            message = (_condition(st, "Failed") or _condition(st, "Bound")).get("message") or None
        elif phase == "Pending":
            message = _condition(st, "Bound").get("message") or None
        sandbox = (st.get("sandbox") or {}).get("name")
        if phase == "Ready" and sandbox and (why := self._not_ready(sandbox)):
            phase, message = "Pending", why  # bound, but its execd does not answer (the pod's readiness probe)
        return Claim(
            name=meta["name"], pool=ref.get("name", ""), pool_kind=ref.get("kind", "WarmPool"), phase=phase,
            launch_type=vocab.api_launch_type(st.get("launchType")),
            sandbox=SandboxRef(name=sandbox, endpoint=f"/v1/claims/{meta['name']}/execd")
            if sandbox and st.get("phase") == "Bound" else None,
            created=_ts(meta.get("creationTimestamp")) or datetime.now(UTC),
            ready_at=_ts(st.get("boundTime")), expires_at=_ts(lifecycle.get("shutdownTime")),
            shutdown_policy="Retain" if lifecycle.get("shutdownPolicy") == "Retain" else "Delete",
            message=message,
        )

    def _not_ready(self, sandbox: str) -> str | None:
        """Why a bound claim's sandbox is not Ready (its pod failed the readiness probe on execd's health: execd
        stayed gone past its own restarts), from the index; None when Ready or not known from the index."""
        body = self.ctx.cache.sandbox(self.ns, sandbox) if self._ready() else None
        if body is None or member_of(body).ready:
            return None
        ready = _condition(body.get("status") or {}, "Ready")
        why = ready.get("message") or ready.get("reason") or "execd is not answering"
        return f"sandbox {sandbox} is not ready: {why}"

    def _failed(self, body: dict[str, Any]) -> ClaimFailed:
        cond = _condition(body.get("status") or {}, "Failed") or _condition(body.get("status") or {}, "Bound")
        reason = cond.get("reason") or "Failed"
        return ClaimFailed(f"claim {body['metadata']['name']} failed ({reason}): {cond.get('message') or reason}",
                           status=400 if reason in USER_ERRORS else 503)

    # --- the protocol ----------------------------------------------------------------------------------------------
    async def _pool_kind(self, pool: str) -> str:
        for kind in ("WarmPool", "Pool"):
            body = await self._get(kind, pool)
            if body is not None:
                template = ((body.get("spec") or {}).get("templateRef") or {}).get("name", "")
                if await self._get("SandboxTemplate", template) is None:
                    raise NotFound(f"{kind} {pool!r} uses SandboxTemplate {template!r}, which does not exist in "
                                   f"namespace {self.ns}")
                return kind
        raise NotFound(f"no WarmPool or Pool named {pool!r} in namespace {self.ns}")

    def _manifest(self, name: str, kind: str, req: ClaimRequest) -> dict[str, Any]:
        lifecycle: dict[str, Any] = {"shutdownPolicy": req.shutdown_policy}
        if end := deadlines.lease_end(time.time(), req.ttl_seconds):
            lifecycle["shutdownTime"] = _lease_iso(end)
        spec: dict[str, Any] = {
            "poolRef": {"kind": kind, "name": req.pool}, "lifecycle": lifecycle,
            "timeoutSeconds": max(CLAIM_TIMEOUT_MIN, math.ceil(req.timeout_seconds)),
        }
        if req.env:
            spec["env"] = [{"name": k, "value": v} for k, v in req.env.items()]
        return {"apiVersion": API_VERSION, "kind": "SandboxClaim",
                "metadata": {"name": name, "namespace": self.ns, "labels": dict(CREATED_BY)}, "spec": spec}

    @active_replica
    async def create_claim(self, req: ClaimRequest) -> Claim:
        if req.snapshot:
            raise NotSupported(NOT_SUPPORTED["snapshot"])
        kind = await self._pool_kind(req.pool)
        name = req.name or f"claim-{secrets.token_hex(5)}"
        with self._subscribe(name) as ev:  # before the create: its first events must not be missed
            created = await self._create_or_existing("claim", self._manifest(name, kind, req), req.pool, self._claim)
            body = await self._wait(created, ev, req.timeout_seconds)
        if (body.get("status") or {}).get("phase") == "Failed":
            raise self._failed(body)
        return self.to_api(body)

    async def _create_or_existing(self, what: str, manifest: dict[str, Any], pool: str,
                                  read: Callable[[str], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Create the claim or batch; a create that meets one of its name (409) is an idempotent retry and answers
        the one that exists, unless that one is for another pool (409 Conflict, naming both)."""
        name = manifest["metadata"]["name"]
        try:
            return await self.ctx.kube.create(manifest)
        except ApiError as exc:
            if status_code(exc) != 409:
                raise _api_error(exc, f"creating {what} {name}") from None
        existing = await read(name)
        ref = (existing.get("spec") or {}).get("poolRef") or {}
        if ref.get("name") != pool:
            raise Conflict(f"{what} {name} exists for {ref.get('kind')} {ref.get('name')!r}, not {pool!r}")
        return existing

    async def _wait(self, created: dict[str, Any], ev: asyncio.Event, timeout: float) -> dict[str, Any]:
        """The claim once it is Bound, Failed or Finished, or as it is when `timeout` runs out. Woken by the
        operator's watch events for this claim; reads the index (kopf updates it before calling the handler)."""
        name, uid = created["metadata"]["name"], created["metadata"]["uid"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        body, seen = created, False
        while True:
            ev.clear()
            current = await self._get("SandboxClaim", name, confirm=False)
            if current is not None and current["metadata"].get("uid") == uid:
                body, seen = current, True
            elif seen:
                raise NotFound(f"claim {name} was deleted while it was being created")
            if (body.get("status") or {}).get("phase") in ("Bound", "Failed", "Finished"):
                return body
            remaining = deadline - loop.time()
            if remaining <= 0:
                return body
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ev.wait(), remaining)

    @active_replica
    async def get_claim(self, name: str) -> Claim:
        return self.to_api(await self._claim(name))

    @active_replica
    async def list_claims(self, pool: str | None = None) -> list[Claim]:
        bodies = await self._list("SandboxClaim")
        if pool is not None:
            bodies = [b for b in bodies if ((b.get("spec") or {}).get("poolRef") or {}).get("name") == pool]
        return sorted((self.to_api(b) for b in bodies), key=lambda c: (c.created, c.name))

    @active_replica
    async def delete_claim(self, name: str) -> None:
        body = await self._claim(name)
        spec, st = body.get("spec") or {}, body.get("status") or {}
        uid = body["metadata"]["uid"]
        policy = (spec.get("lifecycle") or {}).get("shutdownPolicy", "Delete")
        with self._subscribe(name) as ev:
            try:
                if policy == "Retain" and st.get("phase") == "Bound":
                    # The operator's own shutdown path: detach the sandbox (Retain), finish, delete the claim.
                    await self.ctx.kube.patch("SandboxClaim", name, self.ns, {
                        "metadata": {"uid": uid},
                        "spec": {"lifecycle": {"shutdownTime": _iso(datetime.now(UTC)),
                                               "ttlSecondsAfterFinished": 0}}})
                else:
                    await self.ctx.kube.delete("SandboxClaim", name, self.ns, uid=uid,
                                               foreground=policy == "DeleteForeground")
            except ApiError as exc:
                if status_code(exc) in (404, 409):  # gone, or replaced by a new claim of the same name
                    return
                raise _api_error(exc, f"deleting claim {name}") from None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DELETE_GRACE
            while loop.time() < deadline:  # until the claim is gone: woken by its watch events
                ev.clear()
                current = await self._get("SandboxClaim", name, confirm=False)
                if current is None or current["metadata"].get("uid") != uid:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ev.wait(), deadline - loop.time())

    @active_replica
    async def renew_claim(self, name: str, ttl_seconds: int) -> Claim:
        body = await self._claim(name)
        phase = (body.get("status") or {}).get("phase")
        if phase in ("Failed", "Finished"):
            raise Conflict(f"claim {name} is {self.to_api(body).phase}: it cannot be renewed")
        until = _lease_iso(deadlines.lease_end(time.time(), ttl_seconds) or time.time())
        try:
            patched = await self.ctx.kube.patch("SandboxClaim", name, self.ns, {
                "metadata": {"uid": body["metadata"]["uid"]}, "spec": {"lifecycle": {"shutdownTime": until}}})
        except ApiError as exc:
            raise _api_error(exc, f"renewing claim {name}") from None
        return self.to_api(patched)

    @active_replica
    async def pause_claim(self, name: str) -> Claim:
        await self._claim(name)
        raise NotSupported(NOT_SUPPORTED["pause"])

    @active_replica
    async def resume_claim(self, name: str) -> Claim:
        await self._claim(name)
        raise NotSupported(NOT_SUPPORTED["pause"])

    @active_replica
    async def snapshot_claim(self, name: str, req: SnapshotRequest) -> Snapshot:
        await self._claim(name)
        raise NotSupported(NOT_SUPPORTED["snapshot"])

    @active_replica
    async def execd_target(self, name: str) -> ExecdTarget:
        body = await self._claim(name)
        st = body.get("status") or {}
        if st.get("phase") != "Bound" or not (st.get("sandbox") or {}).get("name"):
            raise Conflict(f"claim {name} is {self.to_api(body).phase}, not Ready")
        sandbox_name = st["sandbox"]["name"]
        sandbox = await self._get("Sandbox", sandbox_name)
        if sandbox is None:
            raise Unavailable(f"claim {name}: its sandbox {sandbox_name} is gone")
        m = member_of(sandbox)
        port = int(((sandbox.get("spec") or {}).get("execd") or {}).get("port", wire.PORT))
        pod = self.ctx.cache.pod(self.ns, sandbox_name) if self._ready() else None
        ip = pod.pod_ips[0] if pod is not None and pod.ready and pod.pod_ips else \
            (m.endpoint.rpartition(":")[0] if m.endpoint else None)
        if not m.ready or not ip:
            raise Unavailable(f"claim {name}: sandbox {sandbox_name} is not ready ({m.phase or 'no pod yet'})")
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{port}"
        if pod is None:
            raise Unavailable(f"claim {name}: the pod of sandbox {sandbox_name} is not known yet; retry")
        try:  # the claim's own token, put into execd on first use (a dict lookup after that)
            token = await hand_over(self.ctx, self.ns, sandbox_name, m.uid, pod.uid, url, body["metadata"]["uid"])
        except ExecdUnreachable as exc:
            raise SandboxUnreachable(f"claim {name}: {exc}") from None
        return ExecdTarget(url=url, token=token)

    @active_replica
    async def list_pools(self) -> list[PoolStatus]:
        out = []
        for kind in ("WarmPool", "Pool"):
            for body in await self._list(kind):
                meta, spec = body["metadata"], body.get("spec") or {}
                members = [m for m in await self._members(kind, meta["name"]) if not m.deleting]
                idle = [m for m in members if not m.claim]
                allocated = len(members) - len(idle)
                desired = desired_size(kind, spec, allocated)
                out.append(PoolStatus(name=meta["name"], kind=kind, template=(spec.get("templateRef") or {})
                                      .get("name", ""), desired=desired, ready=sum(1 for m in idle if m.ready),
                                      idle=len(idle), allocated=allocated))
        return sorted(out, key=lambda p: (p.name, p.kind))

    # --- what outlives a claim -------------------------------------------------------------------------------------
    @staticmethod
    def _retained(body: dict[str, Any]) -> RetainedSandbox:
        meta, st = body["metadata"], body.get("status") or {}
        notes, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        return RetainedSandbox(
            name=meta["name"], template=labels.get(L_TEMPLATE, ""), pool=notes.get(A_RETAINED_POOL),
            claim=notes.get(A_RETAINED_FROM), retained_at=_ts(notes.get(A_RETAINED_AT)),
            created=_ts(meta.get("creationTimestamp")),
            state="Deleting" if meta.get("deletionTimestamp") else st.get("phase") or "Pending",
            ready=member_of(body).ready)

    @active_replica
    async def list_retained(self) -> list[RetainedSandbox]:
        found = [self._retained(b) for b in await self._list("Sandbox") if is_retained(b)]
        return sorted(found, key=lambda r: (r.retained_at or r.created or datetime.min.replace(tzinfo=UTC),
                                            r.name))

    @active_replica
    async def delete_retained(self, name: str) -> None:
        body = await self._get("Sandbox", name)
        if body is None or not is_retained(body):
            raise NotFound(f"no retained sandbox named {name!r} in namespace {self.ns}")
        try:  # only that object: a Sandbox of the same name made meanwhile is not retained
            await self.ctx.kube.delete("Sandbox", name, self.ns, uid=body["metadata"]["uid"])
        except ApiError as exc:
            if status_code(exc) in (404, 409):
                return
            raise _api_error(exc, f"deleting sandbox {name}") from None

    @active_replica
    async def list_snapshots(self) -> list[Snapshot]:
        raise NotSupported(NOT_SUPPORTED["snapshot"])

    @active_replica
    async def delete_snapshot(self, ref: str) -> None:
        raise NotSupported(NOT_SUPPORTED["snapshot"])

    # --- batches -----------------------------------------------------------------------------------------------------
    async def _batch(self, name: str) -> dict[str, Any]:
        body = await self._get("SandboxBatch", name)
        if body is None:
            raise NotFound(f"no batch named {name!r} in namespace {self.ns}")
        return body

    def _batch_manifest(self, name: str, kind: str, req: BatchRequest) -> dict[str, Any]:
        t = req.task
        task: dict[str, Any] = {"argv": list(t.argv)} if t.argv is not None else {"command": t.command}
        if t.env:
            task["env"] = [{"name": k, "value": v} for k, v in t.env.items()]
        if t.working_dir:
            task["workingDir"] = t.working_dir
        if t.timeout_seconds:
            task["timeoutSeconds"] = t.timeout_seconds
        lifecycle: dict[str, Any] = {"shutdownPolicy": req.shutdown_policy}
        if req.ttl_seconds_after_finished is not None:
            lifecycle["ttlSecondsAfterFinished"] = req.ttl_seconds_after_finished
        return {"apiVersion": API_VERSION, "kind": "SandboxBatch",
                "metadata": {"name": name, "namespace": self.ns, "labels": dict(CREATED_BY)},
                "spec": {"poolRef": {"kind": kind, "name": req.pool}, "replicas": req.replicas, "task": task,
                         "lifecycle": lifecycle}}

    def to_batch(self, body: dict[str, Any], outputs: dict[int, Tail] | None = None) -> Batch:
        """The API's view of a SandboxBatch; `outputs` by index for the ended ones (None: results without)."""
        meta, spec, st = body["metadata"], body.get("spec") or {}, body.get("status") or {}
        ref, lifecycle = spec.get("poolRef") or {}, spec.get("lifecycle") or {}
        replicas = int(spec.get("replicas") or st.get("replicas") or 0)
        entries = {int(e.get("index", -1)): e for e in st.get("indexes") or []}
        results = []
        for i in range(replicas):
            e = entries.get(i) or {}
            tail = (outputs or {}).get(i)
            results.append(BatchTaskResult(
                index=i, sandbox=e.get("sandbox"), launch_type=vocab.api_launch_type(e.get("launchType")),
                phase=e["phase"] if e.get("phase") in batchrules.INDEX_PHASES else "Pending",
                exit_code=e.get("exitCode"), reason=e.get("reason"), message=e.get("message"),
                output=tail.text if tail else None, output_truncated=bool(tail and tail.truncated)))
        phase: BatchPhase = st["phase"] if st.get("phase") in batchrules.BATCH_PHASES else "Pending"
        failed, ready = _condition(st, "Failed"), _condition(st, "Ready")
        message = (failed.get("message") if failed.get("status") == "True" else None) or \
            (ready.get("message") if ready.get("status") == "False" else None)
        return Batch(
            name=meta["name"], pool=ref.get("name", ""), pool_kind=ref.get("kind", "WarmPool"), phase=phase,
            replicas=replicas, bound=int(st.get("bound") or 0), running=int(st.get("running") or 0),
            succeeded=int(st.get("succeeded") or 0), failed=int(st.get("failed") or 0),
            created=_ts(meta.get("creationTimestamp")) or datetime.now(UTC), started_at=_ts(st.get("startTime")),
            finished_at=_ts(st.get("completionTime")),
            shutdown_policy="Retain" if lifecycle.get("shutdownPolicy") == "Retain" else "Delete",
            message=message or None, results=results)

    async def _outputs(self, body: dict[str, Any]) -> dict[int, Tail]:
        """The output tails of the batch's ended indexes: kept by the operator when each ended, else read from the
        sandbox's execd while it is still there (bounded: OUTPUT_READS at a time; kept once read)."""
        uid, name = body["metadata"]["uid"], body["metadata"]["name"]
        store = self.ctx.batches.outputs
        found: dict[int, Tail] = {}
        missing = []
        for e in (body.get("status") or {}).get("indexes") or []:
            if e.get("phase") not in batchrules.INDEX_ENDED:
                continue
            index = int(e.get("index", -1))
            if (tail := store.get(uid, index)) is not None:
                found[index] = tail
            elif e.get("sandbox") and e.get("commandId"):
                missing.append((index, e["sandbox"], e["commandId"]))

        async def read(index: int, sandbox: str, command_id: str) -> None:
            target = await self._sandbox_target(sandbox, uid, f"batch {name}")
            if target is None:
                return
            async with self._reads:
                tail = await output_tail(self.ctx, target.url, target.token, command_id)
            if tail is not None:
                store.put(uid, index, tail)
                found[index] = tail

        if missing and self._ready():
            await asyncio.gather(*(read(*m) for m in missing))
        return found

    async def _sandbox_target(self, sandbox: str, owner_uid: str, what: str) -> ExecdTarget | None:
        """Where a batch sandbox's execd answers, with the batch's token; None if it is gone or not ready."""
        body = self.ctx.cache.sandbox(self.ns, sandbox)
        pod = self.ctx.cache.pod(self.ns, sandbox)
        if body is None or pod is None or not pod.ready or not pod.pod_ips:
            return None
        m = member_of(body)
        if m.deleting or not m.ready:
            return None
        port = int(((body.get("spec") or {}).get("execd") or {}).get("port", wire.PORT))
        ip = pod.pod_ips[0]
        url = f"http://{f'[{ip}]' if ':' in ip else ip}:{port}"
        try:
            token = await hand_over(self.ctx, self.ns, sandbox, m.uid, pod.uid, url, owner_uid)
        except ExecdUnreachable as exc:
            log.info("%s: sandbox %s: %s", what, sandbox, exc)
            return None
        return ExecdTarget(url=url, token=token)

    @active_replica
    async def create_batch(self, req: BatchRequest) -> Batch:
        kind = await self._pool_kind(req.pool)
        name = req.name or f"batch-{secrets.token_hex(5)}"
        created = await self._create_or_existing("batch", self._batch_manifest(name, kind, req), req.pool,
                                                 self._batch)
        return self.to_batch(created)

    @active_replica
    async def get_batch(self, name: str) -> Batch:
        body = await self._batch(name)
        return self.to_batch(body, await self._outputs(body))

    @active_replica
    async def list_batches(self, pool: str | None = None) -> list[Batch]:
        bodies = await self._list("SandboxBatch")
        if pool is not None:
            bodies = [b for b in bodies if ((b.get("spec") or {}).get("poolRef") or {}).get("name") == pool]
        return sorted((self.to_batch(b) for b in bodies), key=lambda b: (b.created, b.name))

    @active_replica
    async def delete_batch(self, name: str) -> None:
        body = await self._batch(name)
        uid = body["metadata"]["uid"]
        with self._subscribe(name, "SandboxBatch") as ev:
            try:
                await self.ctx.kube.delete("SandboxBatch", name, self.ns, uid=uid)
            except ApiError as exc:
                if status_code(exc) in (404, 409):  # gone, or replaced by a new batch of the same name
                    return
                raise _api_error(exc, f"deleting batch {name}") from None
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DELETE_GRACE
            while loop.time() < deadline:  # until it is gone: woken by its watch events
                ev.clear()
                current = await self._get("SandboxBatch", name, confirm=False)
                if current is None or current["metadata"].get("uid") != uid:
                    return
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ev.wait(), deadline - loop.time())

    async def watch_batch(self, name: str) -> AsyncIterator[Batch]:
        """The batch now and after each of its watch events that changed it (its resourceVersion), until it is
        finished; reads the index (kopf updates it before the event handler wakes this; a miss: one direct read)."""
        with self._subscribe(name, "SandboxBatch") as ev:
            self._active()
            body = await self._batch(name)
            uid, seen = body["metadata"]["uid"], None
            while True:
                ev.clear()
                if seen is not None:
                    # A miss is confirmed by one read: the first state may have come from the server before the
                    # watch brought the new batch into the index (it is not deleted, only not seen yet).
                    current = await self._get("SandboxBatch", name)
                    if current is None or current["metadata"].get("uid") != uid:
                        raise NotFound(f"batch {name} was deleted")
                    body = current
                version = body["metadata"].get("resourceVersion")
                if version != seen:
                    seen = version
                    batch = self.to_batch(body, await self._outputs(body))
                    yield batch
                    if batch.finished:
                        return
                    continue  # events that came meanwhile: look again before waiting
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ev.wait(), WATCH_CHECK)
                self._active()

    def _active(self) -> None:
        if not self.ctx.leadership.active:
            raise Unavailable(f"this operator replica is on standby (kopf peering {self.ctx.leadership.peering!r}): "
                              "retry; the claims API Service routes to the active replica")
