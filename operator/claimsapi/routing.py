"""Sharded mode's claims API: every replica answers; a request that changes a claim or a batch goes to the replica
holding the shard of its pool (corral.operator.shards).

An ASGI middleware inside the edge (after the token check and the body cap, before routing). It picks a request's
pool from what it names:
- POST /v1/claims, POST /v1/batches: the body's `pool` (its kind from the cache: a WarmPool, else a Pool);
- DELETE/POST /v1/claims/{name}[/renew|pause|resume|snapshot] and the execd proxy (HTTP): the claim's poolRef;
- DELETE /v1/batches/{name}: the batch's poolRef.
Reads (every GET but the execd proxy's) are served here, from this replica's cache: every replica watches
everything. A request whose shard this replica holds is served here. Otherwise it is forwarded, body and headers
as they came (the bearer token included) plus `x-corral-forwarded`, to the holder's claims API address (the
annotation `corral.dev/claims-api-address` on its member lease), and the holder's answer streamed back. A forwarded
request is never forwarded again (views differ for a moment during a handover: it is served where it lands).

When the shard has no live holder (its holder died and its lease has not run out yet) or the holder does not answer,
the request is served here anyway: claims and batches are Kubernetes objects, so the claim this replica creates is
bound by whichever replica takes the shard next, and the API call waits for that as for any claim. What only the
holder can do is the execd proxy when replicas do not share CORRAL_TOKEN_SECRET (each then derives other execd
tokens): that answers 503 `unavailable`, saying which shard's holder could not be reached.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..shards import pool_ref, shard_of

log = logging.getLogger("corral.operator.claimsapi.routing")

FORWARDED = b"x-corral-forwarded"
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade", b"host",
              b"proxy-authorization", b"proxy-authenticate", b"content-length"}
SERVED_HERE = {b"date", b"server"}  # this replica's server writes its own: the holder's would make two of each
CLAIM_PATH = re.compile(r"^/v1/claims/([^/]+)(/.*)?$")
BATCH_PATH = re.compile(r"^/v1/batches/([^/]+)$")
EXECD_PATH = re.compile(r"^/v1/claims/[^/]+/execd/")


class ShardRouter:
    def __init__(self, app: ASGIApp, *, backend: Any, timeout: float = 3600.0) -> None:
        self.app, self.backend = app, backend
        self.ctx, self.ns = backend.ctx, backend.ns
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=2.0))

    # ---- which pool a request is about ---------------------------------------------------------------------------
    def _pool_kind(self, pool: str) -> str:
        return "Pool" if self.ctx.cache.warmpool(self.ns, pool) is None and \
            self.ctx.cache.pool(self.ns, pool) is not None else "WarmPool"

    def _ref_of(self, body: dict[str, Any] | None) -> tuple[str, str] | None:
        ref = None if body is None else pool_ref(body)
        return ref if ref and ref[1] else None

    def pool_of(self, method: str, path: str, body: bytes) -> tuple[str, str] | None:
        """(pool kind, pool name) of a request to route, or None: served here."""
        if method == "POST" and path in ("/v1/claims", "/v1/batches"):
            try:
                pool = json.loads(body or b"{}").get("pool")
            except (ValueError, AttributeError):
                return None
            return (self._pool_kind(pool), pool) if isinstance(pool, str) and pool else None
        if m := CLAIM_PATH.match(path):
            if method == "GET" and not EXECD_PATH.match(path):
                return None
            return self._ref_of(self.ctx.cache.claim(self.ns, m.group(1)))
        if (m := BATCH_PATH.match(path)) and method == "DELETE":
            return self._ref_of(self.ctx.cache.batch(self.ns, m.group(1)))
        return None

    # ---- ASGI ----------------------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shards = self.ctx.shards
        if scope["type"] != "http" or shards is None or any(k == FORWARDED for k, _ in scope["headers"]):
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        streamed = bool(EXECD_PATH.match(path))  # the execd proxy's body is not read here (uploads stream)
        body = b""
        if not streamed and method in ("POST", "PUT", "PATCH", "DELETE"):
            body = await _read(receive)
        pool = self.pool_of(method, path, body)
        replay = _replay(body, receive) if not streamed else receive
        if pool is None:
            return await self.app(scope, replay, send)
        shard = shard_of(self.ns, pool[0], pool[1], shards.n)
        if shards.owns(shard):
            return await self.app(scope, replay, send)
        holder, address = shards.owner_address(shard)
        if holder and address and holder != shards.me:
            try:
                return await self._forward(scope, address, replay if not streamed else receive, send, shard)
            except httpx.TransportError as exc:
                if streamed and not self.ctx.settings.token_secret:
                    return await _error(send, 503, "unavailable", f"the replica holding shard {shard} "
                                        f"({pool[0]} {pool[1]!r}), {holder} at {address}, did not answer ({exc!r}) "
                                        "and this replica cannot reach its sandboxes' execd: retry")
                log.info("holder of shard %d (%s at %s) did not answer (%r): serving here", shard, holder, address,
                         exc)
        elif streamed and not self.ctx.settings.token_secret:
            return await _error(send, 503, "unavailable", f"no live replica holds shard {shard} ({pool[0]} "
                                f"{pool[1]!r}) and this replica cannot reach its sandboxes' execd: retry")
        return await self.app(scope, _replay(body, receive) if not streamed else receive, send)

    async def _forward(self, scope: Scope, address: str, receive: Receive, send: Send, shard: int) -> None:
        async def content() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return
                if chunk := message.get("body", b""):
                    yield chunk
                if not message.get("more_body", False):
                    return

        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in HOP_BY_HOP]
        headers.append((FORWARDED, self.ctx.shards.me.encode()))
        url = address.rstrip("/") + scope.get("raw_path", scope["path"].encode()).decode()
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode()
        request = self._client.build_request(scope["method"], url, headers=headers, content=content())
        response = await self._client.send(request, stream=True)  # a TransportError here: nothing was sent back yet
        try:
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP | SERVED_HERE]
            out.append((b"x-corral-shard", str(shard).encode()))
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()


async def _read(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # a disconnect, later

    return replay


async def _error(send: Send, status: int, code: str, message: str) -> None:
    payload = json.dumps({"code": code, "message": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
