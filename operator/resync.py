"""A replica resuming from a peering pause checks kopf's indices against the API server before it acts again.

Only kopf's kinds (templates, pools, batches) need it: the hot kinds' informers (corral.operator.informer) keep
watching on a standby, so their stores are current at takeover. kopf closes a paused replica's watch streams and,
on resume, lists each kind again, one stream at a time. Two things follow that kopf does not handle:
- until every stream has re-listed, the indices are a partial view (a claim without its pool, a pool without its
  sandboxes), and a reconcile on it can decide wrongly (create sandboxes a pool already has);
- an object deleted during the pause never produces a DELETED event, so it stays in the indices for good: a ghost (a
  WarmPool counting a deleted idle sandbox stays one short; a Pool counts a deleted allocation against poolMax).

So the work queue is held while the replica stands by (nothing it had queued or timed runs meanwhile), and on resume:
1. each of kopf's kinds is listed once (four LIST calls per takeover, never in a loop);
2. the queue waits until kopf's indices hold every listed object (the re-list has caught up; bounded);
3. ghosts are hidden: what the indices still hold that the server did not list, unless newer than the listing;
4. the queue is released, and every object gets a reconcile, so nothing decided on the old view stands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from .cache import uid_of
from .context import Context

log = logging.getLogger("corral.operator.resync")

# what kopf indexes (handlers.py), as listed from the server (label selectors: none)
INDEXED: dict[str, dict[str, str | None]] = {"SandboxTemplate": {}, "WarmPool": {}, "Pool": {}, "SandboxBatch": {}}
RECONCILED = ("SandboxTemplate", "WarmPool", "Pool", "SandboxClaim", "Sandbox", "SandboxBatch")


def _rv(obj: Any) -> int:
    rv = obj.resource_version if hasattr(obj, "resource_version") else \
        (obj.get("metadata") or {}).get("resourceVersion", "")
    return int(rv) if str(rv).isdigit() else 0


async def kopf_caught_up(ctx: Context, catch_up: float) -> tuple[dict[str, tuple[set[str], int]], dict[str, int]]:
    """List each of kopf's kinds once, then wait until kopf's indices hold every listed object. An object deleted
    after our listing may never reach them: a kind still missing objects is listed again every 2 s (bounded by
    `catch_up`; at startup and takeover only). Returns the listings (uids, version) and what is still missing."""
    listed: dict[str, tuple[set[str], int]] = {}

    async def list_kind(kind: str) -> None:
        items, rv = await ctx.kube.list_all(kind, INDEXED[kind])
        listed[kind] = ({o["metadata"]["uid"] for o in items}, rv)

    for kind in INDEXED:
        await list_kind(kind)
    deadline, relist = time.monotonic() + catch_up, time.monotonic() + 2
    while True:
        missing = {kind: len(uids - {uid_of(v) for v in ctx.cache.all_objects(kind)})
                   for kind, (uids, _) in listed.items()}
        if not any(missing.values()) or time.monotonic() > deadline:
            return listed, missing
        if time.monotonic() > relist:
            for kind in [k for k, n in missing.items() if n]:
                await list_kind(kind)
            relist = time.monotonic() + 2
        await asyncio.sleep(0.05)


async def kopf_indices_complete(ctx: Context, indices: dict[str, Any], catch_up: float = 30.0) -> None:
    """At startup (or a first takeover): kopf says its indices are complete only by calling a handler, and calls
    none while its kinds have no objects. So: once kopf's indices hold every object of its kinds the server lists,
    they are complete as of that listing (later objects arrive as events) and the Cache may say so. A kopf handler
    that runs first binds them anyway (handlers._bind). Tried again with a backoff while it fails (a new CRD's
    storage answers 429 for a moment) and the replica is active (a standby's kopf lists nothing)."""
    delay = 1.0
    while ctx.cache.kopf_at is None and ctx.leadership.active:
        try:
            _listed, missing = await kopf_caught_up(ctx, catch_up)
            if not any(missing.values()):
                ctx.cache.bind(indices)
                return
            log.warning("startup: kopf's indices still miss %s after %.0fs; again in %.0fs", missing, catch_up,
                        delay)
        except Exception as exc:  # noqa: BLE001 - again, after a backoff
            log.warning("startup: could not list kopf's kinds (%s); again in %.0fs", exc, delay)
        await asyncio.sleep(delay)
        delay = min(30.0, delay * 2)


async def resync(ctx: Context, catch_up: float = 30.0) -> None:
    """Run on resume (the queue is held); releases the queue when done, whatever happens."""
    t0 = time.monotonic()
    try:
        # 1.-2. kopf's re-list catches up: every listed object is in its index
        listed, missing = await kopf_caught_up(ctx, catch_up)
        if any(missing.values()):
            log.warning("resume: kopf's indices still miss %s after %.0fs; going on", missing, catch_up)
        # 3. ghosts: indexed, not listed, not newer than the listing (no listing version: no verdict)
        ghosts = {uid_of(v) for kind, (uids, rv) in listed.items() for v in ctx.cache.all_objects(kind)
                  if uid_of(v) not in uids and rv and _rv(v) <= rv}
        ctx.cache.hide(ghosts)
        log.info("resume: indices checked against the server in %.2fs (%d objects deleted during the pause "
                 "hidden)", time.monotonic() - t0, len(ghosts))
    except Exception:  # noqa: BLE001 - act on kopf's view rather than not at all
        log.exception("resume: could not check the indices against the server; going on with kopf's view")
    finally:
        if ctx.queue is not None and ctx.leadership.active:
            ctx.queue.release()
    if not ctx.leadership.active:
        return
    # 4. redo whatever was decided on the old view
    for kind in RECONCILED:
        for body in ctx.cache.all_objects(kind):
            ctx.request(kind, body["metadata"]["namespace"], body["metadata"]["name"])
