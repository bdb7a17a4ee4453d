"""bench/claims_kind: what a user of a real cluster waits for, next to the local Docker stack in the same run.

    .venv/bin/python bench/claims_kind/bench.py [--warm 30] [--cold 6] [--keep]
    -> bench/claims_kind/results/claims-kind.{json,png}

On kind (a real kubelet and containerd; `scripts/kind.sh up corral-bench`, `pulumi up --stack dev` with the cluster
tier's sizes), through `kubectl port-forward` to the claims API Service, as the README's Kubernetes path does:
  - warm claim -> first command output (claim POST until `echo hi` has answered through the execd proxy);
  - cold claim from a Pool with no idle buffer (a real pod start), split into Corral's part and the node's part
    from the pod's own watch events: claim -> pod created (operator: claim, Sandbox, pod), pod created -> init
    container done (kubelet: sandbox, execd copied in), -> Ready (execd up and the readiness probe's next period),
    Ready -> claim answered (operator sees Ready, binds, client sees it), then the first command;
  - pool fill: a WarmPool of 3 from empty to 3 Ready.
The same three figures on the Docker runtime (bench/claims_docker's operator, host process) in the same run.
Goal (issue 14): warm claim -> output p50 under 50 ms through the port-forward.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(REPO / "tests" / "cluster"))

from clusterutil import STACK_CONFIG, KindCluster, host_sysctls, tool_env  # noqa: E402

CLUSTER = "corral-bench"
NS = "corral-sandboxes"


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader
    spec.loader.exec_module(mod)
    return mod


docker_bench = load(REPO / "bench" / "claims_docker" / "bench.py", "claims_docker_bench")
summary = docker_bench.summary


def sh(*args: str, env: dict | None = None, timeout: float = 3600, cwd: Path | None = None) -> str:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**tool_env(), **(env or {})})
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout.strip()


class PodWatch:
    """Arrival times (perf_counter) of each sandbox pod's milestones, from `kubectl get pods --watch` on the sandbox
    namespace: created, init container terminated, Ready."""

    def __init__(self, cluster: KindCluster):
        self.events: dict[str, dict[str, float]] = {}
        self.proc = subprocess.Popen(["kubectl", "--kubeconfig", cluster.kubeconfig, "-n", NS, "get", "pods",
                                      "--watch", "--output-watch-events", "-o", "json"],
                                     stdout=subprocess.PIPE, text=True, env=tool_env())
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout
        buf = ""
        depth = 0
        for line in self.proc.stdout:   # kubectl prints one pretty JSON object per event
            buf += line
            depth += line.count("{") - line.count("}")
            if depth == 0 and buf.strip():
                now = time.perf_counter()
                obj = json.loads(buf)["object"]
                buf = ""
                name = obj["metadata"]["name"]
                seen = self.events.setdefault(name, {"created": now})
                status = obj.get("status") or {}
                if any((s.get("state") or {}).get("terminated") for s in status.get("initContainerStatuses") or []):
                    seen.setdefault("initialized", now)
                if any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or []):
                    seen.setdefault("ready", now)

    def close(self) -> None:
        self.proc.terminate()


def kind_figures(args, cluster: KindCluster, project: Path, env: dict) -> dict:
    from corral.client import Client

    out = json.loads(sh("pulumi", "stack", "output", "--stack", "dev", "--json", "--show-secrets", env=env,
                        cwd=project))
    watch = PodWatch(cluster)
    res: dict = {}
    with cluster.port_forward("corral-system", f"svc/{out['controllerService']}-api", 7780) as port, \
            Client(url=f"http://127.0.0.1:{port}", token=out["apiToken"], timeout=300) as client:
        def wait_ready(n: int) -> None:
            deadline = time.monotonic() + 600
            while next((p.ready for p in client.pools() if p.name == "python"), 0) < n:
                assert time.monotonic() < deadline, "the python WarmPool did not fill"
                time.sleep(0.2)

        wait_ready(3)
        warm = []
        for i in range(args.warm + 3):
            t0 = time.perf_counter()
            sbx = client.claim(pool="python")
            r = sbx.commands.run("echo hi")
            dt = (time.perf_counter() - t0) * 1000
            assert r.stdout == "hi\n" and sbx.claim.launch_type == "warm", (r.stdout, sbx.claim.launch_type)
            client.release(sbx.name)
            if i >= 3:                      # the first three warm up the port-forward and the HTTP paths
                warm.append(dt)
            wait_ready(3)
        res["warm_claim_to_output"] = summary(warm)
        res["warm_samples"] = warm

        cold, parts = [], []
        for _ in range(args.cold):
            t0 = time.perf_counter()
            sbx = client.claim(pool="shell", timeout=300)
            t_ready = time.perf_counter()
            r = sbx.commands.run("echo hi")
            t_out = time.perf_counter()
            assert r.stdout == "hi\n" and sbx.claim.launch_type == "cold", (r.stdout, sbx.claim.launch_type)
            pod = watch.events.get(sbx.claim.sandbox.name if sbx.claim.sandbox else "", {})
            cold.append((t_out - t0) * 1000)
            if {"created", "initialized", "ready"} <= pod.keys():
                parts.append({"corral_claim_to_pod_created_ms": (pod["created"] - t0) * 1000,
                              "node_pod_created_to_init_done_ms": (pod["initialized"] - pod["created"]) * 1000,
                              "node_init_done_to_ready_ms": (pod["ready"] - pod["initialized"]) * 1000,
                              "corral_ready_to_claim_answered_ms": (t_ready - pod["ready"]) * 1000,
                              "first_command_ms": (t_out - t_ready) * 1000})
            client.release(sbx.name)
        res["cold_claim_to_output"] = summary(cold)
        res["cold_samples"] = cold
        res["cold_breakdown_p50_ms"] = {k: round(statistics.median(p[k] for p in parts), 1)
                                        for k in (parts[0] if parts else {})}

        fills = []
        for _ in range(args.fills):
            cluster.kubectl("-n", NS, "scale", "warmpool", "python", "--replicas=0")
            deadline = time.monotonic() + 300
            while [p for p in cluster.json("-n", NS, "get", "pods", "-l", "corral.dev/pool=python")["items"]
                   if not (p["metadata"].get("labels") or {}).get("corral.dev/claim")]:
                assert time.monotonic() < deadline
                time.sleep(0.5)
            t0 = time.perf_counter()
            cluster.kubectl("-n", NS, "scale", "warmpool", "python", "--replicas=3")
            wait_ready(3)
            fills.append((time.perf_counter() - t0) * 1000)
        res["pool_fill_3"] = summary(fills)
    watch.close()
    return res


def docker_figures(args) -> dict:
    op = docker_bench.Operator(3)
    res: dict = {}
    try:
        t0 = time.perf_counter()
        op.wait_idle("warm", 3)
        res["pool_fill_3"] = summary([(time.perf_counter() - t0) * 1000])
        for _ in range(3):
            _, name, _ = op.claim_to_output("warm")
            op.http.delete(f"/v1/claims/{name}")
            op.wait_idle("warm", 3)
        warm = []
        for _ in range(args.warm):
            dt, name, launch = op.claim_to_output("warm")
            assert launch == "warm"
            warm.append(dt)
            op.http.delete(f"/v1/claims/{name}")
            op.wait_idle("warm", 3)
        cold = []
        for _ in range(args.cold):
            dt, name, launch = op.claim_to_output("cold")
            assert launch == "cold"
            cold.append(dt)
            op.http.delete(f"/v1/claims/{name}")
        res.update(warm_claim_to_output=summary(warm), cold_claim_to_output=summary(cold), warm_samples=warm,
                   cold_samples=cold)
    finally:
        op.close()
    return res


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind, dock = result["kind"], result["docker"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
    a.boxplot([kind["warm_samples"], dock["warm_samples"], kind["cold_samples"], dock["cold_samples"]],
              tick_labels=["kind warm\n(port-forward)", "docker warm", "kind cold\n(real pod)", "docker cold"])
    a.set_yscale("log")
    a.set_ylabel("claim -> first command output, ms (log)")
    a.axhline(50, color="g", ls="--", lw=0.8, label="kind warm goal: p50 50 ms")
    a.legend(fontsize=8)
    parts = kind.get("cold_breakdown_p50_ms") or {}
    left = 0.0
    for label, value in parts.items():
        b.barh([0], [value], left=left, label=f"{label.removesuffix('_ms')}: {value:.0f} ms")
        left += value
    b.set_yticks([])
    b.set_xlabel("ms (p50 of each part)")
    b.set_title("a cold claim on kind: Corral's part and the node's")
    b.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.suptitle(f"Corral on kind vs the local Docker stack, {result['host']['cpus']} CPUs, "
                 f"load {result['host']['loadavg_at_start'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", type=int, default=30)
    ap.add_argument("--cold", type=int, default=6)
    ap.add_argument("--fills", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="leave the kind cluster running")
    args = ap.parse_args()
    load0 = os.getloadavg()
    env = {"CORRAL_KIND_NAME": CLUSTER}
    scripts = REPO / "scripts"
    kubeconfig = sh(str(scripts / "kind.sh"), "up", env=env).splitlines()[-1]
    cluster = KindCluster(CLUSTER, kubeconfig, host_sysctls())
    controller = sh(str(scripts / "controller-image.sh")).splitlines()[-1]
    sh(str(scripts / "kind.sh"), "load", controller, "corral/controller:0.1.0", "corral/python:bookworm",
       "corral/base:bookworm", env=env)
    import shutil
    import tempfile

    project = Path(tempfile.mkdtemp(prefix="corral-bench-kind-"))
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(REPO / "stacks", project / "stacks")
    (project / ".venv").symlink_to(REPO / ".venv")
    (project / "state").mkdir()
    penv = {"KUBECONFIG": kubeconfig, "PULUMI_BACKEND_URL": f"file://{project / 'state'}",
            "PULUMI_CONFIG_PASSPHRASE": "corral-bench"}
    try:
        sh("pulumi", "stack", "init", "dev", "--non-interactive", env=penv, cwd=project)
        # The cluster tier's sizes; and the Pool deletes what its claims release (its Restart recycling would
        # serve the next "cold" claim from the released sandbox).
        for key, value in [*STACK_CONFIG, ("corral:pools[0].recycleStrategy", "Delete")]:
            sh("pulumi", "config", "set", "--path", key, value, "--stack", "dev", env=penv, cwd=project)
        sh("pulumi", "up", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview", env=penv, cwd=project)
        kind = kind_figures(args, cluster, project, penv)
    finally:
        subprocess.run(["pulumi", "destroy", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview"],
                       cwd=project, env={**tool_env(), **penv}, capture_output=True)
        if not args.keep:
            sh(str(scripts / "kind.sh"), "down", env=env)
        shutil.rmtree(project, ignore_errors=True)
    docker = docker_figures(args)
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                 "loadavg_at_start": list(load0), "loadavg_at_end": list(os.getloadavg())},
        "setup": {"kind": "one node (scripts/kind.sh), dev stack with the cluster tier's sizes; client through "
                          "kubectl port-forward to svc/corral-api", "docker": "bench/claims_docker's operator "
                          "(host process), WarmPool of 3, shell template for cold", "command": "echo hi"},
        "kind": kind, "docker": docker,
        "goals": {"kind_warm_p50_under_ms": 50,
                  "kind_warm_p50_met": kind["warm_claim_to_output"]["p50_ms"] < 50},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "claims-kind.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, OUT / "claims-kind.png")
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if not kk.endswith("samples")}
                      for k, v in result.items() if k in ("kind", "docker")} | {"goals": result["goals"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
