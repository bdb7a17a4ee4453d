"""Claims on Kubernetes: warm claim latency (sequential and a 300-claim burst), cold claim latency, time to fill a
300-sandbox pool, API writes per warm claim, and operator RSS with 1,000 sandboxes.

Needs the local control plane (scripts/cluster.sh up); starts its own operator process. Latency is measured from
watch timestamps: the time this process receives the claim's ADDED event to the time it receives the event that
shows it Bound. Writes JSON and a PNG into bench/claims_k8s/results/.

    .venv/bin/python bench/claims_k8s/bench.py [--kubeconfig PATH] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.operators import not_exists
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "results"
SandboxTemplate = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxTemplate", "sandboxtemplates")
WarmPool = create_namespaced_resource("corral.dev", "v1alpha1", "WarmPool", "warmpools")
SandboxClaim = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxClaim", "sandboxclaims")
Sandbox = create_namespaced_resource("corral.dev", "v1alpha1", "Sandbox", "sandboxes")
L_POOL, L_CLAIM = "corral.dev/pool", "corral.dev/claim"


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def summary(ms: list[float]) -> dict[str, float]:
    return {"n": len(ms), "p50_ms": pct(ms, 50), "p90_ms": pct(ms, 90), "p99_ms": pct(ms, 99),
            "mean_ms": statistics.fmean(ms), "max_ms": max(ms)}


class Operator:
    def __init__(self, kubeconfig: str, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {**os.environ, "KUBECONFIG": kubeconfig, "CORRAL_TOKEN_SECRET": "bench",
               "CORRAL_METRICS_PORT": str(self.port)}
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            health = s.getsockname()[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "corral.operator", "--standalone",
                                      f"--liveness=http://127.0.0.1:{health}/healthz"], env=env,
                                     stdout=log.open("wb"), stderr=subprocess.STDOUT)
        for _ in range(300):
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError("operator did not start")

    def writes(self) -> dict[str, float]:
        out = {}
        for line in httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text.splitlines():
            if line.startswith("corral_api_requests_total") and any(
                    f'verb="{v}"' in line for v in ("create", "patch", "delete")):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU the operator process has used so far."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class ClaimWatch:
    """Receive times of each claim's ADDED event and of the first event showing it Bound."""

    def __init__(self, client: Client, ns: str) -> None:
        self.added: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.launch: dict[str, str] = {}
        self.cond = threading.Condition()
        threading.Thread(target=self._run, args=(client, ns), daemon=True).start()
        time.sleep(0.3)

    def _run(self, client: Client, ns: str) -> None:
        for _event, obj in client.watch(SandboxClaim, namespace=ns):
            now = time.perf_counter()
            name = obj.metadata.name
            with self.cond:
                self.added.setdefault(name, now)
                st = obj.get("status") or {}
                if st.get("phase") == "Bound" and name not in self.bound:
                    self.bound[name] = now
                    self.launch[name] = st.get("launchType")
                    self.cond.notify_all()

    def wait(self, names: list[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(n in self.bound for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{sum(n in self.bound for n in names)}/{len(names)} bound")
                self.cond.wait(left)

    def latencies_ms(self, names: list[str]) -> list[float]:
        return [(self.bound[n] - self.added[n]) * 1000 for n in names]


def claim(name: str, pool: str) -> object:
    return SandboxClaim.from_dict({"metadata": {"name": name}, "spec": {"poolRef": {"name": pool}}})


def wait_ready(client: Client, ns: str, pool: str, n: int, timeout: float) -> float:
    """Seconds until the pool has n ready, unclaimed sandboxes (counted from the sandboxes themselves: the operator
    coalesces routine WarmPool status writes, so the status can lag by a second)."""
    t0 = time.monotonic()
    while True:
        ready = sum(1 for s in client.list(Sandbox, namespace=ns, labels={L_POOL: pool, L_CLAIM: not_exists()})
                    if not s.metadata.deletionTimestamp and any(
                        c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (s.get("status") or {}).get("conditions") or []))
        if ready >= n:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{pool}: {ready}/{n} ready")
        time.sleep(0.25)


async def apiserver_ceiling(kubeconfig: str, ns: str, n: int) -> dict[str, float]:
    """What the control plane alone allows for a burst: n claim creates, then the claim path's two writes per claim
    (a merge patch + a status merge patch) with 64 in flight, through the operator's own HTTP client, from a process
    that does nothing else (the operator is not running yet). Burst latency cannot beat this."""
    from corral.operator.kube import FastHttp

    fast = FastHttp.from_kubeconfig(KubeConfig.from_file(kubeconfig))
    base = f"/apis/corral.dev/v1alpha1/namespaces/{ns}/sandboxclaims"
    names = [f"ceiling-{i:04d}" for i in range(n)]
    sem = asyncio.Semaphore(64)
    merge = "application/merge-patch+json"

    async def one(method: str, path: str, body: object = None, ctype: str = "application/json") -> None:
        async with sem:
            await fast.request(method, path, body, content_type=ctype)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one("POST", base, {"apiVersion": "corral.dev/v1alpha1", "kind": "SandboxClaim",
                                                   **claim(x, "none").to_dict()}) for x in names))
        t1 = time.perf_counter()
        await asyncio.gather(*(one("PATCH", f"{base}/{x}", {"metadata": {"labels": {"bench": "1"}}}, merge)
                               for x in names))
        await asyncio.gather(*(one("PATCH", f"{base}/{x}/status", {"status": {"phase": "Bound"}}, merge)
                               for x in names))
        t2 = time.perf_counter()
        await asyncio.gather(*(one("DELETE", f"{base}/{x}") for x in names))
    finally:
        await fast.close()
    return {"claims": n, "creates_per_s": round(n / (t1 - t0)), "claim_path_writes_per_s": round(2 * n / (t2 - t1)),
            "claim_path_seconds": round(t2 - t1, 2)}


async def create_concurrently(kubeconfig: str, ns: str, objs: list) -> None:
    client = AsyncClient(config=KubeConfig.from_file(kubeconfig), field_manager="corral-bench")
    try:
        await asyncio.gather(*(client.create(o, namespace=ns) for o in objs))
    finally:
        await client.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    default_kubeconfig = str(Path.home() / ".cache/corral/run/cluster/kubeconfig")
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", default_kubeconfig))
    ap.add_argument("--quick", action="store_true", help="smaller numbers, for a smoke run")
    ap.add_argument("--out", type=Path, default=OUT, help="results directory (default: bench/claims_k8s/results)")
    args = ap.parse_args()
    out = args.out
    seq_n, burst_n, cold_n, fill_n, rss_n = (20, 50, 5, 50, 100) if args.quick else (100, 300, 20, 300, 1000)
    out.mkdir(parents=True, exist_ok=True)
    load_start = list(os.getloadavg())  # 1/5/15-minute load: the machine is shared, so figures are noisy
    client = Client(config=KubeConfig.from_file(args.kubeconfig), field_manager="corral-bench")
    from corral.api.crd import load_committed

    for crd in load_committed():
        client.apply(CustomResourceDefinition.from_dict(crd), force=True)
    for crd in load_committed():
        client.wait(CustomResourceDefinition, crd["metadata"]["name"], for_conditions=["Established"])
    # After a CRD (re)apply the server answers 429 "storage is (re)initializing" for a moment: start once it lists.
    for _ in range(100):
        try:
            list(client.list(SandboxClaim, namespace="default"))
            break
        except Exception:  # noqa: BLE001
            time.sleep(0.2)
    # A previous run's namespace (1,000 sandboxes and pods), or a test run's, may still be terminating: its deletion
    # events would land in this run's figures (and in the operator's RSS). Start on a quiet cluster.
    for _ in range(600):
        if not [n for n in client.list(Namespace) if n.metadata.name.startswith(("bench-", "perf-", "t-", "api-"))]:
            break
        time.sleep(1)
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    client.create(Namespace(metadata=ObjectMeta(name=ns)))
    ceiling = asyncio.run(apiserver_ceiling(args.kubeconfig, ns, burst_n))
    print("apiserver_ceiling", ceiling, flush=True)
    op = Operator(args.kubeconfig, out / "operator.log")
    results: dict[str, object] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()},
        "note": "kwok fake nodes: pods become Ready without running containers; latency excludes image pulls",
        "apiserver_ceiling": ceiling,
    }
    try:
        sandbox = {"name": "sandbox", "image": "corral/python:bookworm", "command": ["sleep", "infinity"]}
        client.create(SandboxTemplate.from_dict({"metadata": {"name": "py"}, "spec": {"podTemplate": {"spec": {
            "containers": [sandbox]}}}}), namespace=ns)
        watch = ClaimWatch(client, ns)

        # 1. time to fill a pool
        client.create(WarmPool.from_dict({"metadata": {"name": "fill"},
                                          "spec": {"replicas": fill_n, "templateRef": {"name": "py"}}}), namespace=ns)
        results["fill"] = {"sandboxes": fill_n, "seconds": round(wait_ready(client, ns, "fill", fill_n, 900), 2)}
        print("fill", results["fill"], flush=True)

        # 2. sequential warm claims (the pool is big enough that every claim finds a ready sandbox)
        writes0 = op.writes()
        names = []
        for i in range(seq_n):
            name = f"seq-{i:04d}"
            client.create(claim(name, "fill"), namespace=ns)
            watch.wait([name], 60)
            names.append(name)
        writes1 = op.writes()
        lat = watch.latencies_ms(names)
        claim_path = sum(v - writes0.get(k, 0) for k, v in writes1.items()
                         if 'resource="SandboxClaim/status"' in k or 'resource="Sandbox",verb="patch"' in k)
        wait_ready(client, ns, "fill", fill_n, 900)
        time.sleep(2)  # the refill's last (coalesced) status writes
        writes2 = op.writes()  # the refill waits for the end of the stream: count it up to the refilled pool
        total = sum(v - writes0.get(k, 0) for k, v in writes2.items())
        results["warm_sequential"] = {**summary(lat), "launch": sorted(set(watch.launch[n] for n in names)),
                                      "api_writes_per_claim_claim_path": round(claim_path / seq_n, 2),
                                      "api_writes_per_claim_incl_refill": round(total / seq_n, 2),
                                      "api_writes_by_resource": {k.split("{", 1)[1].rstrip("}"): v - writes0.get(k, 0)
                                                                 for k, v in writes2.items() if v - writes0.get(k, 0)}}
        print("warm_sequential", results["warm_sequential"], flush=True)

        # 2b. warm claims spaced out (0.5 s apart): the refill after each claim is done before the next one, as
        # for a fleet claiming at a moderate rate. Back-to-back claims (above) share 2 cores with ~10 refill writes
        # each.
        spaced = []
        for i in range(seq_n // 2):
            name = f"spaced-{i:04d}"
            client.create(claim(name, "fill"), namespace=ns)
            watch.wait([name], 60)
            spaced.append(name)
            time.sleep(0.5)
        results["warm_spaced"] = {**summary(watch.latencies_ms(spaced)),
                                  "launch": sorted(set(watch.launch[n] for n in spaced))}
        print("warm_spaced", results["warm_spaced"], flush=True)
        wait_ready(client, ns, "fill", fill_n, 900)

        # 3. burst of warm claims against a pool of the same size
        burst = [f"burst-{i:04d}" for i in range(burst_n)]
        cpu0 = op.cpu_seconds()
        asyncio.run(create_concurrently(args.kubeconfig, ns, [claim(n, "fill") for n in burst]))
        watch.wait(burst, 600)
        cpu = op.cpu_seconds() - cpu0  # the claims, and whatever refill started before the last one was bound
        lat = watch.latencies_ms(burst)
        results["warm_burst"] = {**summary(lat), "warm": sum(watch.launch[n] == "Warm" for n in burst),
                                 "operator_cpu_ms_per_claim": round(cpu * 1000 / burst_n, 2)}
        print("warm_burst", results["warm_burst"], flush=True)
        wait_ready(client, ns, "fill", fill_n, 900)  # cold claims measured alone, not behind a 300-sandbox refill

        # 4. cold claims (a pool with no ready sandboxes)
        client.create(WarmPool.from_dict({"metadata": {"name": "empty"},
                                          "spec": {"replicas": 0, "templateRef": {"name": "py"}}}), namespace=ns)
        cold = []
        for i in range(cold_n):
            name = f"cold-{i:04d}"
            client.create(claim(name, "empty"), namespace=ns)
            watch.wait([name], 120)
            cold.append(name)
        results["cold_sequential"] = {**summary(watch.latencies_ms(cold)),
                                      "launch": sorted(set(watch.launch[n] for n in cold))}
        print("cold_sequential", results["cold_sequential"], flush=True)

        # 5. operator memory with many sandboxes
        taken = seq_n + seq_n // 2 + burst_n + cold_n  # claimed sandboxes; the fill pool keeps fill_n idle
        target = max(0, rss_n - fill_n - taken)
        client.create(WarmPool.from_dict({"metadata": {"name": "big"},
                                          "spec": {"replicas": target, "templateRef": {"name": "py"}}}), namespace=ns)
        time.sleep(2)
        deadline = time.monotonic() + 1200
        while len(list(client.list(Sandbox, namespace=ns))) < rss_n and time.monotonic() < deadline:
            time.sleep(5)
        if target > 0:
            wait_ready(client, ns, "big", target, 1200)
        sandboxes = len(list(client.list(Sandbox, namespace=ns)))
        results["operator_rss"] = {"sandboxes": sandboxes, "rss_mib": round(op.rss_mib(), 1)}
        print("operator_rss", results["operator_rss"], flush=True)
    finally:
        op.stop()
        client.delete(Namespace, ns)

    results["load_average"] = {"start": load_start, "end": list(os.getloadavg())}
    results["goals"] = {
        "warm_p50_under_25ms (back-to-back)": results["warm_sequential"]["p50_ms"] < 25,
        "warm_p99_under_100ms (back-to-back)": results["warm_sequential"]["p99_ms"] < 100,
        "warm_p50_under_25ms (spaced)": results["warm_spaced"]["p50_ms"] < 25,
        "warm_p99_under_100ms (spaced)": results["warm_spaced"]["p99_ms"] < 100,
        "burst_p90_under_500ms": results["warm_burst"]["p90_ms"] < 500,
        "at_most_3_writes_per_warm_claim": results["warm_sequential"]["api_writes_per_claim_claim_path"] <= 3,
        "rss_under_200mib_with_1000": results["operator_rss"]["rss_mib"] < 200,
    }
    (out / "claims-k8s.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out / "claims-k8s.png")
    print(json.dumps(results["goals"], indent=2))


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = [("warm seq", results["warm_sequential"]), ("warm spaced", results["warm_spaced"]),
            ("warm burst", results["warm_burst"]),
            ("cold seq", results["cold_sequential"])]
    x = range(len(rows))
    for i, q in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        ax1.bar([j + i * 0.27 for j in x], [r[q] for _, r in rows], width=0.27, label=q.replace("_ms", ""))
    ax1.set_xticks([j + 0.27 for j in x], [n for n, _ in rows])
    ax1.set_yscale("log")
    ax1.set_ylim(top=max(r["p99_ms"] for _, r in rows) * 20)  # room for the legend
    ax1.set_ylabel("claim created -> Bound (ms)")
    ax1.axhline(25, color="grey", linestyle=":", label="warm p50 goal")
    ceiling = results.get("apiserver_ceiling") or {}
    if ceiling.get("claim_path_seconds"):  # the burst's claim-path writes through the control plane alone
        ax1.scatter([2.27], [ceiling["claim_path_seconds"] * 1000], marker="_", s=900, color="black", zorder=3,
                    label="burst writes, control plane alone")
    ax1.legend(fontsize=7, loc="upper left")
    ax2.bar(["fill s", "writes/claim", "RSS MiB"],
            [results["fill"]["seconds"], results["warm_sequential"]["api_writes_per_claim_claim_path"],
             results["operator_rss"]["rss_mib"]])
    ax2.set_title(f"fill {results['fill']['sandboxes']} | RSS at {results['operator_rss']['sandboxes']} sandboxes")
    fig.suptitle("Corral claims on Kubernetes (kube-apiserver + kwok, 2 cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
