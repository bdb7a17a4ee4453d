"""SandboxBatch on the kube test bed: a batch of N against a warm pool of N, each task `sleep S` (all end together).

Measured: time from the create call to the first batch event showing all N bound; for each index, the latency from
its task's exit (execd's `finished_at`) to the first batch event that shows it ended (p50/p99); API writes of the
operator for the whole batch (all kinds, and the SandboxBatch's own); the operator's peak RSS during the batch.
Goals (issue 17): all bound under 2 s, exit -> status p99 under 250 ms, under 1.5 writes per replica beyond the
sandboxes' own (the SandboxBatch's writes plus the adoption patches).

Needs the local control plane (scripts/cluster.sh up, or a kube-tier run of scripts/test.sh); starts its own
operator and one real execd per kwok pod on the pod's loopback IP. Writes JSON and a PNG into bench/batches/results/.

    .venv/bin/python bench/batches/bench.py [--replicas 128] [--kubeconfig PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from lightkube import Client, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace, Pod

from corral.operator.tokens import claim_token, idle_token

OUT = Path(__file__).resolve().parent / "results"
SECRET = b"bench"
SandboxTemplate = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxTemplate", "sandboxtemplates")
WarmPool = create_namespaced_resource("corral.dev", "v1alpha1", "WarmPool", "warmpools")
Sandbox = create_namespaced_resource("corral.dev", "v1alpha1", "Sandbox", "sandboxes")
SandboxBatch = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxBatch", "sandboxbatches")


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p / 100 * len(s) + 0.5)) - 1))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Operator:
    def __init__(self, kubeconfig: str, log: Path) -> None:
        self.port = free_port()
        env = {**os.environ, "KUBECONFIG": kubeconfig, "CORRAL_TOKEN_SECRET": SECRET.decode(),
               "CORRAL_METRICS_PORT": str(self.port)}
        self.proc = subprocess.Popen([sys.executable, "-m", "corral.operator", "--standalone",
                                      f"--liveness=http://127.0.0.1:{free_port()}/healthz"], env=env,
                                     stdout=log.open("wb"), stderr=subprocess.STDOUT)
        for _ in range(300):
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError("operator did not start")

    def writes(self) -> tuple[float, float, float]:
        """(all API writes, SandboxBatch writes, Sandbox patches) so far."""
        total = batch = patches = 0.0
        for line in httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text.splitlines():
            if line.startswith("corral_api_requests_total") and any(
                    f'verb="{v}"' in line for v in ("create", "patch", "delete")):
                value = float(line.rpartition(" ")[2])
                total += value
                batch += value if 'resource="SandboxBatch' in line else 0
                patches += value if 'resource="Sandbox"' in line and 'verb="patch"' in line else 0
        return total, batch, patches

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class BatchWatch(threading.Thread):
    """Receive time of the first event with all N bound, and of the first event showing each index ended."""

    def __init__(self, client: Client, ns: str, name: str, replicas: int) -> None:
        super().__init__(daemon=True)
        self.client, self.ns, self.name, self.replicas = client, ns, name, replicas
        self.all_bound: float | None = None
        self.ended: dict[int, float] = {}
        self.final: dict[str, Any] | None = None

    def run(self) -> None:
        for _, obj in self.client.watch(SandboxBatch, namespace=self.ns, fields={"metadata.name": self.name}):
            now = time.time()
            st = obj.status or {}
            if self.all_bound is None and st.get("bound") == self.replicas:
                self.all_bound = now
            for e in st.get("indexes") or []:
                if e.get("phase") in ("Succeeded", "Failed"):
                    self.ended.setdefault(e["index"], now)
            if st.get("phase") in ("Succeeded", "Failed"):
                self.final = dict(st)
                return


def wait(what: str, check: Any, timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(every)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", default=os.environ.get(
        "KUBECONFIG", str(Path.home() / ".cache/corral/run/cluster/kubeconfig")))
    ap.add_argument("--replicas", type=int, default=128)
    ap.add_argument("--task-seconds", type=float, default=10.0, help=(
        "how long each task sleeps: the warm pool refills meanwhile (N sandboxes and pods: the operator's busiest "
        "moment); with 2 s the exits land in the refill"))
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    n = args.replicas
    args.out.mkdir(parents=True, exist_ok=True)
    client = Client(config=KubeConfig.from_file(args.kubeconfig), field_manager="corral-bench")
    from corral.api.crd import load_committed

    for crd in load_committed():
        client.apply(CustomResourceDefinition.from_dict(crd), force=True)
    for crd in load_committed():
        client.wait(CustomResourceDefinition, crd["metadata"]["name"], for_conditions=["Established"])
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    client.create(Namespace(metadata=ObjectMeta(name=ns)))
    op = Operator(args.kubeconfig, args.out / "operator.log")
    execds: list[subprocess.Popen[bytes]] = []
    work = Path(tempfile.mkdtemp(prefix="bench-batches-"))
    try:
        client.create(SandboxTemplate.from_dict({"metadata": {"name": "t"}, "spec": {"podTemplate": {"spec": {
            "containers": [{"name": "sandbox", "image": "corral/python:bookworm", "command": ["sleep", "inf"]}]}}}}),
            namespace=ns)
        client.create(WarmPool.from_dict({"metadata": {"name": "wp"}, "spec": {"replicas": n, "templateRef": {
            "name": "t"}}}), namespace=ns)

        def ready() -> list[Any]:
            return [s for s in client.list(Sandbox, namespace=ns) if any(c.get("type") == "Ready" and c.get(
                "status") == "True" for c in (s.status or {}).get("conditions") or [])]

        wait("pool ready", lambda: len(ready()) >= n, 600)
        urls: dict[str, str] = {}

        def sweep() -> None:
            """An execd for every ready sandbox that has none (the pool may replace one meanwhile)."""
            for s in ready():
                if s.metadata.name in urls:
                    continue
                pod = client.get(Pod, s.metadata.name, namespace=ns)
                host, _, port = s.status["endpoint"].rpartition(":")
                d = work / s.metadata.name
                d.mkdir()
                env = {**os.environ, "CORRAL_EXECD_HOST": host, "CORRAL_EXECD_PORT": port,
                       "CORRAL_EXECD_TOKEN": idle_token(SECRET, ns, s.metadata.name, pod.metadata.uid),
                       "CORRAL_EXECD_WORKSPACE": str(d)}
                execds.append(subprocess.Popen([sys.executable, "-m", "corral.execd"], env=env,
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                urls[s.metadata.name] = f"http://{s.status['endpoint']}"

        sweep()

        def answering() -> bool:
            for url in urls.values():
                try:
                    httpx.get(f"{url}/v1/health", timeout=1)
                except httpx.TransportError:
                    return False
            return True

        wait("execd up", answering, 300)
        time.sleep(3)  # let the pool's status writes settle
        sweep()
        wait("execd up", answering, 300)
        w0, b0, p0 = op.writes()
        watch = BatchWatch(client, ns, "bench", n)
        watch.start()
        rss: list[float] = []
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                rss.append(op.rss_mib())
                time.sleep(0.2)

        threading.Thread(target=sample, daemon=True).start()
        t0 = time.time()
        client.create(SandboxBatch.from_dict({"metadata": {"name": "bench"}, "spec": {
            "poolRef": {"name": "wp"}, "replicas": n,
            "task": {"command": f"sleep {args.task_seconds}", "timeoutSeconds": 600},
            "lifecycle": {"shutdownPolicy": "Retain"}}}),  # kept, to read each command's exit time afterwards
            namespace=ns)
        deadline = time.monotonic() + 600
        while watch.is_alive() and time.monotonic() < deadline:
            sweep()  # cheap when nothing is missing: one list
            watch.join(1.0)
        sampling.set()
        assert watch.final is not None and watch.all_bound is not None, "the batch did not finish"
        time.sleep(2)  # writes still in flight (the pool's refill is not the batch's: counted apart below)
        w1, b1, p1 = op.writes()
        batch_uid = client.get(SandboxBatch, "bench", namespace=ns).metadata.uid
        latencies: list[float] = []
        finished: list[float] = []
        for e in watch.final["indexes"]:
            sb = e["sandbox"]
            token = claim_token(SECRET, ns, sb, client.get(Sandbox, sb, namespace=ns).metadata.uid, batch_uid)
            cmd = httpx.get(f"{urls[sb]}/v1/command/{e['commandId']}", timeout=5,
                            headers={"Authorization": f"Bearer {token}"}).json()
            latencies.append((watch.ended[e["index"]] - cmd["finished_at"]) * 1000)
            finished.append(cmd["finished_at"])
        results = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()},
            "note": "kwok pods, a real execd per pod on its loopback IP; one run",
            "replicas": n, "task_seconds": args.task_seconds, "phase": watch.final["phase"],
            "succeeded": watch.final["succeeded"],
            "all_bound_s": round(watch.all_bound - t0, 3),
            "exit_to_status_ms": {"p50": round(pct(latencies, 50), 1), "p99": round(pct(latencies, 99), 1),
                                  "max": round(max(latencies), 1)},
            "batch_writes": b1 - b0, "adoption_patches": p1 - p0,
            "writes_per_replica_beyond_sandboxes": round((b1 - b0 + p1 - p0) / n, 3),
            "all_operator_writes": w1 - w0, "operator_rss_peak_mib": round(max(rss), 1),
        }
        print("exits from", time.strftime("%H:%M:%S", time.localtime(min(finished))), f"{min(finished) % 1:.3f}",
              "to", f"{max(finished) % 1:.3f}", "; first seen ended", f"{min(watch.ended.values()) % 1:.3f}")
        print(json.dumps(results, indent=2))
        (args.out / "batches.json").write_text(json.dumps(results, indent=2) + "\n")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        ax.hist(latencies, bins=30)
        ax.axvline(250, color="red", linestyle="--", label="goal p99 250 ms")
        ax.set_xlabel("task exit -> seen in the batch's status (ms)")
        ax.set_ylabel("tasks")
        ax.set_title(f"SandboxBatch of {n}: all bound in {results['all_bound_s']} s, "
                     f"{results['writes_per_replica_beyond_sandboxes']} writes/replica")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out / "batches.png", dpi=100)
    finally:
        for p in execds:
            p.terminate()
        op.stop()
        client.delete(Namespace, ns)


if __name__ == "__main__":
    main()
