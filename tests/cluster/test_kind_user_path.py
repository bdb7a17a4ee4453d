"""The user's path on a real node: `pulumi up --stack dev` on kind, the operator as a pod from its chart, warm pools
of real pods made Ready by the kubelet's probe, the SDK through a port-forward to the claims API Service, the chart's
NetworkPolicies enforced, the operator pod deleted mid-stream, `pulumi destroy` leaving nothing, and the host's
kernel as it was.

The tests run in file order and share one stack (a real cluster costs minutes to fill)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from clusterutil import host_sysctls
from waiting import wait_until

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
    import json as _json
    kind_cluster.kubectl("apply", "-f", "-", input=_json.dumps({"apiVersion": "v1", "kind": "List",
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
    import json as _json

    def idle_ready_pods():
        found = [p for p in pods(kind_cluster, SBX_NS, "corral.dev/pool=python")
                 if ready(p) and "corral.dev/claim" not in p["metadata"]["labels"]]
        return len(found) >= 2 and found

    python_pods = wait_until(idle_ready_pods, 600, what="two idle Ready python sandboxes", interval=2)
    for pod in python_pods:
        assert 'CORRAL_EXECD_TOKEN"' not in _json.dumps(pod["spec"])
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
                             "-p", _json.dumps({"spec": {"readinessGraceSeconds": grace}}), check=False)


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
