"""bench/claims_docker: claim -> first command output on the Docker runtime, warm and cold, against a bare
`docker create+start` baseline (and the same plus execd's start) measured in the same run.

    .venv/bin/python bench/claims_docker/bench.py [--warm 60] [--cold 20] [--baseline 20]
    -> bench/claims_docker/results/claims-docker.{json,png}

Goals (from issue 7): warm p50 < 25 ms; cold p50 < 1.5 x baseline p50 + execd start (p50 of baseline-with-execd
minus baseline). The operator runs as a process on the host (`python -m corral.operator.docker`), like in the
docker tests; the timings are client-side wall clock, claim POST to the command's response.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "results"
IMAGE_TEMPLATE = "shell"   # corral/base: no Python in the image


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p / 100 * len(xs) + 0.5) - 1))]


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "p50_ms": round(statistics.median(xs), 2), "p90_ms": round(pct(xs, 90), 2),
            "p99_ms": round(pct(xs, 99), 2), "min_ms": round(min(xs), 2), "mean_ms": round(statistics.mean(xs), 2)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Operator:
    def __init__(self, warm_replicas: int):
        from corral.components import catalogue
        from corral.operator.docker import desired as df
        from corral.operator.docker.desired import DesiredState, docker_template

        self.stack = f"bench{secrets.token_hex(2)}"
        self.dir = Path(tempfile.mkdtemp(prefix="corral-bench-"))
        tmpl = docker_template(IMAGE_TEMPLATE, catalogue.render(IMAGE_TEMPLATE).to_k8s(),
                               network=f"corral-{self.stack}-{IMAGE_TEMPLATE}")
        self.template = tmpl
        desired = DesiredState(stack=self.stack, templates=[tmpl], warm_pools=[
            df.warm_pool(name="warm", template=IMAGE_TEMPLATE, replicas=warm_replicas),
            df.warm_pool(name="cold", template=IMAGE_TEMPLATE, replicas=0)])
        (self.dir / "pools.json").write_text(desired.dump())
        self.port, self.token = free_port(), secrets.token_hex(16)
        env = {**os.environ, "CORRAL_POOLS_FILE": str(self.dir / "pools.json"), "CORRAL_STATE_DIR": str(self.dir),
               "CORRAL_API_TOKEN": self.token, "CORRAL_API_PORT": str(self.port), "CORRAL_LOG_LEVEL": "warning"}
        self.proc = subprocess.Popen([sys.executable, "-m", "corral.operator.docker"], env=env,
                                     stdout=open(self.dir / "operator.log", "wb"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=300)
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(self.url + "/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit((self.dir / "operator.log").read_text())
            time.sleep(0.1)

    def idle_ready(self, pool: str) -> float:
        import re

        text = httpx.get(self.url + "/metrics", timeout=10).text
        m = re.search(rf'corral_pool_sandboxes{{namespace="{self.stack}",pool="{pool}",state="ready"}} ([0-9.e+]+)',
                      text)
        return float(m.group(1)) if m else 0.0

    def wait_idle(self, pool: str, n: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while self.idle_ready(pool) < n:
            if time.monotonic() > deadline:
                raise SystemExit(f"pool {pool} did not reach {n} ready")
            time.sleep(0.2)

    def claim_to_output(self, pool: str) -> tuple[float, str, str]:
        t0 = time.perf_counter()
        c = self.http.post("/v1/claims", json={"pool": pool}).json()
        r = self.http.post(f"/v1/claims/{c['name']}/execd/v1/command", json={"command": "echo hi"})
        dt = (time.perf_counter() - t0) * 1000
        assert r.status_code == 200 and r.json()["stdout"] == "hi\n", r.text
        return dt, c["name"], c["launchType"]

    def close(self) -> None:
        from corral.operator.docker import engine

        self.http.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        import docker

        engine.sweep(docker.from_env(), self.stack)
        shutil.rmtree(self.dir, ignore_errors=True)


def baselines(op: Operator, n: int) -> tuple[list[float], list[float]]:
    """Bare docker create+start (SDK, same image/command/network, port on 127.0.0.1), and the same with execd in
    (the operator's execd volume and entrypoint, until /v1/health answers): what a cold claim cannot avoid."""
    import docker

    from corral.operator.docker import engine

    client = docker.from_env()
    tmpl = op.template
    vol = next(v.name for v in client.volumes.list(filters={"label": f"{engine.L_STACK}={op.stack}"})
               if "execd" in v.name)
    bare, with_execd = [], []
    for i in range(n):
        t0 = time.perf_counter()
        c = client.containers.create(tmpl.image, ["sleep", "infinity"], detach=True, init=True,
                                     network=tmpl.network, ports={"44772/tcp": ("127.0.0.1", None)},
                                     labels=engine.stack_labels(op.stack, "bench"))
        c.start()
        bare.append((time.perf_counter() - t0) * 1000)
        c.remove(force=True)
        t0 = time.perf_counter()
        info = engine.create_sandbox(client, stack=op.stack, name=f"corral-{op.stack}-baseline-{i}", tmpl=tmpl,
                                     image=tmpl.image, token="t", execd_volume=vol, pool=None, pool_kind=None)
        while True:
            try:
                if httpx.get(f"http://{info['ip']}:44772/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        with_execd.append((time.perf_counter() - t0) * 1000)
        engine.remove(client, info["id"])
    return bare, with_execd


def plot(result: dict, samples: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = ["warm", "cold", "baseline", "baseline_execd"]
    a.boxplot([samples[n] for n in names], tick_labels=["warm claim", "cold claim", "docker\ncreate+start",
                                                    "create+start\n+ execd"], showfliers=True)
    a.set_yscale("log")
    a.set_ylabel("ms (log)")
    a.set_title("claim -> first command output")
    a.axhline(25, color="g", ls="--", lw=0.8, label="warm goal 25 ms")
    a.axhline(result["goals"]["cold_budget_ms"], color="r", ls="--", lw=0.8, label="cold budget")
    a.legend(fontsize=8)
    b.plot(sorted(samples["warm"]), label="warm")
    b.set_title(f"warm claims, sorted (p50 {result['warm']['p50_ms']} ms)")
    b.set_ylabel("ms")
    host = result["host"]
    fig.suptitle(f"Corral Docker runtime, {host['cpus']} CPUs, load {host['loadavg_at_start'][0]:.1f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", type=int, default=60)
    ap.add_argument("--cold", type=int, default=20)
    ap.add_argument("--baseline", type=int, default=20)
    ap.add_argument("--replicas", type=int, default=10)
    args = ap.parse_args()
    load0 = os.getloadavg()
    op = Operator(args.replicas)
    try:
        op.wait_idle("warm", args.replicas)
        for _ in range(3):  # warm-up of the HTTP paths (not recorded)
            _, name, _ = op.claim_to_output("warm")
            op.http.delete(f"/v1/claims/{name}")
        op.wait_idle("warm", args.replicas)
        warm: list[float] = []
        while len(warm) < args.warm:
            names = []
            for _ in range(min(args.replicas, args.warm - len(warm))):
                dt, name, launch = op.claim_to_output("warm")
                assert launch == "warm", launch
                warm.append(dt)
                names.append(name)
            for name in names:
                op.http.delete(f"/v1/claims/{name}")
            op.wait_idle("warm", args.replicas)
        cold: list[float] = []
        for _ in range(args.cold):
            dt, name, launch = op.claim_to_output("cold")
            assert launch == "cold", launch
            cold.append(dt)
            op.http.delete(f"/v1/claims/{name}")
        bare, with_execd = baselines(op, args.baseline)
    finally:
        op.close()
    execd_start = statistics.median(with_execd) - statistics.median(bare)
    budget = 1.5 * statistics.median(bare) + execd_start
    result = {
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
                 "loadavg_at_start": list(load0), "loadavg_at_end": list(os.getloadavg())},
        "setup": {"image": op.template.image, "warm_replicas": args.replicas, "command": "echo hi",
                  "operator": "host process, API on 127.0.0.1, execd reached by container IP"},
        "warm": summary(warm), "cold": summary(cold), "baseline_create_start": summary(bare),
        "baseline_create_start_execd_healthy": summary(with_execd),
        "goals": {
            "warm_p50_under_ms": 25, "warm_p50_met": statistics.median(warm) < 25,
            "execd_start_ms": round(execd_start, 2), "cold_budget_ms": round(budget, 2),
            "cold_p50_met": statistics.median(cold) < budget,
        },
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "claims-docker.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, {"warm": warm, "cold": cold, "baseline": bare, "baseline_execd": with_execd},
         OUT / "claims-docker.png")
    print(json.dumps({k: result[k] for k in ("warm", "cold", "baseline_create_start",
                                             "baseline_create_start_execd_healthy", "goals")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
