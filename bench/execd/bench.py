"""execd benchmarks, all measured in one run: exec round trip (execd on loopback, execd in a container, and
`docker exec` as the baseline), upload/download throughput, paging a 100k-entry tree, bundle start-up.

    .venv/bin/python bench/execd/bench.py [--n 300] [--size-mb 256] [--out bench/execd/results]

Writes <out>/execd-bench.json and <out>/execd-bench.png. Goals (issue): exec p50 < 3 ms on loopback and >= 10x faster
than `docker exec`; transfers > 300 MB/s on loopback.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
from corral.execd.local import free_port  # noqa: E402
from corral.execd.local import start as start_daemon  # noqa: E402

MB = 1 << 20
TOKEN = "bench-" + os.urandom(8).hex()
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def stats(samples_s: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples_s)
    pick = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]  # noqa: E731
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 3), "p90_ms": round(pick(0.90), 3),
            "p99_ms": round(pick(0.99), 3), "min_ms": round(ms[0], 3), "mean_ms": round(statistics.fmean(ms), 3)}


def timed(fn, n: int, warmup: int = 10) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def exec_roundtrip(url: str, n: int) -> dict[str, dict[str, float]]:
    """Sequential requests on one kept-alive connection. The lean stdlib client measures the daemon; the httpx row
    shows what a typical Python client adds on top."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)

    def call(method: str, path: str, body: dict | None = None):
        def go():
            payload = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=payload, headers={**HEADERS, "Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            assert resp.status == 200, data
            if body is not None:
                assert json.loads(data)["exit_code"] == 0, data
        return go

    out = {
        "health": stats(timed(call("GET", "/v1/health"), n)),
        "exec_argv_true": stats(timed(call("POST", "/v1/command", {"argv": ["true"]}), n)),
        "exec_sh_echo": stats(timed(call("POST", "/v1/command", {"command": "echo hi"}), n)),
    }
    conn.close()
    with httpx.Client(base_url=url, headers=HEADERS, timeout=60) as c:
        out["exec_argv_true_httpx_client"] = stats(
            timed(lambda: c.post("/v1/command", json={"argv": ["true"]}).raise_for_status(), n)
        )
    return out


class Source:
    """A request body of `size` bytes from one reused 1 MiB buffer (the client must not be the bottleneck)."""

    def __init__(self, size: int) -> None:
        self.left, self.block = size, os.urandom(MB)

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        take = min(self.left, MB if n < 0 else min(n, MB))
        self.left -= take
        return self.block[:take]


def transfer(port: int, path: str, size: int, rounds: int) -> dict[str, float]:
    up, down = [], []
    for _ in range(rounds):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300, blocksize=MB)
        t0 = time.perf_counter()
        conn.request("POST", f"/v1/files/upload?path={path}", body=Source(size),
                     headers={**HEADERS, "Content-Length": str(size), "Content-Type": "application/octet-stream"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
        up.append(size / (time.perf_counter() - t0) / 1e6)
        buf = bytearray(4 * MB)
        t0 = time.perf_counter()
        conn.request("GET", f"/v1/files/download?path={path}", headers=HEADERS)
        resp = conn.getresponse()
        got, view = 0, memoryview(buf)
        while n := resp.readinto(view):
            got += n
        assert got == size
        down.append(size / (time.perf_counter() - t0) / 1e6)
        conn.close()
    return {"size_mb": size / MB, "rounds": rounds, "upload_mb_s": round(statistics.median(up), 1),
            "download_mb_s": round(statistics.median(down), 1), "upload_all": [round(x, 1) for x in up],
            "download_all": [round(x, 1) for x in down]}


def listing(url: str, root: Path) -> dict[str, float]:
    for d in range(100):
        sub = root / f"d{d:03d}"
        sub.mkdir()
        for f in range(999):
            (sub / f"f{f:03d}").touch()
    with httpx.Client(base_url=url, headers=HEADERS, timeout=120) as c:
        t0 = time.perf_counter()
        cursor, entries, pages = None, 0, 0
        while True:
            params = {"path": str(root), "depth": 2, "limit": 1000, **({"cursor": cursor} if cursor else {})}
            body = c.get("/v1/directories/list", params=params).json()
            entries += len(body["entries"])
            pages += 1
            if not (cursor := body["next_cursor"]):
                break
        took = time.perf_counter() - t0
    assert entries == 100_000
    return {"entries": entries, "pages": pages, "seconds": round(took, 3), "entries_per_s": round(entries / took)}


def docker_part(n: int, tar: Path | None) -> dict:
    import docker

    from corral.execd import inject

    client = docker.from_env()
    c = client.containers.run("corral/base:bookworm", ["sleep", "infinity"], detach=True, init=True,
                              labels={"dev.corral.bench": "execd"}, ports={"44772/tcp": ("127.0.0.1", None)})
    try:
        result: dict = {"docker_exec_true": stats(timed(lambda: c.exec_run(["true"]), max(30, n // 10), warmup=3))}
        if tar is not None:
            t0 = time.perf_counter()
            inject.docker_install(c, tar)
            inject.docker_start(c, TOKEN)
            c.reload()
            port = c.attrs["NetworkSettings"]["Ports"]["44772/tcp"][0]["HostPort"]
            url = f"http://127.0.0.1:{port}"
            while True:
                try:
                    if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.01)
            result["container_install_to_health_s"] = round(time.perf_counter() - t0, 3)
            result["in_container"] = exec_roundtrip(url, n)
        return result
    finally:
        c.remove(force=True)


def bundle_startup(tar: Path, runs: int = 5) -> dict[str, float]:
    exe = tar.parent / "opt" / "corral" / "execd" / "execd"
    times = []
    for _ in range(runs):
        port = free_port()
        env = {"CORRAL_EXECD_TOKEN": TOKEN, "CORRAL_EXECD_PORT": str(port), "CORRAL_EXECD_HOST": "127.0.0.1",
               "PATH": "/usr/bin:/bin"}
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(exe)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/v1/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.005)
            times.append(time.perf_counter() - t0)
        finally:
            proc.terminate()
            proc.wait(10)
    return {"runs": runs, "median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3)}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.5))
    labels, values = [], []
    for label, key in [("execd health", ("loopback", "health")), ("execd exec true", ("loopback", "exec_argv_true")),
                       ("execd exec sh", ("loopback", "exec_sh_echo"))]:
        labels.append(label)
        values.append(result[key[0]][key[1]]["p50_ms"])
    if "in_container" in result["docker"]:
        labels.append("execd in container")
        values.append(result["docker"]["in_container"]["exec_argv_true"]["p50_ms"])
    labels.append("docker exec true")
    values.append(result["docker"]["docker_exec_true"]["p50_ms"])
    a.barh(labels, values, color=["#4c72b0"] * (len(values) - 1) + ["#c44e52"])
    a.set_xscale("log")
    a.set_xlabel("p50 round trip, ms (log)")
    a.axvline(3, ls="--", color="grey")
    a.set_title("exec round trip")
    t = result["transfer"]
    b.bar(["upload", "download"], [t["upload_mb_s"], t["download_mb_s"]], color="#55a868")
    b.axhline(300, ls="--", color="grey")
    b.set_ylabel("MB/s")
    b.set_title(f"{t['size_mb']:.0f} MiB over loopback (median of {t['rounds']})")
    lst = result["listing"]
    c.bar(["100k tree, limit=1000"], [lst["seconds"]], color="#8172b2")
    c.set_ylabel("seconds for all pages")
    c.set_title(f"{lst['entries_per_s']:,} entries/s, {lst['pages']} pages")
    fig.suptitle(f"corral execd bench — {result['host']['cpus']} CPUs, {result['when']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "execd" / "results")
    ap.add_argument("--no-docker", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    from corral.execd.bundle import ensure_bundle

    tar = ensure_bundle()
    base = Path(tempfile.mkdtemp(prefix="execd-bench-"))
    (base / "ws").mkdir()
    port = free_port()
    env = {**os.environ, "CORRAL_EXECD_TOKEN": TOKEN, "CORRAL_EXECD_PORT": str(port), "CORRAL_EXECD_HOST": "127.0.0.1",
           "CORRAL_EXECD_WORKSPACE": str(base / "ws"), "CORRAL_EXECD_ROOTS": str(base)}
    proc = start_daemon(env, port, base / "execd.log")
    url = f"http://127.0.0.1:{port}"
    result: dict = {"when": time.strftime("%Y-%m-%d %H:%M"), "host": {
        "cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg()}}
    try:
        result["loopback"] = exec_roundtrip(url, args.n)
        print("exec:", json.dumps(result["loopback"]), flush=True)
        result["transfer"] = transfer(port, str(base / "ws" / "blob"), args.size_mb * MB, args.rounds)
        print("transfer:", json.dumps(result["transfer"]), flush=True)
        (base / "tree").mkdir()
        result["listing"] = listing(url, base / "tree")
        print("listing:", json.dumps(result["listing"]), flush=True)
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(base, ignore_errors=True)
    result["bundle_startup"] = bundle_startup(tar)
    print("bundle start-up:", json.dumps(result["bundle_startup"]), flush=True)
    result["docker"] = {} if args.no_docker else docker_part(args.n, tar)
    print("docker:", json.dumps(result["docker"]), flush=True)
    if result["docker"]:
        d50 = result["docker"]["docker_exec_true"]["p50_ms"]
        result["speedup_vs_docker_exec"] = {
            "loopback": round(d50 / result["loopback"]["exec_argv_true"]["p50_ms"], 1),
            **({"in_container": round(d50 / result["docker"]["in_container"]["exec_argv_true"]["p50_ms"], 1)}
               if "in_container" in result["docker"] else {}),
        }
    result["host"]["loadavg_at_end"] = os.getloadavg()
    (args.out / "execd-bench.json").write_text(json.dumps(result, indent=2) + "\n")
    if result["docker"]:
        plot(result, args.out / "execd-bench.png")
    print(f"wrote {args.out}/execd-bench.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
