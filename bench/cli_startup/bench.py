"""CLI start-up: how long `corral --help` takes, now and at a baseline revision, with the interpreter's own start-up
and the SDK's import beside it.

    .venv/bin/python bench/cli_startup/bench.py [--n 30] [--baseline 96bf172] [--out bench/cli_startup/results]

Each case is a fresh process, run --n times after 3 warm-ups; wall time and CPU time (user + sys, from the
children's rusage) are recorded, since a busy machine stretches the first and barely the second. The baseline is
the same launcher as the `corral` console script on the sources of another git revision (`git archive`, put first on
PYTHONPATH, same venv). Writes <out>/cli-startup.json and <out>/cli-startup.png. Goal (issue 16): `corral --help`
under 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PARTS = ("api", "client", "components", "execd", "operator")
GOAL_S = 0.3
LAUNCHER = "import sys\nfrom corral.client.cli import app\nsys.exit(app())\n"  # what pip's console script runs


def measure(argv: list[str], n: int, env: dict[str, str] | None = None) -> dict[str, float]:
    def once() -> tuple[float, float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, env=env, cwd=tempfile.gettempdir(), check=False)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
        return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    for _ in range(3):
        once()
    walls, cpus = zip(*(once() for _ in range(n)), strict=True)
    return {"n": n, "wall_p50_s": round(statistics.median(walls), 3), "wall_min_s": round(min(walls), 3),
            "cpu_p50_s": round(statistics.median(cpus), 3), "cpu_min_s": round(min(cpus), 3)}


def top_imports(argv: list[str], env: dict[str, str] | None = None, k: int = 8) -> list[list]:
    """The k slowest top-level imports (cumulative ms) of one run, from `python -X importtime`."""
    proc = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True, text=True, env=env,
                          cwd=tempfile.gettempdir(), check=False)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|")
        if not name.startswith("  "):  # imported by the program itself, not by another module
            rows.append([name.strip(), round(int(cumulative) / 1000, 1)])
    return sorted(rows, key=lambda r: -r[1])[:k]


def baseline_tree(rev: str, into: Path) -> str:
    """Sources of `rev` laid out as an importable `corral` namespace package under `into`; returns the full hash."""
    full = subprocess.run(["git", "rev-parse", rev], cwd=REPO, capture_output=True, text=True, check=True).stdout
    archive = subprocess.run(["git", "archive", rev, *PARTS], cwd=REPO, capture_output=True, check=True).stdout
    (into / "corral").mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into / "corral")], input=archive, check=True)
    return full.strip()


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(result["cases"])
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(cases) + 1.8))
    y = range(len(cases))
    ax.barh([i + 0.2 for i in y], [result["cases"][c]["wall_p50_s"] for c in cases], height=0.4, color="#4c72b0",
            label="wall, p50")
    ax.barh([i - 0.2 for i in y], [result["cases"][c]["cpu_p50_s"] for c in cases], height=0.4, color="#55a868",
            label="CPU (user + sys), p50")
    ax.set_yticks(list(y), cases)
    ax.invert_yaxis()
    ax.axvline(GOAL_S, ls="--", color="grey", label=f"goal {GOAL_S} s")
    ax.set_xlabel("seconds")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
    load = result["host"]["loadavg_at_start"][0]
    ax.set_title(f"corral CLI start-up, {result['n']} runs each — {result['host']['cpus']} CPUs, load {load:.1f}, "
                 f"{result['when']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--baseline", default="96bf172", help="git revision to compare with (before issue 16's work)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "cli_startup" / "results")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    corral = shutil.which("corral", path=str(Path(py).parent)) or sys.exit("no corral console script beside python")

    work = Path(tempfile.mkdtemp(prefix="cli-bench-"))
    try:
        rev = baseline_tree(args.baseline, work / "src")
        old_env = {**os.environ, "PYTHONPATH": str(work / "src")}
        (work / "corral-baseline").write_text(LAUNCHER)
        old = [py, str(work / "corral-baseline"), "--help"]
        result: dict = {"when": time.strftime("%Y-%m-%d %H:%M"), "n": args.n, "goal_s": GOAL_S, "host": {
            "cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
            "loadavg_at_start": os.getloadavg()}, "baseline": rev, "cases": {}}
        cases = {
            "python -c pass (floor)": ([py, "-c", "pass"], None),
            "corral --help": ([corral, "--help"], None),
            "corral claim --help": ([corral, "claim", "--help"], None),
            "import corral.client (SDK)": ([py, "-c", "import corral.client; corral.client.Client"], None),
            f"corral --help @ {args.baseline}": (old, old_env),
        }
        for name, (argv, env) in cases.items():
            result["cases"][name] = measure(argv, args.n, env)
            print(f"{name}: {json.dumps(result['cases'][name])}", flush=True)
        result["top_imports_ms"] = {"corral --help": top_imports([py, corral, "--help"]),
                                    f"corral --help @ {args.baseline}": top_imports(old, old_env)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["host"]["loadavg_at_end"] = os.getloadavg()
    now = result["cases"]["corral --help"]
    result["meets_goal"] = now["wall_p50_s"] < GOAL_S
    (args.out / "cli-startup.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "cli-startup.png")
    print(f"wrote {args.out}/cli-startup.json and .png (corral --help: {now['wall_p50_s']} s wall, "
          f"{now['cpu_p50_s']} s CPU; goal < {GOAL_S} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
