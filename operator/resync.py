"""A replica resuming from a peering pause checks kopf's indices against the API server before it acts again.

kopf closes a paused replica's watch streams and, on resume, lists each kind again, one stream at a time. Two
things follow that kopf does not handle:
- until every stream has re-listed, the indices are a partial view (a claim without its pool, a pool without its
  sandboxes), and a reconcile on it can decide wrongly (create sandboxes a pool already has);
- an object deleted during the pause never produces a DELETED event, so it stays in the indices for good: a ghost (a
  WarmPool counting a deleted idle sandbox stays one short; a Pool counts a deleted allocation against poolMax).

So the work queue is held while the replica stands by (nothing it had queued or timed runs meanwhile), and on resume:
1. each indexed kind is listed once (seven LIST calls per takeover, never in a loop);
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
from .constants import L_MANAGED_BY, L_SANDBOX, MANAGED_BY
from .context import Context

log = logging.getLogger("corral.operator.resync")

# what kopf indexes (handlers.py), as listed from the server
INDEXED: dict[str, dict[str, str | None]] = {
    "SandboxTemplate": {}, "WarmPool": {}, "Pool": {}, "SandboxClaim": {}, "Sandbox": {}, "SandboxBatch": {},
    "Pod": {L_SANDBOX: None, L_MANAGED_BY: MANAGED_BY},
}
RECONCILED = ("SandboxTemplate", "WarmPool", "Pool", "SandboxClaim", "Sandbox", "SandboxBatch")


def _rv(obj: Any) -> int:
    rv = obj.resource_version if hasattr(obj, "resource_version") else \
        (obj.get("metadata") or {}).get("resourceVersion", "")
    return int(rv) if str(rv).isdigit() else 0


async def resync(ctx: Context, catch_up: float = 30.0) -> None:
    """Run on resume (the queue is held); releases the queue when done, whatever happens."""
    t0 = time.monotonic()
    try:
        listed: dict[str, tuple[set[str], int]] = {}

        async def list_kind(kind: str) -> None:
            items, rv = await ctx.kube.list_all(kind, INDEXED[kind])
            listed[kind] = ({o["metadata"]["uid"] for o in items}, rv)

        for kind in INDEXED:
            await list_kind(kind)
        # 2. kopf's re-list catches up: every listed object is in its index. An object deleted after our listing
        # may never reach it: a kind still missing objects is listed again every 2 s (bounded, takeover only).
        deadline, relist = time.monotonic() + catch_up, time.monotonic() + 2
        while True:
            missing = {kind: len(uids - {uid_of(v) for v in ctx.cache.all_objects(kind)})
                       for kind, (uids, _) in listed.items()}
            if not any(missing.values()) or time.monotonic() > deadline:
                break
            if time.monotonic() > relist:
                for kind in [k for k, n in missing.items() if n]:
                    await list_kind(kind)
                relist = time.monotonic() + 2
            await asyncio.sleep(0.05)
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
