"""A SandboxBatch task's follower (corral.operator.reconcile.batchtasks.follow) against a real execd app in process
(its ASGI app behind the operator's own HTTP client) or a closed port, with a real Context and Cache over the
in-memory API (fakekube.py).

Scenarios: an execd that never answers fails its index (ExecdUnreachable) once the patience has run out, and not
before; a sandbox recycled as it is (a Pool's Noop) still holds the previous user's finished command, which a new
batch's follower never takes for its own; a restarted operator that died before the command id reached the status
gets the task it had started, not a second run.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import httpx
from fakekube import FakeKube, Operator

from corral.api.batch import BatchTask
from corral.api.common import API_VERSION
from corral.components import catalogue
from corral.execd.app import create_app
from corral.execd.settings import Settings as ExecdSettings
from corral.operator.batchbook import BatchState
from corral.operator.builders import owner_ref, sandbox_labels, sandbox_manifest
from corral.operator.constants import L_CLAIM, L_MANAGED_BY, L_SANDBOX, MANAGED_BY
from corral.operator.core import batches as b
from corral.operator.reconcile.batchtasks import follow
from corral.operator.tokens import idle_token

NS, TEMPLATE, SANDBOX, BATCH = "team", "shell", "p-abc12", "job"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket is closed: connection refused


def bound_sandbox(port: int) -> Operator:
    """A Pool sandbox whose claim label names index 0 of BATCH, Ready, its pod running, execd at 127.0.0.1:port."""
    fake = FakeKube()
    template = fake.put({"apiVersion": API_VERSION, "kind": "SandboxTemplate",
                         "metadata": {"name": TEMPLATE, "namespace": NS},
                         "spec": catalogue.render("shell").to_k8s()})
    pool = fake.put({"apiVersion": API_VERSION, "kind": "Pool", "metadata": {"name": "p", "namespace": NS},
                     "spec": {"templateRef": {"name": TEMPLATE}, "recycleStrategy": "Noop",
                              "capacity": {"bufferMin": 0, "bufferMax": 1, "poolMin": 0, "poolMax": 1}}})
    labels = {**sandbox_labels(TEMPLATE, pool="p", pool_kind="Pool", bp_hash="h"), L_CLAIM: b.claim_label(BATCH, 0)}
    body = sandbox_manifest(name=SANDBOX, namespace=NS, template_name=TEMPLATE, blueprint=template["spec"],
                            labels=labels, owner=owner_ref(pool))
    body["status"] = {"phase": "Running", "podIPs": ["127.0.0.1"], "endpoint": f"127.0.0.1:{port}",
                      "conditions": [{"type": "Ready", "status": "True", "reason": "PodReady"}]}
    sandbox = fake.put(body)
    fake.put({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": SANDBOX, "namespace": NS, "labels": {L_SANDBOX: SANDBOX, L_MANAGED_BY: MANAGED_BY},
        "ownerReferences": [owner_ref(sandbox)]}, "spec": {"nodeName": "n1"},
        "status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
                   "conditions": [{"type": "Ready", "status": "True"}]}})
    return Operator(fake, settings={"token_secret": "unit"})  # one secret: a restarted process has the same


def state(**entry: Any) -> BatchState:
    return BatchState(indexes=[{"index": 0, "phase": b.BOUND, "sandbox": SANDBOX, **entry}])


async def test_an_execd_that_never_answers_fails_its_index_once_the_patience_has_run_out() -> None:
    op = bound_sandbox(closed_port())
    st = state()
    t0 = time.monotonic()
    await follow(op.ctx, st, NS, BATCH, "batch-uid", 0, BatchTask(command="true"), patience=1.5)
    elapsed = time.monotonic() - t0
    entry = st.indexes[0]  # type: ignore[index]
    assert (entry["phase"], entry["reason"]) == ("Failed", b.R_EXECD_UNREACHABLE), entry
    assert SANDBOX in entry["message"] and "commandId" not in entry
    assert 1.5 <= elapsed < 3.0, elapsed  # not before the patience ran out, and one attempt after it at most


async def test_a_recycled_sandbox_keeps_its_old_command_and_a_restart_before_the_id_was_written_runs_nothing_twice(
        tmp_path: Path) -> None:
    op = bound_sandbox(8000)
    pod_uid = op.ctx.cache.pod(NS, SANDBOX).uid  # type: ignore[union-attr]
    idle = idle_token(op.ctx.token_key, NS, SANDBOX, pod_uid)
    app = create_app(ExecdSettings(token=idle, workspace=tmp_path, roots=[tmp_path]))
    op.ctx._http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=10)
    runs = tmp_path / "runs.txt"
    # the sandbox's previous user (a claim or batch, gone; the Pool recycled it as it is) ran a background command
    old = await op.ctx.http().post("http://127.0.0.1:8000/v1/command", headers={"Authorization": f"Bearer {idle}"},
                                   json={"command": "echo old >> runs.txt; exit 7", "background": True})
    assert old.status_code == 202
    await op.ctx.http().get(f"http://127.0.0.1:8000/v1/command/{old.json()['id']}/wait",
                            headers={"Authorization": f"Bearer {idle}"})
    task = BatchTask(command='echo "new $CORRAL_BATCH_INDEX" >> runs.txt; exit 5')

    st = state()
    await follow(op.ctx, st, NS, BATCH, "batch-uid", 0, task)
    first = st.indexes[0]  # type: ignore[index]
    assert first["commandId"] != old.json()["id"]
    assert (first["phase"], first["exitCode"], first["reason"]) == ("Failed", 5, b.R_EXIT_CODE)
    assert runs.read_text().split("\n")[:2] == ["old", "new 0"]

    # a new operator process whose predecessor started the task and died before writing its id
    restarted = bound_sandbox(8000)
    restarted.ctx._http = op.ctx._http
    st = state()
    await follow(restarted.ctx, st, NS, BATCH, "batch-uid", 0, task)
    again = st.indexes[0]  # type: ignore[index]
    assert again["commandId"] == first["commandId"] and again["exitCode"] == 5
    assert runs.read_text().split("\n") == ["old", "new 0", ""]  # ran once
