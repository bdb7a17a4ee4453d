"""Kubernetes mode, SandboxBatch (issue 17): a batch binds warm first then cold, none twice; each index's task runs
once through execd and its end (exit 0, exit 3, a timeout) is counted right; a batch for a missing pool waits with a
condition, then binds when the pool appears; a restarted operator re-attaches to running tasks and loses no result.

A real execd stands in for each kwok pod's on the pod's loopback IP (conftest.PodExecd): started for each sandbox as
it appears, before or after it is bound. The test polls the API server (the operator does not)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubeutil import Sandbox, idle_ready, status, template, wait_until, warm_pool
from lightkube.generic_resource import create_namespaced_resource

pytestmark = pytest.mark.kube

SandboxBatch = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxBatch", "sandboxbatches")

# Each task appends its index to a file in its execd's workspace (so a second run would show), then ends per index.
TASK = ('echo "$CORRAL_BATCH_INDEX" >> runs.txt; case "$CORRAL_BATCH_INDEX" in 1) exit 3;; 2) sleep 60;; '
        '*) sleep "${PAUSE:-0}"; exit 0;; esac')


def batch(name, pool_name, replicas, task=None, **spec):
    body = {"poolRef": {"kind": "WarmPool", "name": pool_name}, "replicas": replicas, **spec}
    if task is not None:
        body["task"] = task
    return SandboxBatch.from_dict({"metadata": {"name": name}, "spec": body})


def batch_status(kube, ns, name):
    return status(kube.get(SandboxBatch, name, namespace=ns))


class Execds:
    """Starts a PodExecd for every sandbox of the namespace that has an endpoint, once each."""

    def __init__(self, kube, ns, pod_execd):
        self.kube, self.ns, self.start, self.by_sandbox = kube, ns, pod_execd, {}

    def sweep(self, bound_only: bool = False) -> int:
        """Every sandbox's, or (`bound_only`) those of bound sandboxes only: a pool's refills need none."""
        for s in self.kube.list(Sandbox, namespace=self.ns, labels={"corral.dev/claim": None} if bound_only else None):
            name = s.metadata.name
            if name not in self.by_sandbox and (s.status or {}).get("endpoint") and not s.metadata.deletionTimestamp:
                self.by_sandbox[name] = self.start(s)
        return len(self.by_sandbox)

    def runs(self, sandbox: str) -> list[str]:
        path = Path(self.by_sandbox[sandbox].workdir) / "runs.txt"
        return path.read_text().split() if path.exists() else []


def settle(kube, ns, name, execds, timeout=90.0, done=lambda st: st.get("phase") in ("Succeeded", "Failed")):
    """Wait for the batch's status to satisfy `done`, starting execd for its sandboxes as they appear."""
    deadline = time.monotonic() + timeout
    while True:
        execds.sweep(bound_only=True)
        st = batch_status(kube, ns, name)
        if done(st):
            return st
        assert time.monotonic() < deadline, f"batch {name} did not settle: {st}"
        time.sleep(0.3)


def test_warm_first_then_cold_none_twice_and_outcomes_counted(kube, operator, ns, pod_execd):
    kube.create(template("t"), namespace=ns)
    kube.create(warm_pool("wp", "t", 3), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 3, 60, 0.2, "3 warm sandboxes")
    warm = {s.metadata.name for s in idle_ready(kube, ns, "wp")}
    execds = Execds(kube, ns, pod_execd)
    execds.sweep()
    before = operator.metrics()
    kube.create(batch("job", "wp", 5, {"command": TASK, "timeoutSeconds": 3}), namespace=ns)
    st = settle(kube, ns, "job", execds)

    entries = {e["index"]: e for e in st["indexes"]}
    assert sorted(entries) == [0, 1, 2, 3, 4]
    sandboxes = [e["sandbox"] for e in entries.values()]
    assert len(set(sandboxes)) == 5, sandboxes  # none twice
    launched = {e["sandbox"]: e["launchType"] for e in entries.values()}
    assert {s for s, lt in launched.items() if lt == "Warm"} == warm  # exactly the 3 warm ones
    assert sum(lt == "Cold" for lt in launched.values()) == 2
    assert (entries[0]["phase"], entries[0]["exitCode"], entries[0]["reason"]) == ("Succeeded", 0, "Completed")
    assert (entries[1]["phase"], entries[1]["exitCode"], entries[1]["reason"]) == ("Failed", 3, "NonZeroExit")
    assert (entries[2]["phase"], entries[2]["reason"]) == ("Failed", "TaskTimeout")
    assert entries[3]["phase"] == entries[4]["phase"] == "Succeeded"
    assert (st["phase"], st["bound"], st["running"], st["succeeded"], st["failed"]) == ("Failed", 5, 0, 3, 2)
    assert st.get("completionTime") and st.get("startTime")
    for i, e in entries.items():
        assert execds.runs(e["sandbox"]) == [str(i)], (i, e)  # each task ran once, with its own index
    after = operator.metrics()

    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    outcomes = {o: delta(f'corral_batch_tasks_total{{outcome="{o}",pool="wp"}}')
                for o in ("Completed", "NonZeroExit", "TaskTimeout")}
    assert outcomes == {"Completed": 3, "NonZeroExit": 1, "TaskTimeout": 1}
    assert delta('corral_batch_duration_seconds_count{phase="Failed",pool="wp"}') == 1
    assert after[f'corral_batch_tasks_running{{namespace="{ns}",pool="wp"}}'] == 0
    # shutdownPolicy Delete (the default): the ended tasks' sandboxes go
    wait_until(lambda: not [s for s in kube.list(Sandbox, namespace=ns) if s.metadata.name in sandboxes
                            and not s.metadata.deletionTimestamp], 30, 0.3, "the batch's sandboxes deleted")


def test_a_batch_for_a_missing_pool_waits_with_a_condition_then_binds(kube, operator, ns):
    kube.create(batch("later", "wp-later", 2), namespace=ns)  # no task: the batch only binds
    wait_until(lambda: any(c.get("reason") == "PoolNotFound" and c.get("status") == "False"
                           for c in batch_status(kube, ns, "later").get("conditions") or []), 30, 0.2,
               "PoolNotFound condition")
    assert batch_status(kube, ns, "later")["phase"] == "Pending"
    kube.create(template("t"), namespace=ns)
    kube.create(warm_pool("wp-later", "t", 1), namespace=ns)
    wait_until(lambda: batch_status(kube, ns, "later").get("phase") == "Finished", 60, 0.3, "batch bound")
    st = batch_status(kube, ns, "later")
    assert st["bound"] == 2 and all(e["phase"] == "Bound" for e in st["indexes"])
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in st["conditions"])
    assert len({e["sandbox"] for e in st["indexes"]}) == 2


def test_operator_restart_reattaches_and_loses_no_result(kube, operator, ns, pod_execd):
    kube.create(template("t"), namespace=ns)
    kube.create(warm_pool("wp", "t", 4), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 4, 60, 0.2, "4 warm sandboxes")
    execds = Execds(kube, ns, pod_execd)
    execds.sweep()
    task = {"command": 'echo "$CORRAL_BATCH_INDEX" >> runs.txt; sleep 4; exit "$CORRAL_BATCH_INDEX"'}
    kube.create(batch("long", "wp", 4, task), namespace=ns)
    settle(kube, ns, "long", execds, done=lambda st: st.get("running") == 4)
    operator.kill()  # SIGKILL while the 4 tasks run
    operator.start()
    st = settle(kube, ns, "long", execds)
    entries = {e["index"]: e for e in st["indexes"]}
    assert [entries[i]["exitCode"] for i in range(4)] == [0, 1, 2, 3]
    assert (st["succeeded"], st["failed"], st["running"]) == (1, 3, 0)
    for i, e in entries.items():
        assert execds.runs(e["sandbox"]) == [str(i)], (i, e)  # re-attached, not run again


def batch_writes(operator) -> float:
    return sum(v for k, v in operator.metrics().items()
               if k.startswith("corral_api_requests_total") and 'resource="SandboxBatch' in k)


def execd_requests(kube, ns, batch_name, execds) -> float:
    """Requests execd served for the batch's sandboxes (its metrics endpoint's own excepted), with the batch's token."""
    import httpx
    from kubeutil import TOKEN_SECRET
    from lightkube.resources.core_v1 import Pod  # noqa: F401  (the token derives from the Sandbox's uid)

    from corral.operator.tokens import claim_token

    uid = kube.get(SandboxBatch, batch_name, namespace=ns).metadata.uid
    total = 0.0
    for e in batch_status(kube, ns, batch_name)["indexes"]:
        sb = kube.get(Sandbox, e["sandbox"], namespace=ns)
        token = claim_token(TOKEN_SECRET.encode(), ns, sb.metadata.name, sb.metadata.uid, uid)
        text = httpx.get(f"{execds.by_sandbox[sb.metadata.name].url}/v1/metrics", timeout=5,
                         headers={"Authorization": f"Bearer {token}"}).text
        total += sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                     if line.startswith("execd_http_requests_total") and "/v1/metrics" not in line)
    return total


def test_tasks_ending_together_cost_a_handful_of_writes_and_nothing_polls_while_they_run(kube, operator, ns,
                                                                                         pod_execd):
    kube.create(template("t"), namespace=ns)
    kube.create(warm_pool("wp", "t", 8), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 8, 60, 0.2, "8 warm sandboxes")
    execds = Execds(kube, ns, pod_execd)
    execds.sweep()
    before = batch_writes(operator)
    kube.create(batch("many", "wp", 8, {"command": "sleep 6"}, lifecycle={"shutdownPolicy": "Retain"}), namespace=ns)
    settle(kube, ns, "many", execds, done=lambda st: st.get("running") == 8)
    writes, served = batch_writes(operator), execd_requests(kube, ns, "many", execds)
    time.sleep(2.5)  # the 8 tasks run: the operator asks neither execd nor the API server anything about them
    assert batch_writes(operator) == writes
    assert execd_requests(kube, ns, "many", execds) == served
    st = settle(kube, ns, "many", execds)
    assert (st["phase"], st["succeeded"]) == ("Succeeded", 8)
    total = batch_writes(operator) - before
    print(f"SandboxBatch writes for 8 replicas: {total:.0f}")
    assert total <= 6, total  # bound, started, ended: coalesced, not one per index and step


def test_a_sandbox_deleted_mid_task_fails_only_its_index(kube, operator, ns, pod_execd):
    kube.create(template("t"), namespace=ns)
    kube.create(warm_pool("wp", "t", 2), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 2, 60, 0.2, "2 warm sandboxes")
    execds = Execds(kube, ns, pod_execd)
    execds.sweep()
    task = {"command": 'if [ "$CORRAL_BATCH_INDEX" = 0 ]; then sleep 60; else sleep 4; fi'}
    kube.create(batch("lost", "wp", 2, task), namespace=ns)
    st = settle(kube, ns, "lost", execds, done=lambda st: st.get("running") == 2)
    victim = next(e["sandbox"] for e in st["indexes"] if e["index"] == 0)
    kube.delete(Sandbox, victim, namespace=ns)
    st = settle(kube, ns, "lost", execds)
    entries = {e["index"]: e for e in st["indexes"]}
    assert (entries[0]["phase"], entries[0]["reason"]) == ("Failed", "SandboxLost")
    assert victim in entries[0]["message"]
    assert (entries[1]["phase"], entries[1]["exitCode"]) == ("Succeeded", 0)
    assert (st["phase"], st["succeeded"], st["failed"]) == ("Failed", 1, 1)


def test_a_pool_batch_is_bounded_by_pool_max_and_binds_the_rest_when_there_is_room(kube, operator, ns):
    from kubeutil import Pool, pool
    from lightkube.types import PatchType

    kube.create(template("t"), namespace=ns)
    kube.create(pool("p", "t", capacity={"bufferMin": 0, "bufferMax": 0, "poolMin": 0, "poolMax": 3}), namespace=ns)
    spec = {"poolRef": {"kind": "Pool", "name": "p"}, "replicas": 4}
    kube.create(SandboxBatch.from_dict({"metadata": {"name": "pb"}, "spec": spec}), namespace=ns)
    wait_until(lambda: any(c.get("reason") == "PoolExhausted"
                           for c in batch_status(kube, ns, "pb").get("conditions") or []), 30, 0.2, "PoolExhausted")
    st = batch_status(kube, ns, "pb")
    assert st["bound"] == 3 and st["phase"] == "Pending"
    assert len(list(kube.list(Sandbox, namespace=ns, labels={"corral.dev/pool": "p"}))) == 3
    kube.patch(Pool, "p", {"spec": {"capacity": {"poolMax": 4}}}, namespace=ns, patch_type=PatchType.MERGE)
    wait_until(lambda: batch_status(kube, ns, "pb").get("phase") == "Finished", 60, 0.3, "4 bound")
    assert len({e["sandbox"] for e in batch_status(kube, ns, "pb")["indexes"]}) == 4


def test_a_batch_of_50_against_a_warm_pool_of_20_gets_exactly_20_warm_and_30_cold(kube, operator, ns):
    kube.create(template("t"), namespace=ns)
    kube.create(warm_pool("wp", "t", 20), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 20, 120, 0.3, "20 warm sandboxes")
    warm = {s.metadata.name for s in idle_ready(kube, ns, "wp")}
    kube.create(batch("fifty", "wp", 50), namespace=ns)  # no task: binding alone
    wait_until(lambda: batch_status(kube, ns, "fifty").get("phase") == "Finished", 180, 0.5, "50 bound")
    st = batch_status(kube, ns, "fifty")
    sandboxes = [e["sandbox"] for e in st["indexes"]]
    assert st["bound"] == 50 and len(set(sandboxes)) == 50  # none twice
    assert {e["sandbox"] for e in st["indexes"] if e["launchType"] == "Warm"} == warm
    assert sum(e["launchType"] == "Cold" for e in st["indexes"]) == 30
    labelled = {s.metadata.labels["corral.dev/claim"]: s.metadata.name
                for s in kube.list(Sandbox, namespace=ns, labels={"corral.dev/claim": None})}
    assert {f"fifty_{e['index']}": e["sandbox"] for e in st["indexes"]}.items() <= labelled.items()


def test_delete_foreground_finishes_the_batch_only_once_its_sandboxes_are_gone(kube, operator, ns, pod_execd):
    kube.create(template("t"), namespace=ns)
    kube.create(warm_pool("wp", "t", 3), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 3, 60, 0.2, "3 warm sandboxes")
    execds = Execds(kube, ns, pod_execd)
    execds.sweep()
    kube.create(batch("fg", "wp", 3, {"command": "sleep 1"}, lifecycle={"shutdownPolicy": "DeleteForeground"}),
                namespace=ns)
    st = settle(kube, ns, "fg", execds, done=lambda st: st.get("running") == 3)
    ours = {e["sandbox"] for e in st["indexes"]}
    seen_ended_with_sandboxes = False
    deadline = time.monotonic() + 60
    while True:  # read the batch first, then the sandboxes: a list made after the batch said it finished
        st = batch_status(kube, ns, "fg")
        left = {s.metadata.name for s in kube.list(Sandbox, namespace=ns)} & ours
        if st.get("phase") in ("Succeeded", "Failed"):
            assert not left, f"the batch finished while {sorted(left)} still existed"
            break
        seen_ended_with_sandboxes |= st.get("succeeded") == 3 and bool(left)
        assert time.monotonic() < deadline, st
        time.sleep(0.05)
    assert (st["phase"], st["succeeded"], st["running"]) == ("Succeeded", 3, 0)
    print(f"all 3 tasks ended while their sandboxes were still there, seen: {seen_ended_with_sandboxes}")


def test_a_restarted_operator_never_takes_a_noop_recycled_sandbox_s_old_command_for_its_task(kube, operator, ns,
                                                                                              pod_execd):
    """A Pool's Noop recycling keeps the pod, and its execd keeps the last user's finished command. An operator that
    bound the sandbox to a new batch and died before starting the task must, restarted, run the new task (it once
    re-attached to the newest background command it found there)."""
    from kubeutil import pool
    from lightkube.types import PatchType

    kube.create(template("t"), namespace=ns)
    kube.create(pool("p", "t", recycleStrategy="Noop",
                     capacity={"bufferMin": 1, "bufferMax": 1, "poolMin": 0, "poolMax": 1}), namespace=ns)
    wait_until(lambda: len(idle_ready(kube, ns, "p")) == 1, 60, 0.2, "1 idle sandbox")
    execds = Execds(kube, ns, pod_execd)
    execds.sweep()
    first = SandboxBatch.from_dict({"metadata": {"name": "first"}, "spec": {
        "poolRef": {"kind": "Pool", "name": "p"}, "replicas": 1, "task": {"command": "echo first >> runs.txt"},
        "lifecycle": {"shutdownPolicy": "Retain"}}})
    kube.create(first, namespace=ns)
    sandbox = settle(kube, ns, "first", execds)["indexes"][0]["sandbox"]
    kube.delete(SandboxBatch, "first", namespace=ns)  # the Pool recycles its sandbox as it is (Noop)
    wait_until(lambda: [s.metadata.name for s in idle_ready(kube, ns, "p")] == [sandbox], 60, 0.2, "recycled")
    assert execds.runs(sandbox) == ["first"]

    operator.kill()  # the operator that binds the next batch dies before it starts the task: done by hand here
    try:
        second = SandboxBatch.from_dict({"metadata": {"name": "second"}, "spec": {
            "poolRef": {"kind": "Pool", "name": "p"}, "replicas": 1,
            "task": {"command": "echo second >> runs.txt; exit 5"}}})
        uid = kube.create(second, namespace=ns).metadata.uid
        kube.patch(Sandbox, sandbox, {"metadata": {
            "labels": {"corral.dev/claim": "second_0"},
            "annotations": {"corral.dev/launch-type": "Warm", "corral.dev/claim-uid": uid}}},
            namespace=ns, patch_type=PatchType.MERGE)
        kube.patch(SandboxBatch.Status, "second", {"status": {
            "phase": "Running", "replicas": 1, "bound": 1,
            "indexes": [{"index": 0, "sandbox": sandbox, "launchType": "Warm", "phase": "Bound"}]}},
            namespace=ns, patch_type=PatchType.MERGE)
    finally:
        operator.start()
    st = settle(kube, ns, "second", execds)
    entry = st["indexes"][0]
    assert (entry["phase"], entry.get("exitCode"), entry["reason"]) == ("Failed", 5, "NonZeroExit"), entry
    assert execds.runs(sandbox) == ["first", "second"]  # its own task ran, once
