"""Open-loop claim load for bench/claims_k8s: a claim every 0.5 s while the previous claim's refill runs (phase
`spaced`), and claims created and released at a steady rate for minutes (phase `sustained`).

All of it runs on one asyncio loop in the bench process, kept light so that it does not take the cores it measures:
raw aiohttp requests with small pre-encoded bodies, watch lines decoded into plain dicts (no models). Claims fire
on their schedule whatever happened to the earlier ones (open loop), and each one's lag from its schedule is
recorded. Latency is the bench's usual one: this process receives the claim's ADDED event -> it receives the event
showing it Bound; `e2e` also counts the create request (scheduled time -> Bound seen).

Operator CPU and RSS come from /proc/<pid>/stat and /proc/<pid>/status; the control plane's processes (their pid
files sit next to scripts/cluster.sh's kubeconfig) are sampled the same way, to show where the cores went.
"""

from __future__ import annotations

import asyncio
import bisect
import json
import math
import os
import re
import ssl
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from lightkube import KubeConfig

L_POOL, L_CLAIM = "corral.dev/pool", "corral.dev/claim"
GROUP = "/apis/corral.dev/v1alpha1/namespaces"
MUTATING = {"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"}
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
TICK = os.sysconf("SC_CLK_TCK")
now = time.perf_counter


def pct(values: list[float], p: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def summary(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90), "p99_ms": pct(ms, 99),
            "mean_ms": statistics.fmean(ms), "max_ms": max(ms)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def runq_wait_seconds(pid: int) -> float:
    """Time the process's threads spent runnable but waiting for a core, so far (/proc/<pid>/task/*/schedstat): how
    much the shared machine starved it."""
    total = 0
    for f in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(f.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores so far, from /proc/stat."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def control_plane_pids(kubeconfig: str) -> dict[str, int]:
    """The local control plane's processes, from scripts/cluster.sh's pid files (absent elsewhere: then none)."""
    out = {}
    for name in CONTROL_PLANE:
        f = Path(kubeconfig).parent / f"{name}.pid"
        try:
            pid = int(f.read_text())
            cpu_seconds(pid)
            out[name] = pid
        except (OSError, ValueError):
            pass
    return out


class Api:
    """A lean async client of the API server (aiohttp, as the operator's own fast path: lighter per request than
    httpx): pre-encoded bodies in, status codes out, watches as plain dicts."""

    def __init__(self, kubeconfig: str, connections: int = 64) -> None:
        cfg = KubeConfig.from_file(kubeconfig).get()
        self.base = cfg.cluster.server.rstrip("/")
        self.ssl = ssl.create_default_context(cafile=cfg.cluster.certificate_auth)
        self.headers = {"Authorization": f"Bearer {cfg.user.token}"} if cfg.user.token else {}
        self.connections = connections
        self.session: aiohttp.ClientSession | None = None
        self.codes: Counter[str] = Counter()

    def _s(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self.ssl, limit=self.connections), headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30), read_bufsize=2**20)
        return self.session

    async def request(self, method: str, path: str, content: bytes | None = None,
                      ctype: str = "application/json") -> int:
        try:
            async with self._s().request(method, self.base + path, data=content,
                                         headers={"Content-Type": ctype} if content is not None else None,
                                         timeout=aiohttp.ClientTimeout(total=600)) as r:
                await r.read()
                code = r.status
        except (aiohttp.ClientError, TimeoutError) as e:
            code = 0
            self.codes[f"{method} {type(e).__name__}"] += 1
        self.codes[f"{method} {code}"] += 1
        return code

    async def watch(self, path: str, on_event: Callable[[str, dict, float], None], started: asyncio.Event,
                    params: dict[str, str] | None = None) -> None:
        """List (each item passed as "LIST"), then watch from the list's version; re-list when the version expires."""
        params = dict(params or {})
        while True:
            async with self._s().get(self.base + path, params=params) as r:
                r.raise_for_status()
                body = json.loads(await r.read())
            t = now()
            for item in body["items"]:
                on_event("LIST", item, t)
            rv = body["metadata"]["resourceVersion"]
            started.set()
            expired = False
            while not expired:
                q = {**params, "watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true",
                     "timeoutSeconds": "3600"}
                async with self._s().get(self.base + path, params=q) as resp:
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        t = now()
                        ev = json.loads(line)
                        obj = ev["object"]
                        if ev["type"] == "ERROR":
                            expired = True
                            break
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if ev["type"] != "BOOKMARK":
                            on_event(ev["type"], obj, t)

    async def apiserver_writes(self) -> dict[str, float]:
        """The API server's count of mutating requests so far (all clients), by resource[/subresource] and verb."""
        async with self._s().get(self.base + "/metrics") as r:
            text = await r.text()
        out: dict[str, float] = Counter()
        for line in text.splitlines():
            if line.startswith("apiserver_request_total{"):
                labels, _, value = line.rpartition(" ")
                lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
                if lab.get("verb") in MUTATING:
                    res = lab.get("resource", "") + (f"/{lab['subresource']}" if lab.get("subresource") else "")
                    out[f"{res} {lab['verb']}"] += float(value)
        return out

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


def claim_body(name: str, pool: str) -> bytes:
    return json.dumps({"apiVersion": "corral.dev/v1alpha1", "kind": "SandboxClaim", "metadata": {"name": name},
                       "spec": {"poolRef": {"name": pool}}}, separators=(",", ":")).encode()


class ClaimTimes:
    """When each claim was scheduled, sent, answered, seen ADDED and seen Bound (perf_counter seconds)."""

    def __init__(self) -> None:
        self.sched: dict[str, float] = {}
        self.sent: dict[str, float] = {}
        self.answered: dict[str, float] = {}
        self.added: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.launch: dict[str, str] = {}
        self.failed: set[str] = set()
        self.on_bound: Callable[[str], None] | None = None
        self.changed = asyncio.Event()

    def event(self, kind: str, obj: dict, t: float) -> None:
        if kind in ("LIST", "DELETED"):
            return
        name = obj["metadata"]["name"]
        self.added.setdefault(name, t)
        st = obj.get("status") or {}
        if st.get("phase") == "Bound" and name not in self.bound:
            self.bound[name] = t
            self.launch[name] = st.get("launchType") or "?"
            if self.on_bound:
                self.on_bound(name)
            self.changed.set()

    async def create(self, api: Api, ns: str, name: str, pool: str, at: float) -> None:
        body = claim_body(name, pool)
        self.sched[name] = at
        self.sent[name] = now()
        try:
            code = await api.request("POST", f"{GROUP}/{ns}/sandboxclaims", body)
        except asyncio.CancelledError:  # still unanswered when the drain's time ran out
            self.failed.add(name)
            raise
        self.answered[name] = now()
        if code != 201:
            self.failed.add(name)
            self.changed.set()

    def bind_ms(self, names: list[str]) -> list[float]:
        return [(self.bound[n] - self.added[n]) * 1000 for n in names if n in self.bound and n in self.added]

    def e2e_ms(self, names: list[str]) -> list[float]:
        return [(self.bound[n] - self.sched[n]) * 1000 for n in names if n in self.bound]

    def lag_ms(self, names: list[str]) -> list[float]:
        return [(self.sent[n] - self.sched[n]) * 1000 for n in names if n in self.sent]

    def backlog(self) -> int:
        """Claims created (request sent) and not yet seen Bound."""
        return len(self.sent) - len(self.failed) - sum(1 for n in self.bound if n in self.sent)

    async def wait_bound(self, names: list[str], timeout: float) -> bool:
        deadline = now() + timeout
        while not all(n in self.bound or n in self.failed for n in names):
            self.changed.clear()
            left = deadline - now()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
            except TimeoutError:
                pass
        return True


class PoolSandboxes:
    """A pool's sandboxes as seen through a label-selected watch: when each appeared and became Ready, and which are
    idle (Ready, unclaimed, not being deleted) right now."""

    def __init__(self) -> None:
        self.added: dict[str, float] = {}  # only sandboxes created while watched (the refills)
        self.ready: dict[str, float] = {}
        self.gone: dict[str, float] = {}
        self.last_idle_event: dict[str, float] = {}  # the last event of a sandbox not yet claimed (status echoes)
        self.state: dict[str, tuple[bool, bool, bool]] = {}  # name -> (ready, claimed, deleting)

    def event(self, kind: str, obj: dict, t: float) -> None:
        meta = obj["metadata"]
        name = meta["name"]
        if kind == "DELETED":
            self.gone.setdefault(name, t)
            self.state.pop(name, None)
            return
        if kind == "ADDED":
            self.added.setdefault(name, t)
        ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                    for c in (obj.get("status") or {}).get("conditions") or [])
        if ready:
            self.ready.setdefault(name, t)
        claimed = L_CLAIM in (meta.get("labels") or {})
        if not claimed:
            self.last_idle_event[name] = t
        self.state[name] = (ready, claimed, bool(meta.get("deletionTimestamp")))

    def idle(self) -> int:
        return sum(1 for r, c, d in self.state.values() if r and not c and not d)

    def refilling_at(self, t: float) -> int:
        """Refills in flight at t: sandboxes created before t and not Ready (nor gone) by then."""
        inf = math.inf
        return sum(1 for n, a in self.added.items()
                   if a <= t and self.ready.get(n, inf) > t and self.gone.get(n, inf) > t)

    def echoing_at(self, t: float) -> int:
        """Refills whose events (creation, readiness, status echoes) still come in at t: created before t, and an
        event after t while still unclaimed."""
        return sum(1 for n, a in self.added.items() if a <= t < self.last_idle_event.get(n, 0))

    def refill_ms(self, since: float, until: dict[str, float]) -> list[float]:
        return [(until[n] - a) * 1000 for n, a in self.added.items() if a >= since and n in until]


class CpuTrace:
    """The operator's cumulative CPU every `step` seconds, to see how long its work after each claim lasts (the
    kernel counts in 10 ms ticks: averaged over many claims, the profile is fine-grained enough)."""

    def __init__(self, pid: int, step: float = 0.01) -> None:
        self.pid, self.step = pid, step
        self.t: list[float] = []
        self.cpu: list[float] = []

    async def run(self) -> None:
        while True:
            self.t.append(now())
            self.cpu.append(cpu_seconds(self.pid))
            await asyncio.sleep(self.step)

    def at(self, x: float) -> float:
        i = bisect.bisect_left(self.t, x)
        if i <= 0:
            return self.cpu[0]
        if i >= len(self.t):
            return self.cpu[-1]
        t0, t1, c0, c1 = self.t[i - 1], self.t[i], self.cpu[i - 1], self.cpu[i]
        return c0 + (c1 - c0) * (x - t0) / (t1 - t0)

    def profile(self, marks: list[float], bin_s: float, before: int, after: int) -> list[float]:
        """Mean operator CPU (ms) in each bin around the marks: `before` bins before, `after` bins from each mark."""
        out = []
        for k in range(-before, after):
            v = [self.at(m + (k + 1) * bin_s) - self.at(m + k * bin_s) for m in marks]
            out.append(round(statistics.fmean(v) * 1000, 3) if v else math.nan)
        return out


async def watching(api: Api, ns: str, pool: str, claims: ClaimTimes, sandboxes: PoolSandboxes) -> list[asyncio.Task]:
    started = [asyncio.Event(), asyncio.Event()]
    tasks = [asyncio.create_task(api.watch(f"{GROUP}/{ns}/sandboxclaims", claims.event, started[0])),
             asyncio.create_task(api.watch(f"{GROUP}/{ns}/sandboxes", sandboxes.event, started[1],
                                           {"labelSelector": f"{L_POOL}={pool}"}))]
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
    return tasks


async def wait_idle(sandboxes: PoolSandboxes, n: int, timeout: float) -> bool:
    deadline = now() + timeout
    while sandboxes.idle() < n:
        if now() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def spaced(kubeconfig: str, ns: str, pool: str, replicas: int, n: int, interval: float,
                 op_pid: int) -> dict[str, Any]:
    """n claims, one every `interval` seconds on schedule, against a WarmPool of `replicas`: each claim arrives while
    the refill after the previous one (a Sandbox, its pod, scheduling, the status echoes) is in flight, if the
    refill takes longer than the interval; the fraction that did is reported. Claims are kept (not released)."""
    api = Api(kubeconfig, 16)
    claims, sandboxes = ClaimTimes(), PoolSandboxes()
    tasks = await watching(api, ns, pool, claims, sandboxes)
    try:
        if not await wait_idle(sandboxes, replicas, 300):
            raise TimeoutError(f"{pool}: {sandboxes.idle()}/{replicas} idle")
        await asyncio.sleep(2)
        c0, t0 = cpu_seconds(op_pid), now()
        await asyncio.sleep(3)
        idle_ms_per_s = (cpu_seconds(op_pid) - c0) * 1000 / (now() - t0)
        names = [f"spaced-refill-{i:04d}" for i in range(n)]
        creates = []
        trace = CpuTrace(op_pid)
        tasks.append(asyncio.create_task(trace.run()))
        start = now() + 0.1
        cpu0, wait0 = cpu_seconds(op_pid), runq_wait_seconds(op_pid)
        for i, name in enumerate(names):
            at = start + i * interval
            await asyncio.sleep(max(0.0, at - now()))
            creates.append(asyncio.create_task(claims.create(api, ns, name, pool, at)))
        await asyncio.sleep(max(0.0, start + n * interval - now()))
        cpu_window = cpu_seconds(op_pid) - cpu0  # n claims and n refills' worth, minus the last refill's tail
        wait_window = runq_wait_seconds(op_pid) - wait0
        await asyncio.gather(*creates)
        all_bound = await claims.wait_bound(names, 120)
        refilled = await wait_idle(sandboxes, replicas, 300)
        await asyncio.sleep(2)  # the refill's last (coalesced) status writes
        cpu_quiet = cpu_seconds(op_pid) - cpu0
        quiet_s = now() - start
    finally:
        for t in tasks:
            t.cancel()
        await api.close()
    marks = [claims.added[x] for x in names if x in claims.added]
    arrivals = [sandboxes.refilling_at(m) for m in marks]
    echoing = [sandboxes.echoing_at(m) for m in marks]
    bin_ms = 50
    prof = trace.profile(marks, bin_ms / 1000, 1, int(interval * 1000 / bin_ms))
    busy = [trace.at(m) - trace.at(m - bin_ms / 1000) >= 0.005 for m in marks]  # >= 5 ms CPU in the 50 ms before
    idle_bin = idle_ms_per_s * bin_ms / 1000
    return {
        **summary(claims.bind_ms(names)),
        "interval_s": interval, "pool_replicas": replicas, "all_bound": all_bound, "refilled": refilled,
        "launch": dict(Counter(claims.launch.get(x, "unbound") for x in names)),
        "e2e": summary(claims.e2e_ms(names)),
        "generator_lag": summary(claims.lag_ms(names)),
        # Did the claim arrive while a refill was in flight? Three views: a refill sandbox created and not yet Ready;
        # one whose watch events (status echoes included) were still coming; the operator busy just before (at least
        # 5 ms of CPU in the 50 ms before the claim's ADDED event: its refill work comes ~150-250 ms after a claim).
        "refill_not_ready_at_arrival": round(sum(1 for a in arrivals if a) / max(1, len(arrivals)), 3),
        "refill_events_in_flight_at_arrival": round(sum(1 for a in echoing if a) / max(1, len(echoing)), 3),
        "operator_busy_at_arrival": round(sum(busy) / max(1, len(busy)), 3),
        "refill_created_to_ready": summary(sandboxes.refill_ms(start, sandboxes.ready)),
        "refill_created_to_last_event": summary(sandboxes.refill_ms(start, sandboxes.last_idle_event)),
        "operator_cpu_profile": {
            "bin_ms": bin_ms, "first_bin_starts_ms": -bin_ms, "idle_ms_per_bin": round(idle_bin, 3),
            "mean_cpu_ms_per_bin": prof,
            "note": "operator CPU around each claim's ADDED event, averaged over the claims: the first bin is the "
                    "50 ms before the claim arrives (above idle there = still busy with the previous refill)"},
        "operator_idle_cpu_ms_per_s": round(idle_ms_per_s, 2),
        "operator_runq_wait_ms_per_claim": round(wait_window * 1000 / n, 2),
        "operator_cpu_ms_per_claim_plus_refill": round(cpu_window * 1000 / n, 2),
        "operator_cpu_ms_per_claim_plus_refill_idle_subtracted": round(
            (cpu_window * 1000 - idle_ms_per_s * n * interval) / n, 2),
        "operator_cpu_ms_per_claim_plus_refill_until_quiet": round(
            (cpu_quiet * 1000 - idle_ms_per_s * quiet_s) / n, 2),
        "api_codes": dict(api.codes),
    }


class Sampler:
    """Once a second: operator CPU % and RSS, the control plane's CPU %, this process's CPU %, the machine's busy %,
    the claim backlog and the pool's idle sandboxes."""

    def __init__(self, op_pid: int, cp: dict[str, int], claims: ClaimTimes, sandboxes: PoolSandboxes) -> None:
        self.op_pid, self.cp, self.claims, self.sandboxes = op_pid, cp, claims, sandboxes
        self.rows: list[dict[str, float]] = []

    def _read(self) -> tuple[float, dict[str, float], float, tuple[int, int], float]:
        cp = {}
        for name, pid in self.cp.items():
            try:
                cp[name] = cpu_seconds(pid)
            except OSError:
                cp[name] = math.nan
        return (cpu_seconds(self.op_pid), cp, cpu_seconds(os.getpid()), machine_jiffies(),
                runq_wait_seconds(self.op_pid))

    async def run(self, start: float) -> None:
        prev, tprev = self._read(), now()
        k = 1
        while True:
            await asyncio.sleep(max(0.0, start + k - now()))
            cur, t = self._read(), now()
            dt = t - tprev
            (op0, cp0, me0, (b0, a0), w0), (op1, cp1, me1, (b1, a1), w1) = prev, cur
            last = self.rows[-1] if self.rows else {}
            self.rows.append({
                "t": round(t - start, 2),
                "operator_cpu_pct": round((op1 - op0) / dt * 100, 1),
                "operator_rss_mib": round(rss_mib(self.op_pid), 1),
                "operator_runq_wait_pct": round((w1 - w0) / dt * 100, 1),
                "bench_cpu_pct": round((me1 - me0) / dt * 100, 1),
                "machine_busy_pct": round((b1 - b0) / max(1, a1 - a0) * 100 * (os.cpu_count() or 1), 1),
                **{f"{x}_cpu_pct": round((cp1[x] - cp0[x]) / dt * 100, 1) for x in cp1},
                "backlog": self.claims.backlog(),
                "bound_total": len(self.claims.bound),
                "bound_per_s": round((len(self.claims.bound) - last.get("bound_total", 0)) / dt, 1),
                "sent_per_s": round((len(self.claims.sent) - last.get("sent_total", 0)) / dt, 1),
                "sent_total": len(self.claims.sent),
                "pool_idle": self.sandboxes.idle(),
                "pool_sandboxes": len(self.sandboxes.state),
                "load1": round(os.getloadavg()[0], 2),
            })
            prev, tprev = cur, t
            k += 1


def slope_per_min(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 3:
        return math.nan
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 60 if den else math.nan


async def sustained(kubeconfig: str, ns: str, pool: str, replicas: int, rate: float, duration: float, hold: float,
                    op_pid: int, op_writes: Callable[[], dict[str, float]], max_backlog: int) -> dict[str, Any]:
    """Claims created at `rate` per second for `duration` seconds on schedule (open loop), each released (deleted)
    `hold` seconds after it is seen Bound, against a WarmPool of `replicas`; a per-second series and totals."""
    api = Api(kubeconfig, 256)
    claims, sandboxes = ClaimTimes(), PoolSandboxes()
    tasks = await watching(api, ns, pool, claims, sandboxes)
    loop = asyncio.get_running_loop()
    deletes: list[asyncio.Task] = []
    cp = control_plane_pids(kubeconfig)

    def release(name: str) -> None:
        deletes.append(asyncio.create_task(api.request("DELETE", f"{GROUP}/{ns}/sandboxclaims/{name}")))

    claims.on_bound = lambda name: loop.call_later(hold, release, name)
    total = int(rate * duration)
    names = [f"s{i:06d}" for i in range(total)]
    sampler = Sampler(op_pid, cp, claims, sandboxes)
    try:
        if not await wait_idle(sandboxes, replicas, 600):
            raise TimeoutError(f"{pool}: {sandboxes.idle()}/{replicas} idle")
        await asyncio.sleep(3)
        writes0, opw0 = await api.apiserver_writes(), op_writes()
        cpu0 = cpu_seconds(op_pid)
        start = now() + 0.2
        stask = asyncio.create_task(sampler.run(start))
        creates: list[asyncio.Task] = []
        aborted = None
        for i, name in enumerate(names):
            at = start + i / rate
            delay = at - now()
            if delay > 0:
                await asyncio.sleep(delay)
            if i % 50 == 0 and claims.backlog() > max_backlog:
                aborted = round(now() - start, 1)
                names = names[:i]
                break
            creates.append(asyncio.create_task(claims.create(api, ns, name, pool, at)))
        schedule_end = now() - start
        # The drain: every create answered and every claim Bound, within a time limit (an overloaded control plane
        # can take minutes; what is left then is cancelled and deleted).
        deadline = now() + max(30.0, duration * 0.2)
        pending = (await asyncio.wait(creates, timeout=deadline - now()))[1] if creates else set()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        drained = not pending and await claims.wait_bound(names, max(0.1, deadline - now()))
        drain_s = round(now() - start - schedule_end, 2)
        await asyncio.sleep(hold + 1)
        await asyncio.gather(*deletes)
        await asyncio.sleep(3)
        cpu = cpu_seconds(op_pid) - cpu0
        run_s = now() - start
        writes1, opw1 = await api.apiserver_writes(), op_writes()
        stask.cancel()
    finally:
        for t in tasks:
            t.cancel()
        claims.on_bound = None
    # Claims never bound (overload, or the drain's time limit): release them too, so the next phase starts clean.
    await api.request("DELETE", f"{GROUP}/{ns}/sandboxclaims")  # any left (unbound, or created after a cancel)
    await api.close()

    created = [n for n in names if n not in claims.failed]
    rows = sampler.rows
    # Per second of the schedule: the latency of the claims scheduled in that second.
    per_s: dict[int, list[str]] = {}
    for n in created:
        per_s.setdefault(int(claims.sched[n] - start), []).append(n)
    for row in rows:
        sec = int(row["t"]) - 1
        group = per_s.get(sec, [])
        bind, e2e = claims.bind_ms(group), claims.e2e_ms(group)
        row.update({"claims": len(group), "cold": sum(1 for n in group if claims.launch.get(n) == "Cold"),
                    "bind_p50_ms": round(pct(bind, 50), 1),
                    "bind_p99_ms": round(pct(bind, 99), 1), "e2e_p99_ms": round(pct(e2e, 99), 1),
                    "lag_max_ms": round(max(claims.lag_ms(group), default=math.nan), 1)})
    steady = [r for r in rows if 10 <= r["t"] <= schedule_end]  # after the first 10 s, before the drain
    fifth = max(1, len(steady) // 5)
    head, tail = steady[fifth:2 * fifth], steady[-fifth:]  # 2nd and last fifth of the steady part

    def mean(rs: list[dict], key: str) -> float:
        v = [r[key] for r in rs if not math.isnan(r[key])]
        return round(statistics.fmean(v), 2) if v else math.nan

    half = steady[len(steady) // 2:]
    backlog_growth = mean(tail, "backlog") - mean(head, "backlog") if steady else math.nan
    rss_growth = mean(tail, "operator_rss_mib") - mean(head, "operator_rss_mib") if steady else math.nan
    dw = {k: v - writes0.get(k, 0) for k, v in writes1.items() if v - writes0.get(k, 0)}
    dop = {k.split("{", 1)[1].rstrip("}"): v - opw0.get(k, 0) for k, v in opw1.items() if v - opw0.get(k, 0)}
    nc = max(1, len(created))
    bind = claims.bind_ms(created)
    steady_names = [n for n in created if 10 <= claims.sched[n] - start]
    return {
        "rate_per_s": rate, "duration_s": duration, "hold_s": hold, "pool_replicas": replicas,
        "aborted_at_s": aborted, "max_backlog": max_backlog,
        "claims_created": len(created), "claims_bound": sum(1 for n in created if n in claims.bound),
        "create_failures_or_cancelled": len(claims.failed), "drained": drained, "drain_s": drain_s,
        "achieved_rate_per_s": round(len(created) / max(1e-9, schedule_end), 2),
        "launch": dict(Counter(claims.launch.get(n, "unbound") for n in created)),
        "warm_fraction": round(sum(1 for n in created if claims.launch.get(n) == "Warm") / nc, 4),
        # The pool's own refills: sandboxes with its label created during the run (a cold claim's has no pool label).
        "refills": sum(1 for t in sandboxes.added.values() if t >= start),
        "refill_created_to_ready": summary(sandboxes.refill_ms(start, sandboxes.ready)),
        "bind": summary(bind), "bind_after_10s": summary(claims.bind_ms(steady_names)),
        "e2e": summary(claims.e2e_ms(created)),
        "create_request": summary([(claims.answered[n] - claims.sent[n]) * 1000 for n in created
                                   if n in claims.answered]),
        "generator_lag": summary(claims.lag_ms(names)),
        "operator_cpu_ms_per_claim": round(cpu * 1000 / nc, 2),
        "operator_cpu_pct_mean_steady": mean(steady, "operator_cpu_pct"),
        # Runnable but waiting for a core (the shared machine): near 0 on a quiet machine; at 50 % and up the
        # operator could not have used the CPU it needed, and the run measures the machine more than Corral.
        "operator_runq_wait_pct_mean_steady": mean(steady, "operator_runq_wait_pct"),
        "operator_rss_mib": {"first": rows[0]["operator_rss_mib"] if rows else None,
                             "last": rows[-1]["operator_rss_mib"] if rows else None,
                             "max": max((r["operator_rss_mib"] for r in rows), default=None),
                             "growth_steady_mib": round(rss_growth, 2),
                             "slope_2nd_half_mib_per_min": round(slope_per_min(
                                 [r["t"] for r in half], [r["operator_rss_mib"] for r in half]), 2)},
        "backlog": {"mean_steady": mean(steady, "backlog"), "max": max((r["backlog"] for r in rows), default=None),
                    "growth_steady": round(backlog_growth, 2),
                    "slope_steady_per_min": round(slope_per_min([r["t"] for r in steady],
                                                                [r["backlog"] for r in steady]), 2)},
        "pool_idle_min_steady": min((r["pool_idle"] for r in steady), default=None),
        "cpu_pct_mean_steady": {k: mean(steady, k) for k in (rows[0] if rows else {}) if k.endswith("_cpu_pct")},
        # Each process's CPU per claim in the steady part (ms): what a claim costs the API server, etcd, the
        # scheduler, kwok etc. beside the operator; the capacity model's inputs. Meaningful while the run keeps up.
        "cpu_ms_per_claim_steady": {k.removesuffix("_pct"): round(mean(steady, k) * 10 / rate, 2)
                                    for k in (rows[0] if rows else {}) if k.endswith("_cpu_pct")},
        "machine_busy_pct_mean_steady": mean(steady, "machine_busy_pct"),
        "load1_mean": mean(rows, "load1"),
        "run_s": round(run_s, 1),
        "api_writes_per_claim_all_clients": round(sum(dw.values()) / nc, 2),
        "api_writes_by_resource_all_clients": dict(sorted(dw.items())),
        "operator_writes_per_claim": round(sum(dop.values()) / nc, 2),
        "sandbox_status_writes_per_claim": round(sum(v for k, v in dop.items() if '"Sandbox/status"' in k) / nc, 2),
        "operator_writes_by_resource": dop,
        "api_codes": dict(api.codes),
        "series": rows,
    }
