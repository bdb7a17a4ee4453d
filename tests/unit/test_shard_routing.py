"""unit: sharded mode's claims API router (corral.operator.claimsapi.routing) on a fake replica: a write for a pool
of another replica's shard goes to that replica as it came, and its answer comes back as the holder gave it, but
for Date and Server, which this replica's own server writes (passing the holder's on made two of each)."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from corral.operator.claimsapi.routing import ShardRouter
from corral.operator.shards import shard_of

NS = "sbx"


def replica(holds: set[int]):
    """A router over an app that answers 200 "here"; this replica holds `holds` of 4 shards, r1 the others."""
    async def here(request):
        return PlainTextResponse("here")

    app = Starlette(routes=[Route("/v1/claims", here, methods=["POST"])])
    shards = SimpleNamespace(n=4, me="r0", owns=lambda s: s in holds,
                             owner_address=lambda s: ("r1", "http://10.0.0.2:7780"))
    cache = SimpleNamespace(warmpool=lambda ns, name: {"metadata": {"name": name}}, pool=lambda ns, name: None,
                            claim=lambda ns, name: None, batch=lambda ns, name: None)
    ctx = SimpleNamespace(shards=shards, cache=cache, settings=SimpleNamespace(token_secret="k"))
    return ShardRouter(app, backend=SimpleNamespace(ctx=ctx, ns=NS))


def test_a_request_for_another_replicas_shard_is_forwarded_and_its_answer_passed_back_without_date_or_server():
    seen = {}

    async def holder(request: httpx.Request) -> httpx.Response:
        seen.update(url=str(request.url), forwarded=request.headers.get("x-corral-forwarded"),
                    auth=request.headers.get("authorization"), body=await request.aread())
        return httpx.Response(201, stream=httpx.ByteStream(b'{"name": "c1"}'), headers={
            "date": "Mon, 01 Jan 2024 00:00:00 GMT", "server": "uvicorn", "content-type": "application/json",
            "x-holder": "1"})

    shard = shard_of(NS, "WarmPool", "python", 4)
    router = replica(holds=set())
    router._client = httpx.AsyncClient(transport=httpx.MockTransport(holder))
    with TestClient(router) as http:  # (the test client writes no Date or Server of its own)
        r = http.post("/v1/claims", json={"pool": "python"}, headers={"Authorization": "Bearer t"})
    assert (r.status_code, r.json()) == (201, {"name": "c1"})
    assert seen == {"url": "http://10.0.0.2:7780/v1/claims", "forwarded": "r0", "auth": "Bearer t",
                    "body": b'{"pool":"python"}'}
    assert r.headers["x-corral-shard"] == str(shard) and r.headers["x-holder"] == "1"
    assert "date" not in r.headers and "server" not in r.headers, r.headers


def test_a_request_for_a_held_shard_is_served_here():
    router = replica(holds={0, 1, 2, 3})
    with TestClient(router) as http:
        r = http.post("/v1/claims", json={"pool": "python"})
    assert (r.status_code, r.text) == (200, "here") and "x-corral-shard" not in r.headers
