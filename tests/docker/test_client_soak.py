"""docker tier: a soak of 1,000 sequential claim / exec / release cycles with one client against a real operator
container, on a Pool whose release recycles the sandbox in place (Noop), so every cycle is a warm claim. Open file
descriptors, sockets and established TCP connections are counted from /proc on both sides (this process; the
operator container's process tree) after a warm-up and every 100 cycles: none may grow."""

from __future__ import annotations

import os
import socket
import time

import pytest
from client_harness import usage

from corral.client import Client

pytestmark = pytest.mark.docker
CYCLES, WARMUP, EVERY = 1000, 50, 100
SLACK = 8   # keep-alive connections come and go with the pools (a few per side); a leak grows by ~1 per cycle


def test_1000_claim_exec_release_cycles_leak_nothing(local_stack):
    me = [os.getpid()]
    operator = local_stack.operator_pids()
    assert len(operator) >= 2, operator  # docker-init and the operator under it

    def cycle(client: Client, i: int) -> str:
        with client.claim(pool="shell-noop", ttl=300) as sbx:
            if i % 2:
                r = sbx.commands.run(f"echo cycle-{i}")
                assert (r.exit_code, r.stdout) == (0, f"cycle-{i}\n")
            else:  # every other cycle streams, so a leaked streaming response would show too
                with sbx.commands.stream(["echo", f"cycle-{i}"]) as stream:
                    assert b"".join(o.data for o in stream) == f"cycle-{i}\n".encode()
                assert stream.exit_code == 0
            return sbx.claim.launch_type or ""

    # The counters see a connection on both sides: one more raw connection to the API shows up in each.
    before_me = usage(me)
    api = local_stack.op.port
    with socket.create_connection(("127.0.0.1", api)) as probe:
        mine = probe.getsockname()[1]
        time.sleep(0.2)
        assert usage(me).fds == before_me.fds + 1 and (mine, api) in usage(me).conns
        assert (api, mine) in usage(operator).conns

    with Client(local_stack.url, local_stack.token) as client:
        for i in range(WARMUP):
            cycle(client, i)
        time.sleep(1.0)
        base_client, base_op = usage(me), usage(operator)
        samples = []
        launches: dict[str, int] = {}
        t0 = time.monotonic()
        for i in range(1, CYCLES + 1):
            kind = cycle(client, i)
            launches[kind] = launches.get(kind, 0) + 1
            if i % EVERY == 0:
                samples.append((i, usage(me), usage(operator)))
        seconds = time.monotonic() - t0
        time.sleep(1.0)
        end_client, end_op = usage(me), usage(operator)
        assert not client.claims(pool="shell-noop")  # every claim was released
    print(f"\n{CYCLES} cycles in {seconds:.1f} s ({1000 * seconds / CYCLES:.1f} ms/cycle), launches {launches}")
    print(f"client   before: {base_client}; after: {end_client}")
    print(f"operator before: {base_op}; after: {end_op}")
    for i, c, o in samples:
        print(f"  after {i:4d}: client {c}; operator {o}")
    assert launches.get("warm", 0) >= CYCLES * 0.95, launches  # recycled in place, not cold starts
    for _, c, o in [*samples, (CYCLES, end_client, end_op)]:
        assert c.fds <= base_client.fds + SLACK and c.tcp <= base_client.tcp + SLACK, (base_client, c)
        assert o.fds <= base_op.fds + SLACK and o.tcp <= base_op.tcp + SLACK, (base_op, o)
        assert o.sockets <= base_op.sockets + SLACK, (base_op, o)
    # One client, one connection pool: sequential calls reuse one or two keep-alive connections.
    assert end_client.tcp <= 4, end_client
