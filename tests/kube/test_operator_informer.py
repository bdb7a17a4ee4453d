"""The hot kinds' own watch streams (operator/informer.py) against the real API server: a stream broken for a while
comes back and what was deleted meanwhile is gone from the operator's view; a resourceVersion older than the server
keeps (410, as after a compaction) makes the informer list again and report what went as deleted; reconnects back
off (no busy loop).

The broken streams are real: the operator talks to the API server through a TCP relay in this process that the test
cuts (every open connection reset, new ones refused) and heals. Nothing stands in for the API server."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest
import yaml
from kubeutil import Sandbox, SandboxClaim, bound, claim, idle_ready, template, wait_until, warm_pool

from corral.operator.cache import Cache
from corral.operator.informer import KINDS, Gone, Informer, Transport
from corral.operator.kube import Kube

pytestmark = pytest.mark.kube


class Relay:
    """A TCP relay to the API server (TLS passes through untouched) that can be cut and healed."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.open = True
        self.conns: set[asyncio.StreamWriter] = set()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop).result(10)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.open:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.conns |= {writer, up_writer}

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.transport.abort()
            self.conns.discard(w)

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        def reset() -> None:
            self.open = False
            for w in list(self.conns):
                w.transport.abort()
        self.loop.call_soon_threadsafe(reset)

    def heal(self) -> None:
        self.loop.call_soon_threadsafe(setattr, self, "open", True)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.cut()


def counts(op, verb: str) -> dict[str, float]:
    return {k.split('resource="')[1].split('"')[0]: v for k, v in op.metrics().items()
            if k.startswith("corral_api_requests_total") and f'verb="{verb}"' in k}


def test_a_broken_stream_comes_back_and_what_was_deleted_meanwhile_is_gone(kube, kube_cluster, operator, ns,
                                                                             tmp_path):
    config = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    server = urlparse(config["clusters"][0]["cluster"]["server"])
    relay = Relay(server.hostname or "127.0.0.1", server.port or 443)
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"  # the certificate is for the IP
    kubeconfig = tmp_path / "relayed.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    operator.stop()  # the session's operator steps aside for one that talks through the relay
    relayed = type(operator)(str(kubeconfig), tmp_path)
    try:
        relayed.start()
        kube.create(template("py"), namespace=ns)
        kube.create(warm_pool("wp", "py", 3), namespace=ns)
        wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 3, 60, 0.25, "3 ready", dump=relayed.log)
        watches = counts(relayed, "watch")
        assert set(watches) == {"SandboxClaim", "Sandbox", "Pod"}

        relay.cut()
        time.sleep(1)
        victim = idle_ready(kube, ns, "wp")[0].metadata.name
        kube.delete(Sandbox, victim, namespace=ns)  # while the operator cannot hear of it
        kube.create(claim("during", "wp"), namespace=ns)
        time.sleep(4)
        relay.heal()

        # The claim is served, and the pool is whole again: had the deleted sandbox stayed in the operator's view
        # as a ghost, the pool would count it and stay one short.
        assert wait_until(lambda: bound(kube, ns, "during"), 60, 0.25, "claim bound", dump=relayed.log)
        wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 3 and victim not in
                   {s.metadata.name for s in kube.list(Sandbox, namespace=ns)}, 60, 0.25, "pool whole again",
                   dump=relayed.log)
        time.sleep(2)
        cached = relayed.metrics()
        after = counts(relayed, "watch")
        reopened = {k: after.get(k, 0) - watches.get(k, 0) for k in watches}
        # each stream came back (>= 1 re-open), after a backoff (0.5 s doubling): a handful in ~5 s, not a loop
        assert all(1 <= n <= 8 for n in reopened.values()), reopened
        time.sleep(5)  # quiet now: not one more request of any kind
        assert {k: v for k, v in relayed.metrics().items() if k.startswith("corral_api_requests_total")} == \
            {k: v for k, v in cached.items() if k.startswith("corral_api_requests_total")}
        assert "watch failed" in relayed.log()
    finally:
        relayed.stop()
        relay.close()
        operator.start()


async def test_a_resource_version_the_server_no_longer_keeps_means_a_fresh_listing(kube_cluster, kube, ns):
    """410 Gone, from the real API server: the informer lists again, and what went meanwhile is reported deleted."""
    requested: list[tuple[str, str, str]] = []
    cache = Cache()
    context = SimpleNamespace(cache=cache, request=lambda *key: requested.append(key),
                              claims=SimpleNamespace(adoption_seen=lambda ns, name: None))
    k = Kube.from_env(kube_cluster.kubeconfig)
    spec = next(s for s in KINDS if s.kind == "SandboxClaim")
    informer = Informer(spec, context, Transport(k))
    cache.attach(spec.index, informer.store.index)
    try:
        for name in ("gone", "kept"):
            kube.create(claim(name, "no-such-pool"), namespace=ns)
        await informer._list()
        assert cache.claim(ns, "gone") is not None
        kube.delete(SandboxClaim, "gone", namespace=ns)
        kube.create(claim("new", "no-such-pool"), namespace=ns)
        informer.rv = "1"  # as after a compaction: older than anything the server keeps
        with pytest.raises(Gone):
            await informer._watch()
        # the informer's own loop: 410 -> list again -> watch on
        requested.clear()
        informer.start()

        async def caught_up() -> None:
            while not (cache.claim(ns, "new") is not None and cache.claim(ns, "gone") is None):
                await asyncio.sleep(0.05)

        await asyncio.wait_for(caught_up(), 30)
        assert informer.relists == 1 and cache.claim(ns, "kept") is not None
        assert ("SandboxClaim", ns, "gone") in requested  # its synthesized DELETED was reacted to
        kube.create(claim("later", "no-such-pool"), namespace=ns)  # and the watch goes on from the new listing

        async def later() -> None:
            while cache.claim(ns, "later") is None:
                await asyncio.sleep(0.05)

        await asyncio.wait_for(later(), 30)
        assert informer.relists == 1 and informer.reconnects == 0
    finally:
        await informer.stop()
        await k.close()
