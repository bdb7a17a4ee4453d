"""bench/claims_k8s's plots: the summary (whatever phases ran) and the sustained runs over time."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot(results: dict, path: Path) -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    refilling = [results.get("warm_spaced_refilling") or {}, *(results.get("warm_spaced_refilling_other_intervals")
                                                                or [])]
    rows = [(label, r) for label, r in (
        ("warm\nseq", results.get("warm_sequential")), ("warm\nspaced", results.get("warm_spaced")),
        *((f"warm\nevery {r.get('interval_s', 0):g}s", r) for r in refilling),
        ("warm\nburst", results.get("warm_burst")), ("cold\nseq", results.get("cold_sequential")))
        if r and r.get("p50_ms") is not None]
    for run in results.get("sustained") or []:
        if run["bind"].get("p50_ms") is not None:
            rows.append((f"steady\n{run['rate_per_s']:g}/s", run["bind"]))
    x = range(len(rows))
    for i, q in enumerate(("p50_ms", "p90_ms", "p99_ms")):
        ax1.bar([j + i * 0.27 for j in x], [r[q] for _, r in rows], width=0.27, label=q.replace("_ms", ""))
    ax1.set_xticks([j + 0.27 for j in x], [n for n, _ in rows], fontsize=7)
    ax1.set_yscale("log")
    if rows:
        ax1.set_ylim(top=max(r["p99_ms"] for _, r in rows) * 20)  # room for the legend
    ax1.set_ylabel("claim created -> Bound (ms)")
    ax1.axhline(25, color="grey", linestyle=":", label="warm p50 goal")
    ceiling = results.get("apiserver_ceiling") or {}
    labels = [n for n, _ in rows]
    if ceiling.get("claim_path_seconds") and "warm\nburst" in labels:  # the burst's writes, control plane alone
        ax1.scatter([labels.index("warm\nburst") + 0.27], [ceiling["claim_path_seconds"] * 1000], marker="_", s=900,
                    color="grey", zorder=3, label="burst's claim-path writes alone")
    shaped = results.get("control_plane_floor_burst") or {}
    if shaped.get("p90_ms") and "warm\nburst" in labels:  # the burst with a responder that only binds (floor.py)
        ax1.scatter([labels.index("warm\nburst") + 0.27], [shaped["p90_ms"]], marker="_", s=900,
                    color="black", zorder=3, label="burst p90 floor (a responder that only binds)")
    ax1.legend(fontsize=7, loc="upper left")
    bars = []
    if results.get("fill"):
        bars.append(("fill s", results["fill"]["seconds"]))
    if results.get("warm_sequential"):
        bars.append(("writes/claim", results["warm_sequential"]["api_writes_per_claim_claim_path"]))
    if results.get("warm_burst"):
        bars.append(("op CPU ms/claim\n(burst)", results["warm_burst"]["operator_cpu_ms_per_claim"]))
    if results.get("warm_spaced_refilling"):
        bars.append(("op CPU ms/claim\n+refill (0.5s)",
                     results["warm_spaced_refilling"]["operator_cpu_ms_per_claim_plus_refill"]))
    if results.get("operator_rss"):
        bars.append(("RSS MiB", results["operator_rss"]["rss_mib"]))
    if bars:
        ax2.bar([b for b, _ in bars], [v for _, v in bars])
        ax2.tick_params(axis="x", labelsize=7)
        ax2.set_yscale("log")
        for i, (_, v) in enumerate(bars):
            ax2.annotate(f"{v:g}", (i, v), ha="center", va="bottom", fontsize=7)
    title = []
    if results.get("fill"):
        title.append(f"fill {results['fill']['sandboxes']}")
    if results.get("operator_rss"):
        title.append(f"RSS at {results['operator_rss']['sandboxes']} sandboxes")
    ax2.set_title(" | ".join(title), fontsize=9)
    fig.suptitle("Corral claims on Kubernetes (kube-apiserver + kwok, 2 shared cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sustained(runs: list[dict], path: Path) -> None:
    """Per second of each sustained run: claim latency (p50, p99), operator CPU (and the API server's), operator RSS,
    backlog and the pool's idle sandboxes."""
    fig, axes = plt.subplots(4, 1, figsize=(11, 11), sharex=True)
    lat, cpu, rss, backlog = axes
    for i, run in enumerate(runs):
        c = f"C{i}"
        s = run["series"]
        t = [r["t"] for r in s]
        tag = f"{run['rate_per_s']:g}/s"
        lat.plot(t, [r["bind_p99_ms"] for r in s], color=c, label=f"{tag} p99")
        lat.plot(t, [r["bind_p50_ms"] for r in s], color=c, linestyle="--", label=f"{tag} p50")
        cpu.plot(t, [r["operator_cpu_pct"] for r in s], color=c, label=f"{tag} operator")
        cpu.plot(t, [r.get("kube-apiserver_cpu_pct") for r in s], color=c, linestyle=":", label=f"{tag} apiserver")
        cpu.plot(t, [r["machine_busy_pct"] for r in s], color=c, linestyle="-.", alpha=0.4,
                 label=f"{tag} machine (all)")
        cpu.plot(t, [r.get("operator_runq_wait_pct") for r in s], color=c, linestyle="--", alpha=0.6,
                 label=f"{tag} operator waiting for a core")
        rss.plot(t, [r["operator_rss_mib"] for r in s], color=c, label=tag)
        backlog.plot(t, [r["backlog"] for r in s], color=c, label=f"{tag} backlog")
        backlog.plot(t, [r["pool_idle"] for r in s], color=c, linestyle=":", label=f"{tag} pool idle")
        backlog.plot(t, [r.get("bound_per_s") for r in s], color=c, linestyle="-.", alpha=0.5, label=f"{tag} bound/s")
        if any(r.get("cold") for r in s):
            backlog.plot(t, [r.get("cold", 0) for r in s], color=c, linestyle="--", alpha=0.8, label=f"{tag} cold/s")
    lat.axhline(200, color="grey", linestyle=":", label="p99 goal")
    lat.set_yscale("log")
    lat.set_ylabel("claim ADDED -> Bound (ms)\nclaims scheduled that second")
    cpu.set_ylabel("CPU % (200 = 2 cores)")
    rss.set_ylabel("operator RSS (MiB)")
    backlog.set_ylabel("claims not yet Bound, idle pool\nsandboxes, bound/s, cold/s")
    backlog.set_xlabel("seconds since the first claim")
    for ax in axes:
        ax.legend(fontsize=7, loc="upper left", ncol=3)
        ax.grid(alpha=0.3)
    fig.suptitle("Corral claims on Kubernetes: sustained open-loop load (created, held 1 s, deleted)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
