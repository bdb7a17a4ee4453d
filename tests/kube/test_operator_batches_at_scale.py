"""Kubernetes mode, SandboxBatch at scale (issue 17): SIGKILL the operator while 50 tasks run, and after its restart
every result arrives and no task runs twice; while 100 tasks run for 60 s the operator makes no API server request
and no execd request beyond the wait streams it holds open.

Each batch takes its sandboxes from a Pool whose buffer is the whole batch (bufferMin = poolMax = N): every index is
bound warm and nothing refills afterwards, so the API server requests in the quiet window could only come from the
batch. A real execd stands in for each kwok pod's (conftest.PodExecd), started before the batch.

The operator's API server requests are counted by the API server itself: for the quiet test the operator runs as
its own user (a client certificate from the test bed's CA), which a FlowSchema of its own matches, and the API
server's `apiserver_flowcontrol_dispatched_requests_total{flow_schema=...}` counts every request of that user,
watches included, whatever client library made it (kopf's watches or Corral's own calls)."""

from __future__ import annotations

import re
import ssl
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from kubeutil import TOKEN_SECRET, Sandbox, idle_ready, pool, template, wait_until
from lightkube.generic_resource import create_global_resource
from test_operator_batches import SandboxBatch, batch_status, settle

from corral.operator.tokens import claim_token

pytestmark = pytest.mark.kube

FlowSchema = create_global_resource("flowcontrol.apiserver.k8s.io", "v1", "FlowSchema", "flowschemas")
QUIET_USER = "corral-operator-quiet"


class ManyExecds:
    """A PodExecd for every sandbox of a pool, started 16 at a time (one after another, 100 took minutes)."""

    def __init__(self, kube, ns, pod_execd):
        self.kube, self.ns, self.start, self.by_sandbox = kube, ns, pod_execd, {}

    def start_all(self, sandboxes) -> None:
        todo = [s for s in sandboxes if s.metadata.name not in self.by_sandbox]
        with ThreadPoolExecutor(16) as pool_:
            for s, d in zip(todo, pool_.map(self.start, todo), strict=True):
                self.by_sandbox[s.metadata.name] = d

    def sweep(self, bound_only: bool = False) -> int:  # settle()'s interface: every execd is there already
        return len(self.by_sandbox)

    def runs(self, sandbox: str) -> list[str]:
        path = Path(self.by_sandbox[sandbox].workdir) / "runs.txt"
        return path.read_text().split() if path.exists() else []

    def requests(self, sandbox: str, token: str) -> dict[str, float]:
        """execd's own request counts by route (`METHOD route`), its /v1/metrics and /v1/health (the test's) aside, and
        the requests it refused with 401: another test bed on this machine gives its kwok pods the same loopback IPs
        and execd port, so its clients reach these execds now and then, without their token."""
        text = httpx.get(f"{self.by_sandbox[sandbox].url}/v1/metrics", timeout=10,
                         headers={"Authorization": f"Bearer {token}"}).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("execd_http_requests_total{"):
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.rpartition(" ")[0]))  # routes hold "{id:id}"
            if labels["route"] in ("/v1/metrics", "/v1/health") or labels["status"] == "401":
                continue
            key = f"{labels['method']} {labels['route']}"
            out[key] = out.get(key, 0.0) + float(line.rpartition(" ")[2])
        return out


def full_pool(kube, ns, pod_execd, n: int) -> ManyExecds:
    """A Pool of n ready idle sandboxes that never refills (bufferMin = poolMax = n), an execd in each."""
    kube.create(template("t"), namespace=ns)
    kube.create(pool("p", "t", capacity={"bufferMin": n, "bufferMax": n, "poolMin": 0, "poolMax": n}), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "p")) == n, 240, 0.5, f"{n} idle sandboxes")
    execds = ManyExecds(kube, ns, pod_execd)
    execds.start_all(idle_ready(kube, ns, "p"))
    return execds


def pool_batch(name: str, replicas: int, command: str, **spec):
    return SandboxBatch.from_dict({"metadata": {"name": name}, "spec": {
        "poolRef": {"kind": "Pool", "name": "p"}, "replicas": replicas, "task": {"command": command}, **spec}})


def test_sigkill_the_operator_while_50_tasks_run_every_result_arrives_and_none_runs_twice(kube, operator, ns,
                                                                                          pod_execd):
    execds = full_pool(kube, ns, pod_execd, 50)
    task = 'echo "$CORRAL_BATCH_INDEX" >> runs.txt; sleep 10; exit $((CORRAL_BATCH_INDEX % 4))'
    kube.create(pool_batch("fifty", 50, task), namespace=ns)
    st = settle(kube, ns, "fifty", execds, timeout=120,
                done=lambda st: st.get("running") == 50 and all(e.get("commandId") for e in st["indexes"]))
    started = {e["index"]: (e["sandbox"], e["commandId"]) for e in st["indexes"]}
    operator.kill()  # SIGKILL: no goodbye, no last status write
    operator.start()
    st = settle(kube, ns, "fifty", execds, timeout=120)

    entries = {e["index"]: e for e in st["indexes"]}
    assert sorted(entries) == list(range(50))
    for i, e in entries.items():
        assert (e["sandbox"], e["commandId"]) == started[i], (i, e)  # re-attached to the same command
        assert e.get("exitCode") == i % 4, (i, e)  # its own result
        assert e["phase"] == ("Succeeded" if i % 4 == 0 else "Failed"), (i, e)
        assert execds.runs(e["sandbox"]) == [str(i)], (i, e)  # ran once
    assert (st["phase"], st["succeeded"], st["failed"], st["running"]) == ("Failed", 13, 37, 0)


# ---- the quiet window --------------------------------------------------------------------------------------------
class ApiServer:
    """The test bed's API server as its admin sees it: its /metrics."""

    def __init__(self, kubeconfig: str) -> None:
        config = yaml.safe_load(Path(kubeconfig).read_text())
        self.server = config["clusters"][0]["cluster"]["server"]
        self.ca = ssl.create_default_context(cafile=config["clusters"][0]["cluster"]["certificate-authority"])
        self.token = config["users"][0]["user"]["token"]
        self.kubeconfig = kubeconfig

    def metrics(self) -> list[str]:
        return httpx.get(f"{self.server}/metrics", verify=self.ca, timeout=30,
                         headers={"Authorization": f"Bearer {self.token}"}).text.splitlines()

    def dispatched(self, flow_schema: str) -> float:
        """Requests the API server dispatched through this FlowSchema (watches counted when they start)."""
        pattern = f'apiserver_flowcontrol_dispatched_requests_total{{flow_schema="{flow_schema}",'
        return sum(float(line.rpartition(" ")[2]) for line in self.metrics() if line.startswith(pattern))

    def requests(self) -> dict[str, float]:
        """Every client's requests by verb and resource (apiserver_request_total): what a failure message shows."""
        out: dict[str, float] = {}
        for line in self.metrics():
            if line.startswith("apiserver_request_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.partition("}")[0]))
                key = f"{labels.get('verb')} {labels.get('resource')}/{labels.get('subresource', '')}"
                out[key] = out.get(key, 0.0) + float(line.rpartition(" ")[2])
        return out


@pytest.fixture
def operator_as_its_own_user(kube, kube_cluster, operator, tmp_path):
    """The session's operator restarted as user QUIET_USER (cluster-admin; its FlowSchema counts its requests), and
    as before afterwards. Restarted here also means its watches are fresh: kopf renews each every 600 s
    (handlers.py, settings.watching.server_timeout), a request the quiet window must not catch by chance."""
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.models.rbac_v1 import RoleRef, Subject
    from lightkube.resources.rbac_authorization_v1 import ClusterRoleBinding

    api = ApiServer(kube_cluster.kubeconfig)
    pki = Path(kube_cluster.kubeconfig).parent / "pki"
    key, csr, crt = tmp_path / "op.key", tmp_path / "op.csr", tmp_path / "op.crt"
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
                    "-subj", f"/CN={QUIET_USER}"], check=True, capture_output=True)
    subprocess.run(["openssl", "x509", "-req", "-in", csr, "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key",
                    "-CAcreateserial", "-CAserial", tmp_path / "ca.srl", "-days", "1", "-out", crt],
                   check=True, capture_output=True)
    config = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    config["users"] = [{"name": QUIET_USER, "user": {"client-certificate": str(crt), "client-key": str(key)}}]
    config["contexts"][0]["context"]["user"] = QUIET_USER
    kubeconfig = tmp_path / "operator.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    binding = f"{QUIET_USER}-{uuid.uuid4().hex[:6]}"
    kube.create(ClusterRoleBinding(metadata=ObjectMeta(name=binding),
                                   roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="ClusterRole",
                                                   name="cluster-admin"),
                                   subjects=[Subject(kind="User", name=QUIET_USER,
                                                     apiGroup="rbac.authorization.k8s.io")]))
    kube.apply(FlowSchema.from_dict({"metadata": {"name": QUIET_USER}, "spec": {
        "matchingPrecedence": 50, "priorityLevelConfiguration": {"name": "exempt"},
        "rules": [{"subjects": [{"kind": "User", "user": {"name": QUIET_USER}}],
                   "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"],
                                      "clusterScope": True}],
                   "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}), force=True)
    before = api.dispatched(QUIET_USER)
    operator.stop()
    operator.kubeconfig = str(kubeconfig)
    try:
        operator.start()
        assert api.dispatched(QUIET_USER) > before + 5, "the operator's requests are not counted under its user"
        yield api
    finally:
        operator.stop()
        operator.kubeconfig = api.kubeconfig
        operator.start()
        kube.delete(FlowSchema, QUIET_USER)
        kube.delete(ClusterRoleBinding, binding)


def test_while_100_tasks_run_for_60_s_the_operator_asks_neither_the_api_server_nor_execd_anything(
        kube, operator, operator_as_its_own_user, ns, pod_execd):
    api: ApiServer = operator_as_its_own_user
    n, window, task_seconds = 100, 60.0, 90
    execds = full_pool(kube, ns, pod_execd, n)
    kube.create(pool_batch("hundred", n, f"sleep {task_seconds}", lifecycle={"shutdownPolicy": "Retain"}),
                namespace=ns)
    created = time.monotonic()
    st = settle(kube, ns, "hundred", execds, timeout=120, done=lambda st: st.get("running") == n)
    # the status write that says so, the Pool's status: wait for the operator to fall quiet (bounded)
    quiet_from, last = time.monotonic(), api.dispatched(QUIET_USER)
    while time.monotonic() - quiet_from < 3:
        time.sleep(0.5)
        now = api.dispatched(QUIET_USER)
        if now != last:
            quiet_from, last = time.monotonic(), now
        assert time.monotonic() - created < 60, "the operator did not fall quiet with every task running"
    uid = kube.get(SandboxBatch, "hundred", namespace=ns).metadata.uid
    tokens = {}
    for e in st["indexes"]:
        sb = kube.get(Sandbox, e["sandbox"], namespace=ns)
        tokens[e["sandbox"]] = claim_token(TOKEN_SECRET.encode(), ns, sb.metadata.name, sb.metadata.uid, uid)
    served = {s: execds.requests(s, t) for s, t in tokens.items()}
    ops, everyone = operator.metrics(), api.requests()

    time.sleep(window)

    def changes(before: dict[str, float], after: dict[str, float], prefix: str = "") -> dict[str, float]:
        return {k: v - before.get(k, 0.0) for k, v in after.items()
                if k.startswith(prefix) and v != before.get(k, 0.0)}

    assert api.dispatched(QUIET_USER) == last, (
        "the operator made API server requests while the tasks ran; every client's meanwhile: "
        f"{changes(everyone, api.requests())}; the operator's own count: "
        f"{changes(ops, operator.metrics(), 'corral_api_requests_total')}")
    assert not changes(ops, operator.metrics(), "corral_api_requests_total")
    assert {s: execds.requests(s, t) for s, t in tokens.items()} == served, "execd was asked something meanwhile"
    assert batch_status(kube, ns, "hundred")["running"] == n  # the window was inside the tasks' run

    st = settle(kube, ns, "hundred", execds, timeout=task_seconds + 60)
    assert (st["phase"], st["succeeded"]) == ("Succeeded", n)
    for s, t in tokens.items():  # one start, one wait stream (never reopened), per sandbox
        counts = execds.requests(s, t)
        assert counts.get("POST /v1/command") == 1, (s, counts)
        assert counts.get("GET /v1/command/{id:id}/wait") == 1, (s, counts)
