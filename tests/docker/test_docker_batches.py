"""docker tier: batches on the Docker runtime (issue 17), through the SDK and the claims API on a real engine:

- a batch of 16 against a warm pool of 4: 4 warm and 12 cold sandboxes, none twice; results iterated as the tasks end,
  each with its own index's output; one task that exits 3 and one that times out counted right, in the results and
  in the batch metrics (the Kubernetes operator's names and labels);
- the operator SIGKILLed while the tasks run: after its restart every result arrives and no task ran twice;
- a sandbox removed mid-task fails only its index (SandboxLost);
- while tasks run, execd serves no request beyond each task's one wait stream (its own request metrics);
- a Pool's batch waits at poolMax and binds the rest as sandboxes come back; Retain keeps the sandboxes until the
  batch's ttlSecondsAfterFinished deletes it;
- the HTTP surface: an idempotent create, a Conflict for another pool, 404 for a missing pool, the list without
  outputs, the NDJSON events of a finished batch, DELETE.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from corral.operator.docker import desired as df
from corral.operator.docker.store import Store
from corral.operator.docker.tokens import execd_token

pytestmark = pytest.mark.docker

# index 3 exits 3, index 5 outlives the timeout, every other index exits 0; each prints its index first
TASK = ('echo "out $CORRAL_BATCH_INDEX"; [ "$CORRAL_BATCH_INDEX" = 3 ] && exit 3; '
        '[ "$CORRAL_BATCH_INDEX" = 5 ] && sleep 120; exit 0')


def metric(op, name: str, **labels: str) -> float:
    text = httpx.get(op.url + "/metrics", timeout=10).text
    for line in text.splitlines():
        m = re.match(rf"{re.escape(name)}{{(.*)}} ([0-9.e+-]+)$", line)
        if m and dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) == labels:
            return float(m.group(2))
    return 0.0


def wait_for(what: str, check, timeout: float = 120.0, op=None):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}\n{op.log()[-3000:] if op else ''}"
        time.sleep(0.2)


def gone(op, sandboxes) -> bool:
    return not any(op.containers(**{"corral.dev/sandbox": s}) for s in sandboxes)


def test_batch_of_16_through_the_sdk_results_as_they_end(make_operator):
    from corral.client import Client

    op = make_operator(warm={"shell": 4})
    op.wait_idle("shell", 4)
    client = Client(op.url, op.token)
    batch = client.batch("shell", 16, TASK, timeout=8)
    order = [(r.index, r.phase, r.exit_code, r.reason, r.output) for r in batch]  # as they end
    final = batch.refresh()
    assert sorted(i for i, *_ in order) == list(range(16))  # each index once
    assert order[-1][0] == 5  # the one that timed out ends last
    by_index = {i: rest for i, *rest in order}
    assert by_index[3] == ["Failed", 3, "NonZeroExit", "out 3\n"]
    assert by_index[5][0] == "Failed" and by_index[5][2] == "TaskTimeout" and by_index[5][3] == "out 5\n"
    assert all(by_index[i] == ["Succeeded", 0, "Completed", f"out {i}\n"] for i in range(16) if i not in (3, 5))
    assert (final.phase, final.bound, final.running, final.succeeded, final.failed) == ("Failed", 16, 0, 14, 2)
    assert final.finished_at is not None and final.started_at is not None
    sandboxes = [r.sandbox for r in final.results]
    assert len(set(sandboxes)) == 16 and all(sandboxes)  # none twice
    assert sorted(r.launch_type for r in final.results) == ["cold"] * 12 + ["warm"] * 4
    # The batch metrics, with the Kubernetes operator's names and labels (the stack is the namespace).
    assert metric(op, "corral_batch_tasks_total", outcome="Completed", pool="shell") == 14
    assert metric(op, "corral_batch_tasks_total", outcome="NonZeroExit", pool="shell") == 1
    assert metric(op, "corral_batch_tasks_total", outcome="TaskTimeout", pool="shell") == 1
    assert metric(op, "corral_batch_duration_seconds_count", phase="Failed", pool="shell") == 1
    assert metric(op, "corral_batch_tasks_running", namespace=op.stack, pool="shell") == 0
    # shutdownPolicy Delete: every sandbox of the batch goes (a WarmPool's is deleted), the pool refills to 4.
    wait_for("the batch's sandboxes deleted", lambda: gone(op, sandboxes), op=op)
    op.wait_idle("shell", 4)
    assert client.delete_batch(final.name) and client.batches() == []
    client.close()


def test_operator_killed_mid_batch_reattaches_and_nothing_runs_twice(make_operator):
    from corral.client import Client

    op = make_operator(warm={"shell": 3})
    op.wait_idle("shell", 3)
    # Each task counts its runs in its sandbox: a second start of the same index would print 2.
    task = ('echo run >> /tmp/runs; sleep "$((12 + CORRAL_BATCH_INDEX % 3 * 3))"; '
            'echo "i=$CORRAL_BATCH_INDEX runs=$(wc -l < /tmp/runs)"')
    with Client(op.url, op.token) as client:
        batch = client.batch("shell", 6, task, timeout=120)
        wait_for("every task started", lambda: (b := batch.refresh()).running + b.succeeded == 6, op=op)
        op.kill()  # SIGKILL: the tasks go on in their sandboxes, some end while the operator is down
        time.sleep(13)
        op.start()
        results = {r.index: r for r in batch}
        final = batch.refresh()
    assert sorted(results) == list(range(6))
    assert {i: (r.phase, r.output) for i, r in results.items()} == \
        {i: ("Succeeded", f"i={i} runs=1\n") for i in range(6)}
    assert (final.phase, final.succeeded) == ("Succeeded", 6)
    # The restarted operator counted only what ended after it started, and runs none now.
    assert metric(op, "corral_batch_tasks_running", namespace=op.stack, pool="shell") == 0
    assert metric(op, "corral_batch_tasks_total", outcome="Completed", pool="shell") <= 6


def test_a_sandbox_removed_mid_task_fails_only_its_index(make_operator):
    op = make_operator(warm={"shell": 3})
    op.wait_idle("shell", 3)
    with op.http() as http:
        r = http.post("/v1/batches", json={"name": "lost", "pool": "shell", "replicas": 3, "task": {
            "command": '[ "$CORRAL_BATCH_INDEX" = 0 ] && sleep 120; sleep 3; echo done'}})
        assert r.status_code == 201, r.text
        running = wait_for("3 tasks running", lambda: (b := http.get("/v1/batches/lost").json())["running"] == 3
                           and b, op=op)
        victim = running["results"][0]["sandbox"]
        op.client.api.remove_container(victim, force=True)
        got = wait_for("the batch finished", lambda: (b := http.get("/v1/batches/lost").json())["phase"]
                       in ("Succeeded", "Failed") and b, op=op)
    assert [(x["phase"], x["reason"]) for x in got["results"]] == \
        [("Failed", "SandboxLost"), ("Succeeded", "Completed"), ("Succeeded", "Completed")]
    assert (got["phase"], got["succeeded"], got["failed"]) == ("Failed", 2, 1)
    assert [x["output"] for x in got["results"][1:]] == ["done\n", "done\n"]


def execd_requests(op, batch: str) -> float:
    """Requests the batch's sandboxes' execds served (their metrics endpoint's own excepted), read with each index's
    token (derived from the operator's store as the operator derives it)."""
    store = Store(op.workdir / "state" / "corral.db")
    try:
        secret = bytes.fromhex(store.meta("token-secret", lambda: pytest.fail("no token secret")))
        b = store.batch(batch)
        assert b is not None
        targets = [(store.sandbox(t.sandbox), b.holder(t.idx)) for t in store.tasks(batch)]
    finally:
        store.close()
    total = 0.0
    for row, holder in targets:
        assert row is not None and row.ip
        text = httpx.get(f"http://{row.ip}:44772/v1/metrics", timeout=5,
                         headers={"Authorization": f"Bearer {execd_token(secret, row.name, holder)}"}).text
        total += sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                     if line.startswith("execd_http_requests_total") and "/v1/metrics" not in line)
    return total


def test_nothing_polls_execd_while_tasks_run(make_operator):
    op = make_operator(warm={"shell": 4})
    op.wait_idle("shell", 4)
    with op.http() as http:
        r = http.post("/v1/batches", json={"name": "quiet", "pool": "shell", "replicas": 4,
                                           "task": {"command": "sleep 8; echo fine"}})
        assert r.status_code == 201, r.text
        wait_for("4 tasks running", lambda: http.get("/v1/batches/quiet").json()["running"] == 4, op=op)
        before = execd_requests(op, "quiet")
        time.sleep(4)
        assert execd_requests(op, "quiet") == before  # no request to execd while the tasks run
        done = wait_for("the batch finished", lambda: (b := http.get("/v1/batches/quiet").json())["phase"]
                        == "Succeeded" and b, op=op)
        assert [x["output"] for x in done["results"]] == ["fine\n"] * 4


def test_pool_batch_waits_at_pool_max_and_retain_keeps_sandboxes_until_the_ttl(make_operator):
    op = make_operator(pools=[df.pool("pp", "shell", buffer_min=0, buffer_max=2, pool_max=2,
                                      recycle_strategy="Restart")])
    with op.http() as http:
        r = http.post("/v1/batches", json={"name": "small", "pool": "pp", "replicas": 3, "task": {
            "command": 'sleep 2; echo "s $CORRAL_BATCH_INDEX"'}})
        assert r.status_code == 201, r.text
        waiting = wait_for("2 bound, 1 waiting", lambda: (b := http.get("/v1/batches/small").json())["bound"] == 2
                           and b["message"] and b, op=op)
        assert "poolMax" in (waiting["message"] or "") and waiting["phase"] == "Running"
        done = wait_for("the batch finished", lambda: (b := http.get("/v1/batches/small").json())["phase"]
                        == "Succeeded" and b, op=op)
        assert [x["output"] for x in done["results"]] == ["s 0\n", "s 1\n", "s 2\n"]
        assert done["message"] is None
        # The third index took a sandbox that came back to the Pool (recycled by restart): at most 2 ever.
        assert len(op.containers()) <= 2

        r = http.post("/v1/batches", json={"name": "kept", "pool": "pp", "replicas": 2, "task": {"command": "true"},
                                           "shutdownPolicy": "Retain", "ttlSecondsAfterFinished": 3})
        assert r.status_code == 201, r.text
        kept = wait_for("finished", lambda: (b := http.get("/v1/batches/kept").json())["phase"] == "Succeeded"
                        and b, op=op)
        sandboxes = [x["sandbox"] for x in kept["results"]]
        time.sleep(1)
        assert not gone(op, sandboxes)  # Retain: kept while the batch lives
        wait_for("the TTL deleted the batch", lambda: http.get("/v1/batches/kept").status_code == 404, 30, op=op)
        pools = {p["name"]: p for p in http.get("/v1/pools").json()["items"]}
        wait_for("the kept sandboxes recycled", lambda: http.get("/v1/pools").json()["items"][0]["allocated"] == 0,
                 30, op=op)
        assert pools["pp"]["kind"] == "Pool"


def test_batch_http_surface(make_operator):
    op = make_operator(warm={"shell": 2, "shell-b": 0})
    op.wait_idle("shell", 2)
    with op.http() as http:
        body = {"name": "api", "pool": "shell", "replicas": 2,
                "task": {"argv": ["sh", "-c", "echo $CORRAL_BATCH_INDEX $X"], "env": {"X": "x"}}}
        r = http.post("/v1/batches", json=body)
        assert r.status_code == 201, r.text
        assert (r.json()["name"], r.json()["replicas"], r.json()["poolKind"]) == ("api", 2, "WarmPool")
        assert http.post("/v1/batches", json=body).status_code == 201  # a retry: the same batch
        other = http.post("/v1/batches", json={**body, "pool": "shell-b"})
        assert other.status_code == 409 and "shell-b" in other.json()["message"]
        missing = http.post("/v1/batches", json={**body, "name": "x", "pool": "nope"})
        assert missing.status_code == 404 and "nope" in missing.json()["message"]
        with http.stream("GET", "/v1/batches/api/events") as resp:
            assert resp.status_code == 200
            lines = [json.loads(x) for x in resp.iter_lines() if x.strip()]
        # the first state carries a progress line, or the task lines of what ended before the stream opened
        assert lines[0]["type"] in ("progress", "task") and lines[-1]["type"] == "end"
        assert {x["type"] for x in lines} <= {"progress", "task", "end"}
        tasks = sorted((x["task"]["index"], x["task"]["output"]) for x in lines if x["type"] == "task")
        assert tasks == [(0, "0 x\n"), (1, "1 x\n")]
        listed = http.get("/v1/batches", params={"pool": "shell"}).json()["items"]
        assert [b["name"] for b in listed] == ["api"] and all(x["output"] is None for x in listed[0]["results"])
        assert http.get("/v1/batches", params={"pool": "shell-b"}).json()["items"] == []
        with http.stream("GET", "/v1/batches/api/events") as resp:  # finished: its lines at once, then the end
            assert json.loads(list(resp.iter_lines())[-1])["type"] == "end"
        assert http.delete("/v1/batches/api").status_code == 204
        assert http.get("/v1/batches/api").status_code == 404
        assert http.get("/v1/batches/api/events").status_code == 404
        assert http.delete("/v1/batches/api").status_code == 404
    op.wait_idle("shell", 2)  # refilled: nothing is starting while the operator stops
