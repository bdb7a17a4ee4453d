"""The user's path on a real node: `pulumi up --stack dev` on kind, the operator as a pod from its chart, warm pools
of real pods made Ready by the kubelet's probe, the SDK through a port-forward to the claims API Service, the chart's
NetworkPolicies enforced, the operator pod deleted mid-stream, sharded mode switched on with `pulumi config` (two
replicas forwarding to each other, one force-deleted, one crashed) and off again, `pulumi destroy` leaving nothing,
and the host's kernel as it was.

The tests run in file order and share one stack (a real cluster costs minutes to fill)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from clusterutil import host_sysctls
from waiting import wait_until

from corral.operator.shards import shard_of

pytestmark = pytest.mark.cluster

OP_NS = "corral-system"
SBX_NS = "corral-sandboxes"


def pods(cluster, ns: str, selector: str) -> list[dict]:
    return cluster.json("-n", ns, "get", "pods", "-l", selector)["items"]


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def operator_pods(cluster) -> list[dict]:
    return pods(cluster, OP_NS, "app.kubernetes.io/name=corral-operator")


@pytest.fixture(scope="module")
def client(kind_cluster, dev_stack):
    """The SDK against the claims API, through `kubectl port-forward` to the chart's <release>-api Service."""
    from corral.client import Client

    svc = f"svc/{dev_stack.outputs['controllerService']}-api"
    with kind_cluster.port_forward(OP_NS, svc, 7780) as port, \
            Client(url=f"http://127.0.0.1:{port}", token=dev_stack.outputs["apiToken"], timeout=60) as c:
        yield c


def test_operator_runs_as_a_pod_from_the_chart(kind_cluster, dev_stack):
    (pod,) = wait_until(lambda: [p for p in operator_pods(kind_cluster) if ready(p)], 300, what="a Ready operator pod",
                        dump=lambda: kind_cluster.kubectl("-n", OP_NS, "describe", "pods", check=False).stdout[-3000:])
    spec = pod["spec"]
    assert spec["serviceAccountName"] == "corral"
    (container,) = spec["containers"]
    assert container["readinessProbe"] and container["livenessProbe"]   # the kubelet probes it, and it answers
    (state,) = pod["status"]["containerStatuses"]
    assert state["ready"] and state["restartCount"] == 0, state
    assert spec["securityContext"].get("runAsNonRoot") or container["securityContext"].get("runAsNonRoot")
    # The active replica labels its own pod for the -api Service: the label is the operator's own API write.
    wait_until(lambda: operator_pods(kind_cluster)[0]["metadata"]["labels"].get("corral.dev/claims-api") == "active",
               60, what="the claims-api label on the operator pod")


def test_warm_pool_fills_with_real_ready_pods(kind_cluster, dev_stack):
    def filled():
        wp = kind_cluster.json("-n", SBX_NS, "get", "warmpool", "python")
        return (wp.get("status") or {}).get("readyReplicas") == 3 and wp

    wait_until(filled, 600, what="WarmPool python: 3 ready", interval=2,
               dump=lambda: kind_cluster.kubectl("-n", SBX_NS, "get", "pods,sandboxes", "-o", "wide",
                                                 check=False).stdout)
    sandbox_pods = [p for p in pods(kind_cluster, SBX_NS, "corral.dev/pool=python") if ready(p)]
    assert len(sandbox_pods) >= 3
    for pod in sandbox_pods:
        (init,) = pod["status"]["initContainerStatuses"]               # execd copied in by the init container
        assert init["state"]["terminated"]["exitCode"] == 0, init
        probe = pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]
        assert probe["path"] == "/v1/health"                            # Ready because the real probe passed
        assert pod["spec"]["securityContext"]["runAsUser"] == 1000


def test_sdk_claims_runs_commands_files_and_a_pty(client):
    with client.claim(pool="python", env={"GREETING": "hello"}, ttl=600) as sbx:
        assert sbx.claim.launch_type == "warm"
        r = sbx.commands.run("echo $GREETING from $(id -u)")
        assert (r.exit_code, r.stdout) == (0, "hello from 1000\n")      # claim env on a warm sandbox
        sbx.files.write("/workspace/main.py", "print(sum(range(10)))\n")
        assert sbx.files.read("/workspace/main.py") == b"print(sum(range(10)))\n"
        assert sbx.commands.run(["python3", "main.py"]).stdout == "45\n"
        with sbx.pty() as term:
            term.write("echo $((6*7))\n")
            term.read_until("42")
            term.write("exit 3\n")
            assert term.wait() == 3
        name = sbx.name
    assert name not in {c.name for c in client.claims()}


def test_cold_claim_from_a_pool_starts_a_real_pod(client):
    t0 = time.monotonic()
    with client.claim(pool="shell", timeout=300) as sbx:
        took = time.monotonic() - t0
        assert sbx.claim.launch_type == "cold"
        assert sbx.commands.run("cat /proc/1/cgroup >/dev/null && echo up").stdout == "up\n"
    print(f"\ncold claim from Pool shell (a real pod start): {took:.1f} s")


def test_a_batch_runs_one_task_in_each_real_pod_through_the_sdk_and_the_cli(kind_cluster, dev_stack, client):
    """A SandboxBatch on the real node: the chart's operator binds 4 sandboxes of the warm pool (3 warm, the rest
    cold), starts each task through execd in the pod and follows it over the pod network to its end; results come
    back per index with their output, and `corral batch` as a user runs it exits 1 when a task failed."""
    task = ["sh", "-c", 'echo "idx $CORRAL_BATCH_INDEX uid $(id -u)"; [ "$CORRAL_BATCH_INDEX" != 3 ] || exit 3']
    with client.batch("python", 4, task, timeout=300) as batch:
        results = {r.index: r for r in batch}
        final = batch.wait()
    assert sorted(results) == [0, 1, 2, 3], results
    for i, r in results.items():
        assert r.output == f"idx {i} uid 1000\n", r
        assert (r.phase, r.exit_code) == (("Failed", 3) if i == 3 else ("Succeeded", 0)), r
    assert len({r.sandbox for r in results.values()}) == 4
    assert (final.phase, final.succeeded, final.failed) == ("Failed", 3, 1)
    assert {r.launch_type for r in results.values()} <= {"warm", "cold"} and \
        any(r.launch_type == "warm" for r in results.values())

    cli = Path(sys.executable).with_name("corral")
    svc = f"svc/{dev_stack.outputs['controllerService']}-api"
    with kind_cluster.port_forward(OP_NS, svc, 7780) as port:
        env = {**os.environ, "CORRAL_API_URL": f"http://127.0.0.1:{port}",
               "CORRAL_API_TOKEN": dev_stack.outputs["apiToken"]}
        proc = subprocess.run([str(cli), "batch", "python", "-n", "2", "--rm", "--",
                               'echo "cli $CORRAL_BATCH_INDEX"; exit "$CORRAL_BATCH_INDEX"'],
                              env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr   # index 1 exited 1
    assert "cli 0" in proc.stdout and "cli 1" in proc.stdout, proc.stdout


def sandbox_ip(cluster, claim_name: str) -> str:
    claim = cluster.json("-n", SBX_NS, "get", "sandboxclaim", claim_name)
    sbx = claim["status"]["sandbox"]["name"]
    return cluster.json("-n", SBX_NS, "get", "pod", sbx)["status"]["podIP"]


CONNECT = ("import socket,sys\n"
           "s=socket.socket(); s.settimeout(3)\n"
           "try:\n s.connect((sys.argv[1], int(sys.argv[2]))); print('open')\n"
           "except OSError as e: print('blocked', type(e).__name__)\n")


def connect_from_pod(cluster, ns: str, pod: str, host: str, port: int) -> str:
    out = cluster.kubectl("-n", ns, "exec", pod, "--", "python3", "-c", CONNECT, host, str(port), timeout=60).stdout
    return out.strip()


@pytest.fixture(scope="module")
def control_pods(kind_cluster, dev_stack):
    """Two plain pods (the sandbox image, no Corral policy) in a namespace of their own: the positive control that
    every connection the policies forbid does work on this network without them."""
    ns = f"control-{uuid.uuid4().hex[:6]}"
    kind_cluster.kubectl("create", "namespace", ns)
    for name in ("a", "b"):
        kind_cluster.kubectl("-n", ns, "run", name, "--image=corral/python:bookworm", "--image-pull-policy=Never",
                             "--restart=Never", "--command", "--", "python3", "-m", "http.server", "44772")
    kind_cluster.kubectl("-n", ns, "wait", "--for=condition=Ready", "pod/a", "pod/b", "--timeout=180s", timeout=200)
    for name in ("a", "b"):  # Ready once started (no probe): the server may not listen yet (a refused control)
        wait_until(lambda n=name: connect_from_pod(kind_cluster, ns, n, "127.0.0.1", 44772) == "open", 60, 0.5,
                   f"control pod {name} listening")
    yield ns
    kind_cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_network_policies_are_enforced(kind_cluster, dev_stack, client, control_pods):
    ns = control_pods
    b_ip = kind_cluster.json("-n", ns, "get", "pod", "b")["status"]["podIP"]
    op = operator_pods(kind_cluster)[0]
    op_ip = op["status"]["podIP"]
    api_host = kind_cluster.json("-n", "default", "get", "service", "kubernetes")["spec"]["clusterIP"]
    # Positive controls, without any policy in the way: pod to pod, to the operator's API and metrics ports (its
    # policy admits every namespace there), to the Kubernetes API.
    assert connect_from_pod(kind_cluster, ns, "a", b_ip, 44772) == "open"
    assert connect_from_pod(kind_cluster, ns, "a", op_ip, 7780) == "open"
    assert connect_from_pod(kind_cluster, ns, "a", op_ip, 9090) == "open"
    assert connect_from_pod(kind_cluster, ns, "a", api_host, 443) == "open"

    with client.claim(pool="python", ttl=600) as one, client.claim(pool="python", ttl=600) as two:
        other_ip = sandbox_ip(kind_cluster, two.name)
        probe = lambda host, port: one.commands.run(["python3", "-c", CONNECT, host, str(port)]).stdout.strip()  # noqa: E731
        assert probe(other_ip, 44772).startswith("blocked"), "a sandbox reached another sandbox's execd"
        assert probe(b_ip, 44772).startswith("blocked"), "a sandbox reached a pod in another namespace"
        assert probe(op_ip, 7780).startswith("blocked"), "a sandbox reached the claims API"
        assert probe(op_ip, 9090).startswith("blocked"), "a sandbox reached the operator's metrics"
        assert probe(api_host, 443).startswith("blocked"), "a sandbox reached the Kubernetes API"
        # The operator reaches execd (every command above went operator -> pod IP), and DNS follows the template:
        # the catalogue's python template says dns: Allowed.
        lookup = one.commands.run("getent hosts kubernetes.default.svc.cluster.local || echo none")
        assert lookup.stdout.split()[0] == api_host, lookup.stdout


def test_dns_disallowed_template_cannot_resolve(kind_cluster, dev_stack, client):
    python = kind_cluster.json("-n", SBX_NS, "get", "sandboxtemplate", "python")
    spec = {**python["spec"], "dns": "Disallowed"}
    manifest = {"apiVersion": "corral.dev/v1alpha1", "kind": "SandboxTemplate",
                "metadata": {"name": "python-nodns", "namespace": SBX_NS}, "spec": spec}
    pool = {"apiVersion": "corral.dev/v1alpha1", "kind": "WarmPool",
            "metadata": {"name": "python-nodns", "namespace": SBX_NS},
            "spec": {"replicas": 1, "templateRef": {"name": "python-nodns"}}}
    kind_cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                  "items": [manifest, pool]}))
    try:
        with client.claim(pool="python-nodns", timeout=300) as sbx:
            r = sbx.commands.run("timeout 8 getent hosts kubernetes.default.svc.cluster.local || echo none")
            assert r.stdout.strip() == "none", r.stdout
    finally:
        kind_cluster.kubectl("-n", SBX_NS, "delete", "warmpool,sandboxtemplate", "python-nodns", check=False)


def kill_execd(cluster, pod: str) -> None:
    """SIGKILL to execd's supervisor and server inside the pod, as the sandbox's own uid (what hostile code can do)."""
    out = cluster.kubectl("-n", SBX_NS, "exec", pod, "--", "python3", "-c", KILL_EXECD, timeout=60).stdout
    assert out.count("killed") >= 2, out  # the supervisor and its server


def pod_ready(cluster, name: str) -> bool:
    return ready(cluster.json("-n", SBX_NS, "get", "pod", name))


def test_a_killed_execd_fails_the_real_readiness_probe_and_is_never_handed_out(kind_cluster, dev_stack, client):
    """execd killed for good (supervisor and server) in an idle and in a bound sandbox: the kubelet's readiness probe
    turns the pods unready, the idle one is not handed to a claim and its WarmPool replaces it after the grace, and
    the bound claim is not shown Ready. Sandbox pods carry no execd token in their spec."""
    def idle_ready_pods():
        found = [p for p in pods(kind_cluster, SBX_NS, "corral.dev/pool=python")
                 if ready(p) and "corral.dev/claim" not in p["metadata"]["labels"]]
        return len(found) >= 2 and found

    python_pods = wait_until(idle_ready_pods, 600, what="two idle Ready python sandboxes", interval=2)
    for pod in python_pods:
        assert 'CORRAL_EXECD_TOKEN"' not in json.dumps(pod["spec"])
        (init,) = pod["spec"]["initContainers"]
        assert {e["name"] for e in init["env"]} == {"CORRAL_EXECD_KEY_FILE", "CORRAL_EXECD_POD_NAMESPACE",
                                                    "CORRAL_EXECD_POD_NAME", "CORRAL_EXECD_POD_UID"}
    grace = kind_cluster.json("-n", SBX_NS, "get", "warmpool", "python")["spec"].get("readinessGraceSeconds", 300)
    kind_cluster.kubectl("-n", SBX_NS, "patch", "warmpool", "python", "--type", "merge",
                         "-p", '{"spec": {"readinessGraceSeconds": 15}}')
    try:
        victim = python_pods[0]["metadata"]["name"]
        kill_execd(kind_cluster, victim)
        wait_until(lambda: not pod_ready(kind_cluster, victim), 60, what=f"{victim} unready (the kubelet's probe)")
        with client.claim(pool="python", ttl=600, timeout=300) as sbx:
            claim = kind_cluster.json("-n", SBX_NS, "get", "sandboxclaim", sbx.name)
            mine = claim["status"]["sandbox"]["name"]
            assert mine != victim, "a sandbox whose execd is dead was handed to a claim"
            assert sbx.commands.run("echo ok").stdout == "ok\n"
            kill_execd(kind_cluster, mine)
            wait_until(lambda: sbx.refresh().phase != "Ready", 60, what="the bound claim no longer Ready")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # and it stays so: nothing brings a dead execd back
                claim_now = sbx.refresh()
                assert claim_now.phase != "Ready" and "not ready" in (claim_now.message or ""), claim_now
                time.sleep(1)
        wait_until(lambda: not [s for s in kind_cluster.json("-n", SBX_NS, "get", "sandboxes")["items"]
                                if s["metadata"]["name"] == victim and not s["metadata"].get("deletionTimestamp")],
                   180, what=f"{victim} replaced by its WarmPool", interval=2)
    finally:
        kind_cluster.kubectl("-n", SBX_NS, "patch", "warmpool", "python", "--type", "merge",
                             "-p", json.dumps({"spec": {"readinessGraceSeconds": grace}}), check=False)


def test_operator_pod_deleted_mid_stream_loses_and_doubles_nothing(kind_cluster, dev_stack):
    """Claims keep coming (as SandboxClaim objects, the way a Kubernetes-native client makes them) while the
    operator pod is deleted: the Deployment brings it back, and every claim ends Bound to a sandbox of its own."""
    names = [f"stream-{i}-{uuid.uuid4().hex[:4]}" for i in range(6)]

    def create(name: str) -> None:
        kind_cluster.kubectl("apply", "-f", "-", input=(
            '{"apiVersion": "corral.dev/v1alpha1", "kind": "SandboxClaim", '
            f'"metadata": {{"name": "{name}", "namespace": "{SBX_NS}"}}, '
            '"spec": {"poolRef": {"kind": "WarmPool", "name": "python"}, "timeoutSeconds": 600}}'))

    old = operator_pods(kind_cluster)[0]["metadata"]["name"]
    stream = threading.Thread(target=lambda: [create(n) or time.sleep(1.0) for n in names])
    stream.start()
    time.sleep(2.5)
    kind_cluster.kubectl("-n", OP_NS, "delete", "pod", old, "--wait=false")
    stream.join()
    try:
        wait_until(lambda: [p for p in operator_pods(kind_cluster) if p["metadata"]["name"] != old and ready(p)],
                   300, what="a new Ready operator pod")

        def bound():
            items = kind_cluster.json("-n", SBX_NS, "get", "sandboxclaims")["items"]
            claims = {c["metadata"]["name"]: c for c in items if c["metadata"]["name"] in names}
            phases = {n: (claims[n].get("status") or {}).get("phase") for n in names if n in claims}
            return len(phases) == len(names) and all(p == "Bound" for p in phases.values()) and claims

        claims = wait_until(bound, 600, what="every streamed claim Bound", interval=2,
                            dump=lambda: kind_cluster.kubectl("-n", SBX_NS, "get", "sandboxclaims,sandboxes",
                                                              check=False).stdout)
        sandboxes = [claims[n]["status"]["sandbox"]["name"] for n in names]
        assert len(set(sandboxes)) == len(names), f"a sandbox was bound twice: {sandboxes}"
        owners = {}
        for s in kind_cluster.json("-n", SBX_NS, "get", "sandboxes")["items"]:
            claim = (s["metadata"].get("labels") or {}).get("corral.dev/claim")
            if claim:
                assert claim not in owners, f"claim {claim} holds two sandboxes"
                owners[claim] = s["metadata"]["name"]
        assert {n: owners.get(n) for n in names} == dict(zip(names, sandboxes, strict=True))
    finally:
        kind_cluster.kubectl("-n", SBX_NS, "delete", "sandboxclaims", *names, "--wait=false", check=False)




# ---- sharded mode, from the chart ----------------------------------------------------------------------------------

SHARDS, LEASE = 4, 6  # a short lease keeps the handovers quick
API_CALLERS = "agents"  # who may call the claims API, narrowed (networkPolicy.apiNamespaces) the way a user does
SHARDED = [("corral:controller.values.sharding.enabled", "true"),
           ("corral:controller.values.sharding.shards", str(SHARDS)),
           ("corral:controller.values.sharding.leaseSeconds", str(LEASE)),
           ("corral:controller.values.replicas", "2"),
           ("corral:controller.values.networkPolicy.apiNamespaces[0]", API_CALLERS)]


def shard_leases(cluster) -> tuple[dict[int, str | None], dict[str, str]]:
    """(shard -> holder pod, live member pod -> its claims API address) from the Leases labelled corral.dev/shards."""
    shards, members = {}, {}
    for lease in cluster.json("-n", OP_NS, "get", "leases", "-l", "corral.dev/shards")["items"]:
        name, spec = lease["metadata"]["name"], lease["spec"]
        if name.startswith("corral-shard-") and int(name.rsplit("-", 1)[1]) < SHARDS:
            shards[int(name.rsplit("-", 1)[1])] = spec.get("holderIdentity")
        elif name.startswith("corral-replica-") and spec.get("holderIdentity"):
            members[spec["holderIdentity"]] = (lease["metadata"].get("annotations") or {}).get(
                "corral.dev/claims-api-address", "")
    return shards, members


def live_operators(cluster) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in operator_pods(cluster)
            if ready(p) and not p["metadata"].get("deletionTimestamp")}


def claims_bound_once(cluster, names: list[str]) -> dict[str, str]:
    """claim -> its sandbox, once every claim is Bound, its status names one sandbox, that sandbox is the one live
    sandbox labelled for it, and no sandbox serves two claims (kubectl's view of SandboxClaims and Sandboxes)."""
    def settled():
        claims = {c["metadata"]["name"]: c for c in cluster.json("-n", SBX_NS, "get", "sandboxclaims")["items"]}
        labelled: dict[str, list[str]] = {}
        for s in cluster.json("-n", SBX_NS, "get", "sandboxes")["items"]:
            c = (s["metadata"].get("labels") or {}).get("corral.dev/claim")
            if c and not s["metadata"].get("deletionTimestamp"):
                labelled.setdefault(c, []).append(s["metadata"]["name"])
        named = {n: ((claims.get(n) or {}).get("status") or {}) for n in names}
        ok = all(st.get("phase") == "Bound" and labelled.get(n) == [(st.get("sandbox") or {}).get("name")]
                 for n, st in named.items())
        return ok and {n: st["sandbox"]["name"] for n, st in named.items()}

    bound = wait_until(settled, 120, what="every claim Bound to exactly the one sandbox its status names", interval=1,
                       dump=lambda: cluster.kubectl("-n", SBX_NS, "get", "sandboxclaims,sandboxes", "-L",
                                                    "corral.dev/claim", check=False).stdout)
    assert len(set(bound.values())) == len(bound), f"a sandbox bound to two claims: {Counter(bound.values())}"
    return bound


def metric_sum(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and line[len(name)] in " {")


def settled(cluster) -> tuple[dict[str, dict], dict[int, str | None], dict[str, str]]:
    """(pod name -> pod, shard -> holder, member -> address) once two Ready sharded operator pods are all there is
    and hold the shards half each."""
    def two_sharded():
        found = {n: p for n, p in live_operators(cluster).items()
                 if any(e["name"] == "CORRAL_SHARDS" for e in p["spec"]["containers"][0].get("env") or [])}
        return len(found) == 2 and len(operator_pods(cluster)) == 2 and found

    ops = wait_until(two_sharded, 300, what="two Ready sharded operator pods", interval=1,
                     dump=lambda: cluster.kubectl("-n", OP_NS, "get", "pods", "-o", "wide", check=False).stdout)

    def split():
        shards, members = shard_leases(cluster)
        counts = Counter(shards.values())
        return (len(shards) == SHARDS and set(counts) == set(ops) and set(counts.values()) == {SHARDS // 2}
                and set(members) == set(ops) and (shards, members))

    shards, members = wait_until(split, 60, what=f"{SHARDS // 2} shards held by each replica", interval=0.5,
                                 dump=lambda: shard_leases(cluster))
    return ops, shards, members


class Sharded:
    """The claims API of each sharded replica through a port-forward to its pod, and the claims made through them."""

    def __init__(self, cluster, token: str, stack: contextlib.ExitStack) -> None:
        self.cluster, self.auth, self.stack = cluster, {"Authorization": f"Bearer {token}"}, stack
        self.api: dict[str, str] = {}
        self.made: list[str] = []
        self.results: dict[str, httpx.Response] = {}
        self.logs: dict[str, str] = {}

    def url(self, pod: str) -> str:
        if pod not in self.api:
            port = self.stack.enter_context(self.cluster.port_forward(OP_NS, f"pod/{pod}", 7780))
            self.api[pod] = f"http://127.0.0.1:{port}"
        return self.api[pod]

    def claim(self, via: str, pool: str, name: str) -> None:
        self.made.append(name)
        self.results[name] = httpx.post(f"{self.url(via)}/v1/claims", headers=self.auth, timeout=240, json={
            "pool": pool, "name": name, "ttlSeconds": 900, "timeoutSeconds": 180})

    def created(self, names) -> None:
        assert {n: self.results[n].status_code for n in names} == {n: 201 for n in names}, \
            {n: self.results[n].text for n in names if self.results[n].status_code != 201}

    def release(self, via: str, names) -> None:  # the node's CPU is small: claims that served their purpose go
        for name in names:
            r = httpx.delete(f"{self.url(via)}/v1/claims/{name}", headers=self.auth, timeout=60)
            assert r.status_code in (200, 202, 204), r.text

    def handover(self, victim: str, via: str, pools: list[str], *, crash: bool) -> tuple[float, float, dict]:
        """Claims on `pools` keep coming through `via` while `victim` goes: force-deleted (grace 0: the kubelet still
        sends SIGTERM, with 2 s to go), or first crashed (SIGKILL, no goodbye). Returns how long after it went, and
        after its last lease renewal, every shard was held by a live replica again; and who holds them."""
        self.logs[victim] = self.cluster.kubectl("-n", OP_NS, "logs", victim, check=False).stdout
        pod = self.cluster.json("-n", OP_NS, "get", "pod", victim)
        how = "crash" if crash else "kill"
        names = [f"{how}-{j}-{pool}-{uuid.uuid4().hex[:4]}" for j in range(2) for pool in pools]
        threads = [threading.Thread(target=self.claim, args=(via, pool, name))
                   for name, pool in zip(names, [pool for _ in range(2) for pool in pools], strict=True)]
        for t in threads[:len(pools)]:
            t.start()
        time.sleep(1.0)  # a cold claim forwarded to the victim is in flight there, waiting for its pod
        if crash:
            self.cluster.kill_container(pod)
        self.cluster.kubectl("-n", OP_NS, "delete", "pod", victim, "--grace-period=0", "--force", "--wait=false")
        t0 = time.monotonic()
        renewed = max((datetime.fromisoformat(lease["spec"]["renewTime"]) for lease in self.cluster.json(
            "-n", OP_NS, "get", "leases", "-l", "corral.dev/shards")["items"]
            if lease["metadata"]["name"].startswith("corral-shard-") and lease["spec"].get("holderIdentity") == victim
            and lease["spec"].get("renewTime")),
            default=datetime.now(UTC))  # (the kind node's clock is this machine's)
        for t in threads[len(pools):]:
            time.sleep(0.5)
            t.start()

        def moved():  # to the survivor, or to the Deployment's replacement pod (Ready or not yet)
            held, _ = shard_leases(self.cluster)
            current = {p["metadata"]["name"] for p in operator_pods(self.cluster)
                       if not p["metadata"].get("deletionTimestamp")} - {victim}
            return len(held) == SHARDS and set(held.values()) <= current and held

        held = wait_until(moved, LEASE * 5, interval=0.1, what=f"{victim}'s shards held by live replicas",
                          dump=lambda: (shard_leases(self.cluster), self.cluster.kubectl(
                              "-n", OP_NS, "logs", via, "--tail=40", check=False).stdout))
        took, since_renewal = time.monotonic() - t0, (datetime.now(UTC) - renewed).total_seconds()
        for t in threads:
            t.join()
        self.created(names)
        # the API keeps answering through the survivor, for every pool
        after = [f"after-{pool}-{uuid.uuid4().hex[:4]}" for pool in pools]
        for name, pool in zip(after, pools, strict=True):
            self.claim(via, pool, name)
        self.created(after)
        listed = httpx.get(f"{self.url(via)}/v1/claims", headers=self.auth, timeout=10)
        phases = {c["name"]: c["phase"] for c in listed.json()["items"]}
        assert all(phases.get(n) == "Ready" for n in [*names, *after]), phases
        claims_bound_once(self.cluster, [*names, *after])
        self.release(via, [*names, *after])
        return took, since_renewal, held


def test_sharded_replicas_from_the_chart_share_the_pools_forward_and_survive_a_force_delete(kind_cluster, dev_stack):
    """Sharded mode the way a user turns it on (`pulumi config set --path controller.values.sharding.enabled true`,
    two replicas, `pulumi up`), with the claims API's callers narrowed to one namespace: both replicas hold shards
    (Leases), each binds the claims of its own pool, a request sent to the replica that does not hold its pool's shard
    is forwarded pod to pod (`x-corral-shard`) through the chart's NetworkPolicy, the execd proxy too. Then, while
    claims keep coming through the other replica, the holder of one pool is force-deleted (it releases its shards at
    SIGTERM, even with a claim in flight), and the holder of the other crashes (its shards move when their lease runs
    out, to the survivor or to the Deployment's replacement pod that joined meanwhile); every claim ends Bound to a
    sandbox of its own and the API keeps answering. No traceback in any replica's log. The stack goes back to one
    replica at the end.

    Without the narrowing this cluster's NetworkPolicy enforcer (kube-router) lets replica-to-replica traffic through
    even though the policy's egress does not name it: it runs a pod's ingress and egress rules in one chain, and the
    destination's ingress rule admitting every namespace marks the packet for the source's egress too. A CNI that
    enforces egress on its own (Calico, Cilium) would drop it; with the narrowing, kube-router does too unless the
    policy admits the replicas to each other."""
    cluster = kind_cluster
    t_start = time.monotonic()
    extra_pool = None
    dev_stack.configure(SHARDED)
    dev_stack.up()
    with contextlib.ExitStack() as stack:
        api = Sharded(cluster, dev_stack.outputs["apiToken"], stack)
        try:
            ops, shards, members = settled(cluster)
            for name, pod in ops.items():  # CORRAL_POD_IP: each replica announces its own pod IP to the others
                assert members[name] == f"http://{pod['status']['podIP']}:7780", members

            # Two pools on two replicas: the WarmPool python, and a cold Pool (the stack's shell, or one made here on
            # the template shell) in a shard of the other replica.
            def holder(kind: str, pool: str) -> str:
                return shards[shard_of(SBX_NS, kind, pool, SHARDS)]

            warm_holder = holder("WarmPool", "python")
            (cold_holder,) = set(ops) - {warm_holder}
            cold = "shell"
            if holder("Pool", cold) != cold_holder:
                cold = extra_pool = next(f"shell-{i}" for i in range(100)
                                         if holder("Pool", f"shell-{i}") == cold_holder)
                cluster.kubectl("apply", "-f", "-", input=json.dumps({
                    "apiVersion": "corral.dev/v1alpha1", "kind": "Pool",
                    "metadata": {"name": cold, "namespace": SBX_NS},
                    "spec": {"templateRef": {"name": "shell"}, "capacity": {"bufferMin": 0, "bufferMax": 0,
                                                                              "poolMax": 10}}}))
            pool_holder = {"python": warm_holder, cold: cold_holder}
            metrics = {n: stack.enter_context(cluster.port_forward(OP_NS, f"pod/{n}", 9090)) for n in ops}
            for n in ops:  # both replicas' caches know both pools (a request's shard is found from them)
                wait_until(lambda n=n: {"python", cold} <= {p["name"] for p in httpx.get(
                    f"{api.url(n)}/v1/pools", headers=api.auth, timeout=10).json()["items"]}, 30,
                    what=f"pools seen by {n}")

            # Both replicas serve at once: a claim on each pool sent to each replica's API at the same time.
            def binds() -> dict[str, float]:
                return {n: metric_sum(metrics[n], "corral_claim_latency_seconds_count") for n in ops}

            before = binds()
            first = {f"both-{i}-{pool}-{uuid.uuid4().hex[:4]}": (via, pool)
                     for i, via in enumerate(sorted(ops)) for pool in pool_holder}
            threads = [threading.Thread(target=api.claim, args=(via, pool, name))
                       for name, (via, pool) in first.items()]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            api.created(first)
            # forwarded exactly when sent to the replica not holding the pool's shard (pod to pod, in the cluster)
            forwarded = {n: "x-corral-shard" in api.results[n].headers for n in first}
            assert forwarded == {n: via != pool_holder[pool] for n, (via, pool) in first.items()}, forwarded
            # each replica bound the claims of its own pool
            wait_until(lambda: {n: b - before[n] for n, b in binds().items()} == {n: 2 for n in ops}, 30,
                       what="two binds by each replica", dump=lambda: (before, binds()))
            bound = claims_bound_once(cluster, list(first))

            # A command in each claimed sandbox through the replica that does not hold its pool: the execd proxy is
            # forwarded too, and its answer has one Date.
            for name, (_via, pool) in first.items():
                (non_holder,) = set(ops) - {pool_holder[pool]}
                r = httpx.post(f"{api.url(non_holder)}/v1/claims/{name}/execd/v1/command", headers=api.auth,
                               timeout=60, json={"command": "hostname; id -u"})
                assert r.status_code == 200 and r.headers.get("x-corral-shard"), (r.status_code, r.headers, r.text)
                assert (r.json()["exit_code"], r.json()["stdout"]) == (0, f"{bound[name]}\n1000\n"), r.json()
                assert len(r.headers.get_list("date")) == 1 and len(r.headers.get_list("server")) == 1, r.headers
            api.release(warm_holder, first)

            # The cold pool's holder is force-deleted while claims on both pools come through the other replica.
            graceful, _, _ = api.handover(cold_holder, warm_holder, ["python", cold], crash=False)
            # Then, the Deployment's replacement pod in, the warm pool's holder now crashes while claims come through
            # the other replica.
            ops, shards, _ = settled(cluster)
            victim = shards[shard_of(SBX_NS, "WarmPool", "python", SHARDS)]
            (via,) = set(ops) - {victim}
            crashed, since_renewal, held = api.handover(victim, via, ["python", cold], crash=True)
            by = "the replacement pod" if set(held.values()) - set(ops) else "the survivor"
            print(f"\nsharded (lease {LEASE} s): shards held again {graceful:.1f} s after a force delete, "
                  f"{crashed:.1f} s after a crash ({since_renewal:.1f} s after its last renewal; then by {by}); the "
                  f"test so far took {time.monotonic() - t_start:.0f} s")
            # released at SIGTERM, before the API drains its requests in flight: no lease to wait for
            assert graceful < LEASE / 2, f"shards moved {graceful:.1f} s after a force delete (lease {LEASE} s)"
            # the leases run out LEASE after the last renewal; a replacement that joined meanwhile takes its share
            # then (the survivor clears the dead replica's leases), not a whole lease after it first saw them
            assert since_renewal < LEASE + 1.5, \
                f"shards moved {since_renewal:.1f} s after the crashed replica's last renewal (lease {LEASE} s)"

            for name, pod in live_operators(cluster).items():
                api.logs[name] = cluster.kubectl("-n", OP_NS, "logs", name, check=False).stdout
                assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, pod["status"]
            broken = {n: text[max(0, text.index("Traceback") - 500):][:3000] for n, text in api.logs.items()
                      if "Traceback" in text}
            assert not broken, f"tracebacks in the operator logs: {broken}"
        finally:
            if api.made:
                cluster.kubectl("-n", SBX_NS, "delete", "sandboxclaims", *api.made, "--ignore-not-found",
                                "--wait=false", check=False)
            if extra_pool:
                cluster.kubectl("-n", SBX_NS, "delete", "pool", extra_pool, "--ignore-not-found", "--wait=false",
                                check=False)
            stack.close()  # the port-forwards, before their pods go
            dev_stack.unset("corral:controller.values.sharding", "corral:controller.values.replicas",
                            "corral:controller.values.networkPolicy")
            dev_stack.up()
            wait_until(lambda: [p for p in operator_pods(cluster) if ready(p) and p["metadata"]["labels"].get(
                "corral.dev/claims-api") == "active"] and len(operator_pods(cluster)) == 1, 300,
                       what="one active operator pod again")


KILL_EXECD = ("import os, signal\n"
              "for pid in os.listdir('/proc'):\n"
              "    try:\n"
              "        if pid.isdigit() and open(f'/proc/{pid}/comm').read().strip() == 'execd':\n"
              "            os.kill(int(pid), signal.SIGKILL); print('killed', pid)\n"
              "    except OSError:\n"
              "        pass\n")


def test_destroy_leaves_nothing_behind(kind_cluster, dev_stack):
    running = [p for p in pods(kind_cluster, SBX_NS, "app.kubernetes.io/managed-by=corral-operator") if ready(p)]
    assert len(running) >= 3, "destroy is tested on a running stack: its warm pool's sandboxes Ready"
    dev_stack.pulumi("destroy", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview")
    crds = kind_cluster.kubectl("get", "crd", "-o", "name").stdout
    assert "corral.dev" not in crds, crds

    def gone():
        left = kind_cluster.kubectl("get", "pods,pvc,networkpolicies,services", "-A", "-o", "name",
                                    "-l", "app.kubernetes.io/managed-by=corral-operator").stdout.strip()
        namespaces = kind_cluster.kubectl("get", "namespaces", "-o", "name").stdout
        return not left and OP_NS not in namespaces and SBX_NS not in namespaces and "gone"

    wait_until(gone, 300, what="no Corral object, pod, PVC or NetworkPolicy left", interval=2,
               dump=lambda: kind_cluster.kubectl("get", "pods,pvc,networkpolicies,namespaces", "-A",
                                                 check=False).stdout)


def test_host_kernel_settings_are_as_found(kind_cluster):
    """The kubelet sets vm.overcommit_memory, kernel.panic and kernel.panic_on_oops on start; in a kind node those
    are the host's own. The node image keeps them in its own mount namespace, so the host's stay as they were."""
    now = host_sysctls()
    changed = {k: (v, now[k]) for k, v in kind_cluster.sysctls_before.items() if k in now and now[k] != v}
    assert not changed, f"host kernel settings changed (before, now): {changed}"
    assert {"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} <= kind_cluster.sysctls_before.keys()
