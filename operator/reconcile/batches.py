"""SandboxBatch: bind `replicas` sandboxes the way claims are bound (warm adoption first, with the claims' adoption
write; cold starts for the rest, a Pool's within its poolMax), run the task in each (batchtasks.py) and keep the
status: one entry per index, the counts, the phase (corral.operator.core.batches).

A batch's sandbox carries the claim label `<batch>_<index>` (core.batches.claim_label): every pool rule treats it as
taken, and the cache finds it by that label. The batch's uid is its claim uid (the sandbox's execd token derives from
it). Status writes carry every change since the last one: the followers only mark the batch (batchtasks.mark).

Every status write is conditional on the resourceVersion of the batch its entries are built on (the one they were
loaded from, this process's own last write's, or the one read after a conflict; never the cache's newer one, which
may carry another replica's entries not merged in): no conflict with itself, no write more on the normal path. Two
replicas acting on one batch at once (a shard changing hands, corral.operator.shards) may each adopt a different
sandbox for one index (each adoption is conditional on the sandbox's version only); the status write settles it.
The one that gets a 409 reads the batch once and takes the status's entries over its own (`settle_indexes`): an index
the status already gives a sandbox keeps that one, and the sandbox this replica took for it is deleted (its task
follower stopped), as a claim's `_lost_bind` does; then it writes again over the version read. A task is started only
once the status names its sandbox (`reconcile_batch` writes before it starts new followers), so a lost sandbox never
ran one. A sandbox still labelled for an index whose recorded sandbox is another (the loser died before deleting it)
is deleted by the next reconcile (`_check_indexes`).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import time
from typing import Any

from corral.api import CorralValidationError, SandboxBatchSpec, SandboxTemplateSpec, validate

from ..batchbook import BatchState
from ..builders import owner_ref, sandbox_labels, sandbox_manifest
from ..cache import _ts
from ..constants import A_CLAIM_UID, A_LAUNCH, L_CLAIM
from ..context import Context
from ..core import batches as b
from ..core import lifecycle, metrics
from ..core import vocabulary as v
from ..kube import ignore, status_code
from ..metrics import lost_bind
from ..planning import Member, adoption_candidates
from .batchtasks import follow
from .conditions import now_iso, set_condition

log = logging.getLogger("corral.operator.batch")

READY = "Ready"  # the batch's condition: all its indexes have a sandbox (False: why not yet)
CREATE_CONCURRENCY = 16


async def reconcile_batch(ctx: Context, ns: str, name: str) -> None:
    book = ctx.batches
    body = ctx.cache.batch(ns, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        book.forget(ns, name)
        # Binds whose labelled sandbox event never came (the sandbox went first) would otherwise stay forever.
        for key in [k for k in ctx.claims.bound if k[0] == ns and (b.parse_claim_label(k[1]) or ("",))[0] == name]:
            ctx.claims.claim_gone(*key)
        return
    ctx.cancel_at("SandboxBatch", ns, name)
    meta, status = body["metadata"], body.get("status") or {}
    st = book.state(ns, name)
    try:
        spec = validate(SandboxBatchSpec, body["spec"])
        if problem := b.name_problem(name):
            raise CorralValidationError("SandboxBatch", [("metadata.name", problem)])
    except CorralValidationError as exc:
        if status.get("phase") not in b.FINAL_BATCH_PHASES:
            st.conditions = set_condition(status.get("conditions"), v.FAILED, True, v.R_INVALID_SPEC, str(exc),
                                          meta.get("generation"))
            async with st.lock:
                await _write(ctx, body, st, v.FAILED)
        return
    if st.indexes is None:
        st.indexes = _load(status.get("indexes"), spec.replicas)
        st.rv = str(meta.get("resourceVersion") or "")
        st.conditions = list(status.get("conditions") or [])
        st.pool = spec.pool_ref.name
        st.ended_counted = {e["index"] for e in st.indexes if e["phase"] in b.INDEX_ENDED}
        st.final_counted = status.get("phase") in b.FINAL_BATCH_PHASES
    if status.get("phase") in b.FINAL_BATCH_PHASES and st.written is None:
        await _after_finish(ctx, body, spec, st)  # finished before this process started: only its TTL is left
        return

    named = [e.get("sandbox") for e in st.indexes]
    pending = await _check_indexes(ctx, body, spec, st)
    if pending:
        await _bind(ctx, body, spec, st, pending)
    phase = None
    if st.flush_at is None or named != [e.get("sandbox") for e in st.indexes]:
        # The status names each new sandbox before a task starts in it: another replica's write may have won
        # the index meanwhile (then this one's sandbox is given up, see the module docstring). Otherwise a follower's
        # write is due (batchtasks.mark): it carries this too, and asks for the next reconcile.
        async with st.lock:
            phase = await _write(ctx, body, st)
    if spec.task is not None and book.states.get((ns, name)) is st:  # (forgotten meanwhile: the shard went)
        for entry in st.indexes:
            i = entry["index"]
            if entry["phase"] not in (b.BOUND, b.RUNNING) or st.following(i):
                continue
            m = _named(ctx, ns, name, entry)
            if m is not None and not m.deleting and (m.ready or entry.get("commandId")):
                st.followers[i] = asyncio.create_task(follow(ctx, st, ns, name, meta["uid"], i, spec.task),
                                                      name=f"corral-batch-{ns}-{name}-{i}")
    if phase in b.FINAL_BATCH_PHASES:
        await _after_finish(ctx, body, spec, st)


async def flush(ctx: Context, ns: str, name: str) -> None:
    """The status write the followers asked for (batchtasks.mark); the queue's reconcile does the rest (an ended
    index's sandbox, the TTL)."""
    st = ctx.batches.states.get((ns, name))
    if st is None:
        return
    st.flush_at = None
    body = ctx.cache.batch(ns, name)
    if body is None or st.indexes is None:
        return
    try:
        async with st.lock:
            phase = await _write(ctx, body, st)
    except Exception as exc:  # noqa: BLE001 - the queue's reconcile writes it instead (and retries with backoff)
        log.warning("batch %s/%s: status write failed (%s); the reconcile retries", ns, name, exc)
        phase = ""
    if phase in b.FINAL_BATCH_PHASES or phase == "" or any(e["phase"] in b.INDEX_ENDED for e in st.indexes):
        ctx.request("SandboxBatch", ns, name)


def _load(entries: list[dict[str, Any]] | None, replicas: int) -> list[dict[str, Any]]:
    """The per-index entries from the status (a fresh list for a new batch), one per index, in order."""
    by_index = {e.get("index"): dict(e) for e in entries or []}
    return [by_index.get(i) or {"index": i, "phase": v.PENDING} for i in range(replicas)]


async def _check_indexes(ctx: Context, body: dict[str, Any], spec: SandboxBatchSpec, st: BatchState) -> list[int]:
    """Bring each entry up to date with its sandbox; fail the indexes whose sandbox was lost; release the sandboxes of
    ended tasks (shutdownPolicy). Returns the indexes that still need a sandbox."""
    assert st.indexes is not None
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    recorded = _recorded(body, st)
    pending = []
    for entry in st.indexes:
        i = entry["index"]
        label = b.claim_label(name, i)
        m = _named(ctx, ns, name, entry)
        if m is not None:
            ctx.bound.pop((ns, label), None)
            if entry.get("sandbox") and entry["sandbox"] == recorded.get(i):
                await _drop_extras(ctx, ns, label, m)
        if entry["phase"] in b.INDEX_ENDED:
            policy = spec.lifecycle.shutdown_policy
            if m is not None and not m.deleting and policy != "Retain" and i not in st.reading:
                await ignore({404}, ctx.kube.delete("Sandbox", m.name, ns, foreground=policy == "DeleteForeground"))
            continue
        if m is None and (ns, label) in ctx.bound:
            continue  # our own adoption or create, not in the cache yet
        if m is None or m.deleting or entry.get("sandbox") not in (None, m.name):
            if m is None and entry.get("sandbox") and await _still_there(ctx, ns, entry["sandbox"], label):
                # The cache is behind: another replica's sandbox, taken over from the status (`_settle`), or a
                # re-listing sandbox stream. Its labelled event brings the batch back; look again soon regardless.
                ctx.request_at("SandboxBatch", ns, name, time.time() + 1.0)
                continue
            if entry.get("sandbox"):
                st.cancel(i)
                entry.update(phase=v.FAILED, reason=v.R_SANDBOX_LOST,
                             message=f"sandbox {entry['sandbox']} was deleted before the task ended")
            elif m is None:
                pending.append(i)
            continue
        if not entry.get("sandbox"):
            entry.update(sandbox=m.name, launchType=m.launch_type or v.COLD, phase=b.BOUND)
    return pending


async def _bind(ctx: Context, body: dict[str, Any], spec: SandboxBatchSpec, st: BatchState, pending: list[int]) -> None:
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    kind, pool_name = spec.pool_ref.kind, spec.pool_ref.name
    ctx.claim_decided(kind, ns, pool_name)  # the pool's refill waits for the quiet moment after the binding
    pool = ctx.cache.pool_of_kind(ns, kind, pool_name)
    template = ctx.cache.template(ns, pool["spec"]["templateRef"]["name"]) if pool else None
    if pool is None or template is None:
        what = f"{kind} {pool_name!r}" if pool is None else f"SandboxTemplate {pool['spec']['templateRef']['name']!r}"
        _waiting(st, meta, v.R_POOL_NOT_FOUND if pool is None else v.R_TEMPLATE_NOT_FOUND,
                 f"{what} does not exist in {ns}; waiting for it")
        ctx.batches.wait_for_pool(kind, ns, pool_name, name)
        return
    try:
        tspec, bp_hash = ctx.template_spec(template)
    except CorralValidationError as exc:
        _waiting(st, meta, v.R_INVALID_TEMPLATE, str(exc))
        ctx.batches.wait_for_pool(kind, ns, pool_name, name)
        return
    assert st.indexes is not None
    left = await _adopt_all(ctx, body, st, kind, pool_name, bp_hash, list(pending))
    if left and kind == "WarmPool":
        await _cold(ctx, body, st, pool, template, tspec, bp_hash, left)
    elif left:
        async with ctx.pool_lock(ns, pool_name):
            members = ctx.cache.members(ns, "Pool", pool_name)
            in_flight = ctx.creates.outstanding(("Pool", ns, pool_name), {m.name for m in members})
            pool_max = int((pool["spec"].get("capacity") or {}).get("poolMax", 10))
            room = max(0, pool_max - len(members) - in_flight)
            made = await _cold(ctx, body, st, pool, template, tspec, bp_hash, left[:room])
            for sandbox in made:
                ctx.creates.expect(("Pool", ns, pool_name), sandbox)
        if len(left) > room:
            _waiting(st, meta, v.R_POOL_EXHAUSTED,
                     f"Pool {pool_name} is at poolMax ({pool_max}); {len(left) - room} indexes wait for room")
            ctx.batches.wait_for_pool(kind, ns, pool_name, name)
            return
    if any(e["phase"] == v.PENDING for e in st.indexes):
        return
    st.conditions = set_condition(st.conditions, READY, True, v.R_BOUND, "every index has a sandbox",
                                  meta.get("generation"))


def _named(ctx: Context, ns: str, batch: str, entry: dict[str, Any]) -> Member | None:
    """The sandbox of an index as the cache shows it: the one its entry names; for an entry naming none, the oldest
    labelled for it (not being deleted, if there is one)."""
    found = ctx.cache.claim_sandboxes(ns, b.claim_label(batch, entry["index"]))
    if entry.get("sandbox"):
        return next((m for m in found if m.name == entry["sandbox"]), None)
    if not found:
        return None
    return min(found, key=lambda m: (m.deleting, m.created))


async def _still_there(ctx: Context, ns: str, sandbox: str, label: str) -> bool:
    """Whether the index's sandbox exists (not being deleted, still labelled for it), asked of the API server: one
    read, only on the rare path where the cache has no such sandbox, before an index is failed for good."""
    try:
        obj = await ctx.kube.get("Sandbox", sandbox, ns)
    except Exception as exc:  # noqa: BLE001 - 404 is the answer; anything else: don't fail the index on a hunch
        return status_code(exc) != 404
    meta = obj.get("metadata") or {}
    return not meta.get("deletionTimestamp") and (meta.get("labels") or {}).get(L_CLAIM) == label


def _recorded(body: dict[str, Any], st: BatchState) -> dict[int, str]:
    """index -> the sandbox the batch's status names for it: as the cache shows the status, or as this process last
    wrote it (its echo may not have come yet)."""
    out: dict[int, str] = {}
    for status in ((body.get("status") or {}), st.written or {}):
        for e in status.get("indexes") or []:
            if e.get("sandbox"):
                out[e["index"]] = e["sandbox"]
    return out


async def _drop_extras(ctx: Context, ns: str, label: str, keep: Member) -> None:
    """Any sandbox labelled for an index besides the one its status names is deleted (conditional on its uid). There
    is one only when two replicas acted on the batch at once and the one whose status write lost died (or failed)
    before deleting what it took."""
    for m in ctx.cache.claim_sandboxes(ns, label):
        if m.name != keep.name and not m.deleting:
            log.warning("batch index %s/%s has sandbox %s; deleting sandbox %s also labelled for it", ns, label,
                        keep.name, m.name)
            lost_bind(m.uid)
            await ignore({404, 409}, ctx.kube.delete("Sandbox", m.name, ns, uid=m.uid or None))


def _waiting(st: BatchState, meta: dict[str, Any], reason: str, message: str) -> None:
    st.conditions = set_condition(st.conditions, READY, False, reason, message, meta.get("generation"))


async def _adopt_all(ctx: Context, body: dict[str, Any], st: BatchState, kind: str, pool: str, bp_hash: str,
                     pending: list[int]) -> list[int]:
    """Warm adoption for as many pending indexes as the pool has ready sandboxes: the claims' adoption write (one
    patch conditional on the sandbox's resourceVersion, reconcile/claims.py), CREATE_CONCURRENCY at a time. A
    sandbox taken meanwhile (409) sends its index to the next candidate. Returns the indexes still without one."""
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    assert st.indexes is not None
    entries = st.indexes
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)
    left, adopted = list(pending), 0
    while left:
        reserved = {n for (rns, n) in ctx.reserved if rns == ns}
        candidates = list(itertools.islice(adoption_candidates(ctx.cache.members(ns, kind, pool), bp_hash, reserved),
                                           len(left)))
        if not candidates:
            break
        pairs = list(zip(left, candidates, strict=False))
        for i, m in pairs:  # reserved before any write goes out: no other claim or batch tries them meanwhile
            ctx.reserved[(ns, m.name)] = (ns, b.claim_label(name, i))

        async def one(i: int, m: Member) -> bool:
            async with limit:
                return await _adopt(ctx, body, kind, m, b.claim_label(name, i))

        taken = await asyncio.gather(*(one(i, m) for i, m in pairs))
        for (i, m), ok in zip(pairs, taken, strict=True):
            if ok:
                adopted += 1
                entries[i].update(sandbox=m.name, launchType=v.WARM, phase=b.BOUND)
                st.taken[m.name] = m.uid
        left = [i for (i, _), ok in zip(pairs, taken, strict=True) if not ok] + left[len(pairs):]
        if all(not ok for ok in taken):
            break
    if adopted and kind == "WarmPool":
        ctx.request(kind, ns, pool)  # replenish now, without waiting for the watch events
    return left


async def _adopt(ctx: Context, body: dict[str, Any], kind: str, m: Member, label: str) -> bool:
    """One warm adoption (the sandbox is already reserved for `label`); False if it was taken or went meanwhile."""
    meta = body["metadata"]
    ns = meta["namespace"]
    patch: dict[str, Any] = {"metadata": {
        "resourceVersion": m.resource_version,
        "labels": {L_CLAIM: label},
        "annotations": {A_LAUNCH: v.WARM, A_CLAIM_UID: meta["uid"]},
    }}
    if kind == "WarmPool":  # the batch owns it from now on: deleting the batch deletes the sandbox
        patch["metadata"]["ownerReferences"] = [owner_ref(body)]
    try:
        await ctx.kube.patch("Sandbox", m.name, ns, patch)
    except Exception as exc:  # noqa: BLE001
        ctx.reserved.pop((ns, m.name), None)
        if status_code(exc) in (404, 409, 422):
            return False
        raise
    ctx.bound[(ns, label)] = m.name
    return True


async def _cold(ctx: Context, body: dict[str, Any], st: BatchState, pool: dict[str, Any], template: dict[str, Any],
                tspec: SandboxTemplateSpec, bp_hash: str, indexes: list[int]) -> list[str]:
    """Create a sandbox for each index (at most CREATE_CONCURRENCY at once); returns the names created."""
    meta = body["metadata"]
    ns, name = meta["namespace"], meta["name"]
    kind = pool["kind"]
    tname = template["metadata"]["name"]
    limit = asyncio.Semaphore(CREATE_CONCURRENCY)
    assert st.indexes is not None
    entries = st.indexes

    async def one(i: int) -> str | None:
        label = b.claim_label(name, i)
        if kind == "Pool":
            labels = sandbox_labels(tname, pool=pool["metadata"]["name"], pool_kind="Pool", claim=label,
                                    bp_hash=bp_hash)
            owner = owner_ref(pool)
        else:
            labels = sandbox_labels(tname, claim=label, bp_hash=bp_hash)
            owner = owner_ref(body)
        sandbox = f"{name[:50]}-{meta['uid'][:5]}-{i}"
        manifest = sandbox_manifest(name=sandbox, namespace=ns, template_name=tname,
                                    blueprint=copy.deepcopy(template["spec"]), labels=labels, owner=owner,
                                    annotations={A_LAUNCH: v.COLD, A_CLAIM_UID: meta["uid"]})
        async with limit:
            try:
                created = await ignore({409}, ctx.kube.create(manifest))
            except Exception as exc:  # noqa: BLE001 - this index fails, the others go on
                if status_code(exc) is None or status_code(exc) in (429,) or (status_code(exc) or 0) >= 500:
                    raise
                entries[i].update(phase=v.FAILED, reason=v.R_START_FAILED,
                                  message=f"could not create sandbox {sandbox}: {exc}")
                return None
        ctx.bound[(ns, label)] = sandbox
        entries[i].update(sandbox=sandbox, launchType=v.COLD, phase=b.BOUND)
        if created:  # (a 409: another replica made this very sandbox for this index, by its name)
            st.taken[sandbox] = created["metadata"].get("uid", "")
        return sandbox

    made = await asyncio.gather(*(one(i) for i in indexes))
    return [s for s in made if s]


async def _write(ctx: Context, body: dict[str, Any], st: BatchState, phase: str | None = None) -> str:
    """Write the status if it differs from what this process last wrote (or, first, from what the server holds);
    returns the batch's phase. The write is conditional on the version of the batch the entries are built on
    (BatchState.rv); on a 409 the batch is read once, its status's entries taken over this process's (`_settle`),
    and the write made again over the version read, if there is still something to write."""
    meta, status = body["metadata"], body.get("status") or {}
    ns, name = meta["namespace"], meta["name"]
    forced = phase
    phase, desired = _desired(ctx, body, st, forced)
    if desired == st.written:
        return phase
    _account(meta, st, phase)
    if st.written is None and all(status.get(k) == x for k, x in desired.items()):
        st.written = desired  # a restarted process: the server already holds this
        return phase
    rv = st.rv or str(meta.get("resourceVersion") or "")
    for attempt in range(4):
        _times(st, status, phase)
        try:
            written = await ctx.kube.patch("SandboxBatch", name, ns, {
                "metadata": {"resourceVersion": rv}, "status": {**desired, **st.times}}, status=True)
            break
        except Exception as exc:  # noqa: BLE001
            if status_code(exc) != 409 or attempt == 3:
                raise
        fresh = await ctx.kube.get("SandboxBatch", name, ns)
        if fresh["metadata"].get("uid") != meta.get("uid"):
            return phase  # deleted (and made again under its name): its deletion event forgets this state
        rv = st.rv = str(fresh["metadata"].get("resourceVersion") or "")
        status = fresh.get("status") or {}
        await _settle(ctx, ns, name, st, status.get("indexes") or [])
        phase, desired = _desired(ctx, body, st, forced)
        _account(meta, st, phase)
        if all(status.get(k) == x for k, x in desired.items()):
            st.written = desired  # what this process had to say is there (another replica wrote it)
            return phase
    st.rv = str(((written or {}).get("metadata") or {}).get("resourceVersion") or "")
    st.written, st.written_at = desired, time.monotonic()
    for e in desired["indexes"]:
        st.taken.pop(e.get("sandbox") or "", None)  # recorded: the index is this sandbox's for good
    if phase != (status.get("phase") if st.logged is None else st.logged):
        st.logged = phase
        log.info("batch %s/%s %s: %d bound, %d running, %d succeeded, %d failed", ns, name, phase, desired["bound"],
                 desired["running"], desired["succeeded"], desired["failed"])
    return phase


def _desired(ctx: Context, body: dict[str, Any], st: BatchState, phase: str | None) -> tuple[str, dict[str, Any]]:
    """The batch's phase (`phase` if given) and the status this process holds for it (its times apart)."""
    spec = body["spec"]
    replicas = int(spec.get("replicas") or 0)
    entries = st.indexes or []
    counts = b.count(entries)
    if phase is None:
        phase = b.batch_phase(replicas, spec.get("task") is not None, counts)
        if phase in b.FINAL_BATCH_PHASES and _releasing(ctx, body, entries):
            phase = b.RUNNING  # DeleteForeground: finished once the ended tasks' sandboxes are gone
    return phase, {
        "phase": phase, "replicas": replicas, "bound": counts.bound, "running": counts.running,
        "succeeded": counts.succeeded, "failed": counts.failed, "indexes": [dict(e) for e in entries],
        "observedGeneration": body["metadata"].get("generation"), "conditions": st.conditions,
    }


def _times(st: BatchState, status: dict[str, Any], phase: str) -> None:
    """startTime and completionTime: as the status has them, else as this process set them, else now."""
    times = {"startTime": status.get("startTime") or st.times.get("startTime"),
             "completionTime": status.get("completionTime") or st.times.get("completionTime")}
    if phase != v.PENDING and not times["startTime"]:
        times["startTime"] = now_iso()
    if phase in b.FINAL_BATCH_PHASES and not times["completionTime"]:
        times["completionTime"] = now_iso()
    st.times = {k: t for k, t in times.items() if t}


def settle_indexes(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """This process's entries (`mine`, changed in place) after reading the status (`theirs`) that another writer
    wrote meantime: an index the status gives a sandbox has that one (this process's own for it, if another, is
    lost: returned as (index, sandbox)); an index the status leaves without one keeps this process's sandbox; an
    index with the same sandbox (or none) on both sides takes the entry further along (Pending < Bound < Running <
    ended), this process's on a tie."""
    by_index = {e.get("index"): e for e in theirs}
    lost: list[tuple[int, str]] = []
    for entry in mine:
        other = by_index.get(entry["index"])
        if other is None:
            continue
        ours, their = entry.get("sandbox"), other.get("sandbox")
        if their and ours != their:
            if ours:
                lost.append((entry["index"], ours))
        elif ours and not their:
            continue
        elif _rank(other) <= _rank(entry):
            continue
        entry.clear()
        entry.update(copy.deepcopy(other))
    return lost


def _rank(entry: dict[str, Any]) -> int:
    return {v.PENDING: 0, b.BOUND: 1, b.RUNNING: 2}.get(entry.get("phase") or v.PENDING, 3)


async def _settle(ctx: Context, ns: str, batch: str, st: BatchState, theirs: list[dict[str, Any]]) -> None:
    """Take the status's entries over this process's (`settle_indexes`); each sandbox this process took for an index
    the status gives another is deleted (conditional on its uid), its task follower stopped: like a claim's
    `_lost_bind`."""
    if st.indexes is None:
        return  # (an invalid spec: no entries to settle)
    for i, sandbox in settle_indexes(st.indexes, theirs):
        label = b.claim_label(batch, i)
        winner = st.indexes[i]["sandbox"]
        log.warning("batch %s/%s index %d was given sandbox %s by another replica meanwhile; deleting sandbox %s "
                    "taken for it", ns, batch, i, winner, sandbox)
        st.cancel(i)
        labelled = {m.name: m for m in ctx.cache.claim_sandboxes(ns, label)}
        uid = st.taken.pop(sandbox, None) or (labelled[sandbox].uid if sandbox in labelled else None)
        lost_bind(uid)
        ctx.reserved.pop((ns, sandbox), None)
        if ctx.bound.get((ns, label)) == sandbox:
            del ctx.bound[(ns, label)]  # the winner's may not be in the cache yet: see _check_indexes
        await ignore({404, 409}, ctx.kube.delete("Sandbox", sandbox, ns, uid=uid or None))


def _releasing(ctx: Context, body: dict[str, Any], entries: list[dict[str, Any]]) -> bool:
    """Whether a batch with shutdownPolicy DeleteForeground still has the sandbox of an ended task (being deleted, or
    about to be): its final phase waits for them (their deletion events bring the batch's reconcile back)."""
    if ((body["spec"].get("lifecycle") or {}).get("shutdownPolicy")) != "DeleteForeground":
        return False
    ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
    return any(e["phase"] in b.INDEX_ENDED and ctx.cache.claim_sandbox(ns, b.claim_label(name, e["index"])) is not None
               for e in entries)


def _account(meta: dict[str, Any], st: BatchState, phase: str) -> None:
    """The batch metrics (core.metrics) for what changed since the last count."""
    delta = 0
    for e in st.indexes or []:
        i, index_phase = e["index"], e["phase"]
        if index_phase == b.RUNNING and i not in st.running_counted:
            st.running_counted.add(i)
            delta += 1
        elif index_phase != b.RUNNING and i in st.running_counted:
            st.running_counted.discard(i)
            delta -= 1
        if index_phase in b.INDEX_ENDED and i not in st.ended_counted:
            st.ended_counted.add(i)
            metrics.batch_task_ended(st.pool, e.get("reason") or "")
    metrics.batch_tasks_running(meta["namespace"], st.pool, delta)
    if phase in b.FINAL_BATCH_PHASES and not st.final_counted:
        st.final_counted = True
        metrics.batch_finished(st.pool, phase, time.time() - _ts(meta.get("creationTimestamp")))


async def _after_finish(ctx: Context, body: dict[str, Any], spec: SandboxBatchSpec, st: BatchState) -> None:
    ttl = spec.lifecycle.ttl_seconds_after_finished
    if ttl is None:
        return
    meta = body["metadata"]
    finished = _ts(st.times.get("completionTime") or (body.get("status") or {}).get("completionTime")) or time.time()
    expiry = lifecycle.finished_expiry(finished, ttl)
    if lifecycle.due(expiry, time.time()):
        log.info("batch %s/%s: ttlSecondsAfterFinished passed; deleting", meta["namespace"], meta["name"])
        await ignore({404, 409}, ctx.kube.delete("SandboxBatch", meta["name"], meta["namespace"], uid=meta["uid"]))
    elif expiry is not None:
        ctx.request_at("SandboxBatch", meta["namespace"], meta["name"], expiry)
