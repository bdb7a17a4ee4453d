"""The control plane's floor under the 300-claim burst: what kube-apiserver and etcd allow on this machine before any
operator logic runs. Two measures, both taken before the operator starts:

- writes_alone: the claim path's writes (a merge patch and a status merge patch per claim) with 64 in flight, after
  the claims exist. Fast to take, but not the burst's shape: in the burst, the claim path runs while the creates are
  still arriving, and each claim's latency is counted from its own ADDED event.
- burst_shape: the burst itself with an operator that does nothing but the claim path. The same creates, all at once,
  from the same client as the burst; a responder process (python floor.py respond ...) that watches claims on one
  stream and, for each ADDED event, writes exactly what the operator writes to bind a warm claim (the Sandbox's
  conditional adoption patch, then the claim's conditional Bound status), through the operator's HTTP client;
  latency read by the caller's watch, ADDED -> Bound, exactly as the burst's. Its p90 is what the burst's p90 is
  compared with: the rest of the burst's latency is the operator's share (its decisions, its cache, the watch streams
  of sandboxes and pods that a bare responder does not open, and its refill).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lightkube import KubeConfig

MERGE = "application/merge-patch+json"
CLAIMS = "/apis/corral.dev/v1alpha1/namespaces/{ns}/sandboxclaims"
SANDBOXES = "/apis/corral.dev/v1alpha1/namespaces/{ns}/sandboxes"


def _fast(kubeconfig: str) -> Any:
    from corral.operator.kube import FastHttp

    fast = FastHttp.from_kubeconfig(KubeConfig.from_file(kubeconfig))
    if fast is None:
        raise RuntimeError(f"{kubeconfig}: the operator's HTTP client cannot use this kubeconfig's auth")
    return fast


def _claim(name: str, pool: str) -> dict[str, Any]:
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "SandboxClaim", "metadata": {"name": name},
            "spec": {"poolRef": {"name": pool}}}


async def writes_alone(kubeconfig: str, ns: str, n: int) -> dict[str, float]:
    """n claim creates, then the claim path's two writes per claim with 64 in flight, from a process that does
    nothing else. Reported as apiserver_ceiling (its keys unchanged since issue 15)."""
    fast = _fast(kubeconfig)
    base = CLAIMS.format(ns=ns)
    names = [f"ceiling-{i:04d}" for i in range(n)]
    sem = asyncio.Semaphore(64)

    async def one(method: str, path: str, body: object = None, ctype: str = "application/json") -> None:
        async with sem:
            await fast.request(method, path, body, content_type=ctype)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one("POST", base, _claim(x, "none")) for x in names))
        t1 = time.perf_counter()
        await asyncio.gather(*(one("PATCH", f"{base}/{x}", {"metadata": {"labels": {"bench": "1"}}}, MERGE)
                               for x in names))
        await asyncio.gather(*(one("PATCH", f"{base}/{x}/status", {"status": {"phase": "Bound"}}, MERGE)
                               for x in names))
        t2 = time.perf_counter()
        await asyncio.gather(*(one("DELETE", f"{base}/{x}") for x in names))
    finally:
        await fast.close()
    return {"claims": n, "creates_per_s": round(n / (t1 - t0)), "claim_path_writes_per_s": round(2 * n / (t2 - t1)),
            "claim_path_seconds": round(t2 - t1, 2)}


def stand_in_ip(i: int) -> str:
    """The (never contacted) pod IP a stand-in Sandbox's status names: loopback, like kwok's."""
    return f"127.20.{i // 250}.{i % 250 + 2}"


async def stand_ins(kubeconfig: str, ns: str, n: int, template: dict[str, Any]) -> None:
    """n Sandboxes as a WarmPool's ready sandboxes look when a claim adopts one: the template's blueprint in the
    spec, the pool's labels, a Ready status with the pod's IP and execd endpoint. Nothing reconciles them (no
    operator runs yet); they are what the responder's adoption patches write to, at their real size."""
    from corral.operator.builders import blueprint_hash, sandbox_labels, sandbox_manifest

    fast = _fast(kubeconfig)
    sem = asyncio.Semaphore(64)
    base = SANDBOXES.format(ns=ns)

    async def one(i: int) -> None:
        name = f"floor-{i:04d}"
        body = sandbox_manifest(name=name, namespace=ns, template_name="py", blueprint=template,
                                labels=sandbox_labels("py", "floor", "WarmPool"), owner=None)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ip = stand_in_ip(i)
        status = {"phase": "Running", "podIPs": [ip], "endpoint": f"{ip}:44772", "nodeName": "kwok-node-0",
                  "blueprintHash": blueprint_hash(template), "observedGeneration": 1, "conditions": [
                      {"type": "Ready", "status": "True", "reason": "PodReady", "message": "execd answers",
                       "lastTransitionTime": now, "observedGeneration": 1}]}
        async with sem:
            await fast.request("POST", base, body)
            await fast.request("PATCH", f"{base}/{name}/status", {"status": status}, content_type=MERGE)

    try:
        await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await fast.close()


async def respond(kubeconfig: str, ns: str, n: int, ready: Path) -> None:
    """Watch the namespace's claims; bind the i-th ADDED claim to stand-in i with the operator's two writes, 64 claims
    at a time. Ends after n claims. Touches `ready` once its watch is open."""
    from corral.operator.builders import owner_ref

    fast = _fast(kubeconfig)
    claims, sandboxes = CLAIMS.format(ns=ns), SANDBOXES.format(ns=ns)
    rvs = {s["metadata"]["name"]: s["metadata"]["resourceVersion"]
           for s in (await fast.request("GET", sandboxes))["items"]}
    free = sorted(rvs)
    tasks: list[asyncio.Task[None]] = []

    sem = asyncio.Semaphore(64)  # in flight, as the operator's 64 workers (and writes_alone)

    async def bind(claim: dict[str, Any], sandbox: str) -> None:
        async with sem:
            await bind_now(claim, sandbox)

    async def bind_now(claim: dict[str, Any], sandbox: str) -> None:
        meta = claim["metadata"]
        await fast.request("PATCH", f"{sandboxes}/{sandbox}", {"metadata": {
            "resourceVersion": rvs[sandbox], "labels": {"corral.dev/claim": meta["name"]},
            "annotations": {"corral.dev/launch-type": "Warm", "corral.dev/claim-uid": meta["uid"]},
            "ownerReferences": [owner_ref(claim)]}}, content_type=MERGE)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ip = stand_in_ip(int(sandbox.rsplit("-", 1)[1]))
        await fast.request("PATCH", f"{claims}/{meta['name']}/status", {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": {"phase": "Bound", "sandbox": {"name": sandbox, "podIPs": [ip], "endpoint": f"{ip}:44772"},
                       "launchType": "Warm", "boundTime": now, "observedGeneration": meta.get("generation", 1),
                       "conditions": [{"type": "Bound", "status": "True", "reason": "Bound",
                                       "message": f"bound to sandbox {sandbox} (warm start)",
                                       "lastTransitionTime": now, "observedGeneration": meta.get("generation", 1)}]},
        }, content_type=MERGE)

    try:
        listing = await fast.request("GET", claims)
        params = {"watch": "1", "resourceVersion": listing["metadata"]["resourceVersion"],
                  "allowWatchBookmarks": "false"}
        async with fast._sess().get(fast.server + claims, params=params, headers=fast._auth(),
                                    timeout=None) as resp:
            resp.raise_for_status()
            ready.touch()
            async for line in resp.content:
                event = json.loads(line)
                if event["type"] != "ADDED":
                    continue
                tasks.append(asyncio.create_task(bind(event["object"], free.pop(0))))
                if len(tasks) == n:
                    break
        await asyncio.gather(*tasks)
    finally:
        await fast.close()


def burst_shape(kubeconfig: str, ns: str, n: int, template: dict[str, Any], create: Any, watch: Any) -> dict:
    """The burst with a responder that only binds. `create(names)` creates the claims as the burst does; `watch` is
    the caller's ClaimWatch on ns (its wait() and latencies_ms())."""
    from openloop import cpu_seconds, summary

    asyncio.run(stand_ins(kubeconfig, ns, n, template))
    ready = Path(f"/tmp/corral-floor-{os.getpid()}.ready")
    ready.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, __file__, "respond", "--kubeconfig", kubeconfig, "--ns", ns,
                             "--n", str(n), "--ready", str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the floor's responder did not start")
            time.sleep(0.05)
        cpu0 = cpu_seconds(proc.pid)
        names = [f"floor-{i:04d}" for i in range(n)]
        create(names)
        watch.wait(names, 300)
        cpu = cpu_seconds(proc.pid) - cpu0
        if proc.wait(30) != 0:
            raise RuntimeError(f"the floor's responder exited {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
        ready.unlink(missing_ok=True)
    return {**summary(watch.latencies_ms(names)), "responder_cpu_ms_per_claim": round(cpu * 1000 / n, 2)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="the floor's responder (started by burst_shape)")
    ap.add_argument("mode", choices=["respond"])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--ns", required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--ready", type=Path, required=True)
    a = ap.parse_args()
    asyncio.run(respond(a.kubeconfig, a.ns, a.n, a.ready))
