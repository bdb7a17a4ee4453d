"""A WarmPool under a claim stream that never pauses: its refill runs among the claims, at their pace, and the pool
never runs dry (issue 18). Before, a refill waited for a pause in the stream (0.15 s without a claim) until the
ready sandboxes fell under a tenth of the replicas, then refilled all at once; a stream longer than the pool had
claims going cold while that refill started.

Structural assertions only (this machine is shared): every claim of a stream three times the pool is served warm,
the ready idle sandboxes never fall to the pool's low-water mark (a tenth of the replicas) while the stream runs
(the refill keeps pace: ~20 of 30 on an idle machine, so a loaded one has room), and no more sandboxes are made
than the claims took (each claimed sandbox replaced once, none twice).
"""

import asyncio
import threading
import time

import pytest
from kubeutil import Sandbox, SandboxClaim, claim, idle_ready, status, template, wait_until, warm_pool
from lightkube import AsyncClient, KubeConfig

pytestmark = pytest.mark.kube

REPLICAS = 30
CLAIMS = 90  # three times the pool
INTERVAL = 0.1  # s between claims: closer than the operator's claim_quiet (0.15 s), so the stream never pauses


class PoolWatch:
    """The pool's sandboxes through a watch: every one ever seen, and the fewest ready idle ones (Ready, unclaimed,
    not being deleted) in any state the watch showed while `recording` was set."""

    def __init__(self, kube, ns: str, pool: str) -> None:
        self.seen: set[str] = set()
        self.state: dict[str, bool] = {}  # name -> ready idle
        self.min_idle: int | None = None
        self.recording = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(kube, ns, pool), daemon=True).start()
        time.sleep(0.5)

    def _run(self, kube, ns: str, pool: str) -> None:
        try:
            for event, s in kube.watch(Sandbox, namespace=ns, labels={"corral.dev/pool": pool}):
                if self._stop.is_set():
                    return
                name = s.metadata.name
                self.seen.add(name)
                if event == "DELETED":
                    self.state.pop(name, None)
                else:
                    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                                for c in status(s).get("conditions") or [])
                    claimed = "corral.dev/claim" in (s.metadata.labels or {})
                    self.state[name] = ready and not claimed and not s.metadata.deletionTimestamp
                if self.recording.is_set():
                    idle = sum(self.state.values())
                    self.min_idle = idle if self.min_idle is None else min(self.min_idle, idle)
        except Exception:  # noqa: BLE001 - the stream ends when the test's namespace goes; the figures are in
            if not self._stop.is_set():
                raise

    def stop(self) -> None:
        self._stop.set()


async def stream(kubeconfig: str, ns: str, names: list[str], interval: float) -> None:
    """One claim every `interval` seconds, on schedule (open loop: a slow create does not delay the next)."""
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager="corral-tests")
    try:
        loop = asyncio.get_running_loop()
        start = loop.time()
        creates = []
        for i, name in enumerate(names):
            await asyncio.sleep(max(0.0, start + i * interval - loop.time()))
            creates.append(asyncio.create_task(client.create(claim(name, "wp"), namespace=ns)))
        await asyncio.gather(*creates)
    finally:
        await client.close()


def test_a_claim_stream_three_times_the_pool_is_served_warm_and_never_drains_it(kube, kube_cluster, operator, ns):
    kube.create(template("py"), namespace=ns)
    kube.create(warm_pool("wp", "py", REPLICAS), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == REPLICAS, 120, 0.5, f"{REPLICAS} ready")
    watch = PoolWatch(kube, ns, "wp")
    names = [f"s{i:03d}" for i in range(CLAIMS)]
    try:
        watch.recording.set()
        asyncio.run(stream(kube_cluster.kubeconfig, ns, names, INTERVAL))

        def all_bound():
            claims = {c.metadata.name: status(c) for c in kube.list(SandboxClaim, namespace=ns)}
            return claims if all(claims.get(n, {}).get("phase") == "Bound" for n in names) else None

        claims = wait_until(all_bound, 180, 0.5, f"{CLAIMS} claims Bound")
        watch.recording.clear()
        launch = [c["launchType"] for c in claims.values()]
        assert launch.count("Warm") == CLAIMS, {t: launch.count(t) for t in set(launch)}
        assert len({c["sandbox"]["name"] for c in claims.values()}) == CLAIMS, "a sandbox was bound twice"
        # Not even down to the low-water mark (a tenth of the replicas), where the old pacing started its refill.
        assert watch.min_idle is not None and watch.min_idle >= REPLICAS // 10, f"{watch.min_idle} ready idle"
        # Refilled back to the replicas, each claimed sandbox replaced exactly once: the chunks never overshoot.
        wait_until(lambda: len(idle_ready(kube, ns, "wp")) == REPLICAS and len(watch.seen) >= REPLICAS + CLAIMS,
                   120, 0.5, f"{REPLICAS} ready again")
        time.sleep(2)  # anything extra would be created by now
        assert len(watch.seen) == REPLICAS + CLAIMS, f"{len(watch.seen)} sandboxes for {REPLICAS} + {CLAIMS} claims"
        assert len(list(kube.list(Sandbox, namespace=ns))) == REPLICAS + CLAIMS
    finally:
        watch.stop()
