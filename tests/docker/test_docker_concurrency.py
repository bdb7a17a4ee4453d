"""docker tier: claims under concurrency and faults. 100 concurrent claims against a warm pool of 20; the operator
killed (SIGKILL) in the middle of a 50-claim burst and started again: every claim converges, none double, none lost."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import pytest
from operator_harness import claim, wait_ready

pytestmark = pytest.mark.docker
BURST_TIMEOUT = 600.0


async def test_100_concurrent_claims_against_a_warm_pool_of_20(make_operator):
    op = make_operator(warm={"shell": 20})
    op.wait_idle("shell", 20)
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=op.url, headers=op.headers, timeout=BURST_TIMEOUT, limits=limits) as client:
        results = await asyncio.wait_for(
            asyncio.gather(*[claim(client, f"c{i:03d}", "shell") for i in range(100)]), BURST_TIMEOUT)
        deadline = time.monotonic() + BURST_TIMEOUT
        results = [await wait_ready(client, c["name"], deadline) if c["phase"] == "Pending" else c for c in results]
        assert Counter(c["phase"] for c in results) == {"Ready": 100}, [c for c in results if c["phase"] != "Ready"]
        assert Counter(c["launchType"] for c in results) == {"warm": 20, "cold": 80}
        sandboxes = [c["sandbox"]["name"] for c in results]
        assert len(set(sandboxes)) == 100  # no container claimed twice
        # Every claimed container exists, and a command runs in a few of them through the proxy.
        live = {c.name for c in op.containers(**{"corral.dev/pool": "shell"})}
        assert set(sandboxes) <= live
        for c in results[::25]:
            r = await client.post(f"/v1/claims/{c['name']}/execd/v1/command", json={"command": "hostname"})
            assert r.status_code == 200 and r.json()["exit_code"] == 0
        # Release: a WarmPool deletes released sandboxes; the pool converges back to 20 idle.
        deleted = await asyncio.gather(*[client.delete(f"/v1/claims/{c['name']}") for c in results])
        assert {r.status_code for r in deleted} == {204}
    live = {c.name for c in op.containers(**{"corral.dev/pool": "shell"})}
    assert not (set(sandboxes) & live)
    op.wait_idle("shell", 20)
    assert len(op.containers(**{"corral.dev/pool": "shell"})) == 20


async def test_operator_killed_during_a_50_claim_burst_converges(make_operator):
    op = make_operator(warm={"shell": 5})
    op.wait_idle("shell", 5)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=op.url, headers=op.headers, timeout=BURST_TIMEOUT, limits=limits) as client:
        retry_until = time.monotonic() + BURST_TIMEOUT
        tasks = [asyncio.create_task(claim(client, f"b{i:02d}", "shell", retry_until=retry_until)) for i in range(50)]
        # Kill the operator once some claims are served and others are in flight (cold starts in progress).
        deadline = time.monotonic() + 120
        while sum(t.done() for t in tasks) < 8:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        op.kill()
        served_before_kill = sum(t.done() and not t.exception() for t in tasks)
        await asyncio.sleep(0.5)
        op.start()
        results = await asyncio.wait_for(asyncio.gather(*tasks), BURST_TIMEOUT)
        deadline = time.monotonic() + BURST_TIMEOUT
        final = [await wait_ready(client, c["name"], deadline) for c in results]
        assert Counter(c["phase"] for c in final) == {"Ready": 50}, [c for c in final if c["phase"] != "Ready"]
        listed = (await client.get("/v1/claims")).json()["items"]
        assert sorted(c["name"] for c in listed) == [f"b{i:02d}" for i in range(50)]  # none lost, none extra
        sandboxes = [c["sandbox"]["name"] for c in final]
        assert len(set(sandboxes)) == 50  # none double
        for c in final[::10]:
            r = await client.post(f"/v1/claims/{c['name']}/execd/v1/command", json={"command": "true"})
            assert r.status_code == 200, r.text
    print(f"\nserved before the kill: {served_before_kill}/50")
    # No orphans: the pool's containers are exactly the 50 claimed + the 5 idle once it has converged.
    op.wait_idle("shell", 5)
    live = {c.name for c in op.containers(**{"corral.dev/pool": "shell"})}
    assert set(sandboxes) <= live and len(live) == 55, sorted(live - set(sandboxes))
