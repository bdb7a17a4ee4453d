"""A claim's execd token in and out of its sandbox (PUT /v1/token; the tokens themselves: corral.operator.tokens).

In: on the claim's first use of execd (the claims API's first proxied call, or the env a warm claim brings), not at
bind, so a warm claim costs no execd round trip and no API write more than before; a later use finds it in
`Context.tokens` (a dict lookup). Out: when the claim ends and its sandbox lives on (a Pool's Noop recycling, a
Retain), execd goes back to the pod's idle token and forgets the claim's env. A sandbox whose execd cannot be made
to let go of a claim's token has its pod deleted (the repair starts a new pod, with a new idle token).
"""

from __future__ import annotations

import logging

import httpx

from corral.execd import wire

from ..context import Context
from ..kube import ignore
from ..tokens import claim_token, idle_token, legacy_token
from ..views import SandboxView

log = logging.getLogger("corral.operator.handover")


class ExecdUnreachable(Exception):
    """execd did not answer (no pod yet, connection refused, timeout) or answered with neither token we know."""


async def _put_token(ctx: Context, url: str, current: list[str], new: str) -> bool:
    """True once execd took `new`, authenticated by the first of `current` it accepts; False if it refused them all."""
    for token in current:
        try:
            r = await ctx.http().put(f"{url}{wire.TOKEN_PATH}", json={"token": new},
                                     headers={"Authorization": f"Bearer {token}"}, timeout=5)
        except httpx.HTTPError as exc:
            raise ExecdUnreachable(f"execd at {url} did not answer: {exc!r}") from None
        if r.status_code == 401:
            continue
        if r.status_code >= 300:
            raise ExecdUnreachable(f"execd at {url} answered {r.status_code} to PUT {wire.TOKEN_PATH}")
        return True
    return False


async def hand_over(ctx: Context, ns: str, sandbox: str, sandbox_uid: str, pod_uid: str, url: str,
                    claim_uid: str) -> str:
    """The claim's token, in execd: put in from the pod's idle token the first time (or found there already, after
    an operator restart). Raises ExecdUnreachable."""
    token = claim_token(ctx.token_key, ns, sandbox, sandbox_uid, claim_uid)
    if ctx.tokens.installed(ns, sandbox) == (pod_uid, claim_uid):
        return token
    idle = idle_token(ctx.token_key, ns, sandbox, pod_uid)
    legacy = legacy_token(ctx.token_key, ns, sandbox, sandbox_uid)  # a pod made before per-claim tokens
    if not await _put_token(ctx, url, [idle, token, legacy], token):
        raise ExecdUnreachable(f"execd of sandbox {sandbox} refused both its idle token and the claim's")
    ctx.tokens.note_installed(ns, sandbox, pod_uid, claim_uid)
    return token


async def take_back(ctx: Context, ns: str, sandbox: str, sandbox_uid: str, claim_uid: str | None) -> None:
    """The claim is over but the sandbox stays: its execd goes back to the pod's idle token, with no claim env. If
    execd does not answer while it may hold the claim's token (this process put it in), the pod is deleted: the
    repair's new pod starts with a new idle token."""
    installed = ctx.tokens.take(ns, sandbox)
    pod = ctx.cache.pod(ns, sandbox)
    body = ctx.cache.sandbox(ns, sandbox)
    if pod is None or pod.deleting or not pod.pod_ips or body is None:
        return  # no pod, or a new one on its way: it starts with its own idle token
    port = SandboxView(body).execd_port
    ip = pod.pod_ips[0]
    url = f"http://[{ip}]:{port}" if ":" in ip else f"http://{ip}:{port}"
    idle = idle_token(ctx.token_key, ns, sandbox, pod.uid)
    current = [claim_token(ctx.token_key, ns, sandbox, sandbox_uid, claim_uid)] if claim_uid else []
    try:
        legacy = legacy_token(ctx.token_key, ns, sandbox, sandbox_uid)
        if await _put_token(ctx, url, [*current, idle, legacy], idle):
            r = await ctx.http().put(f"{url}{wire.ENV_PATH}", json={"env": {}, "merge": False},
                                     headers={"Authorization": f"Bearer {idle}"}, timeout=5)
            r.raise_for_status()
            return
        why = "refused every token the operator knows"
    except (ExecdUnreachable, httpx.HTTPError) as exc:
        if installed is None or installed[0] != pod.uid:
            # This process never put the claim's token into this pod: it holds the idle token. (Unless the claim used
            # it before an operator restart and its execd is down right now: not known here, see the README.)
            log.info("sandbox %s/%s released; execd did not answer (%s): nothing to take back", ns, sandbox, exc)
            return
        why = str(exc)
    log.warning("sandbox %s/%s: the ended claim's execd token could not be taken back (%s): restarting its pod",
                ns, sandbox, why)
    await ignore({404, 409}, ctx.kube.delete("Pod", sandbox, ns, uid=pod.uid))
