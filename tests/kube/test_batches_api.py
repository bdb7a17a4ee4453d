"""kube tier: batches through the operator's claims API (issue 17): POST/GET/DELETE /v1/batches, the NDJSON events
stream, the SDK (sync and async iteration as tasks end) and `corral batch` (summary table, exit 1 when a task failed).

A real execd stands in for each kwok pod's (conftest.PodExecd), started by a background sweep for every sandbox of
the API's namespace as it gets an endpoint: the batch's cold sandboxes appear while the SDK or CLI is following it.
Each index's output tail must arrive although its sandbox is deleted as soon as its task ended (shutdownPolicy
Delete): the operator reads it before the end is written."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import pytest
from kubeutil import Sandbox, idle_ready, template, wait_until, warm_pool

pytestmark = pytest.mark.kube

# index 1 exits 3, every other index 0; each prints its index first
TASK = 'echo "out $CORRAL_BATCH_INDEX"; [ "$CORRAL_BATCH_INDEX" = 1 ] && exit 3; exit 0'


@pytest.fixture
def execds(kube, api_ns, pod_execd):
    """Starts execd for every sandbox of the namespace with an endpoint, once each, every 0.2 s until the test ends."""
    started: set[str] = set()
    stop = threading.Event()

    def sweep() -> None:
        while not stop.is_set():
            try:
                for s in kube.list(Sandbox, namespace=api_ns):
                    if s.metadata.name not in started and (s.status or {}).get("endpoint") \
                            and not s.metadata.deletionTimestamp:
                        started.add(s.metadata.name)
                        pod_execd(s)
            except Exception:  # noqa: BLE001 - a pod deleted between the list and the start: next round
                pass
            stop.wait(0.2)

    thread = threading.Thread(target=sweep, daemon=True)
    thread.start()
    yield started
    stop.set()
    thread.join(timeout=10)


@pytest.fixture
def pool_name(kube, api_ns, uid):
    kube.create(template(f"t-{uid}"), namespace=api_ns)
    kube.create(warm_pool(f"wp-{uid}", f"t-{uid}", 3), namespace=api_ns)
    wait_until(lambda: len(idle_ready(kube, api_ns, f"wp-{uid}")) == 3, 60, 0.2, "3 warm sandboxes")
    return f"wp-{uid}"


def events(http: httpx.Client, name: str) -> list[dict]:
    with http.stream("GET", f"/v1/batches/{name}/events") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in r.iter_lines() if line.strip()]


def test_batch_api_create_follow_get_list_delete(http, pool_name, execds, uid):
    r = http.post("/v1/batches", json={"name": f"api-{uid}", "pool": pool_name, "replicas": 3,
                                       "task": {"command": TASK, "timeoutSeconds": 60}})
    assert r.status_code == 201, r.text
    created = r.json()
    assert (created["name"], created["replicas"], created["poolKind"]) == (f"api-{uid}", 3, "WarmPool")
    assert http.post("/v1/batches", json={"name": f"api-{uid}", "pool": pool_name, "replicas": 3,
                                          "task": {"command": TASK}}).status_code == 201  # a retry: the same batch

    lines = events(http, f"api-{uid}")
    assert lines[0]["type"] == "progress" and lines[-1]["type"] == "end"
    tasks = {x["task"]["index"]: x["task"] for x in lines if x["type"] == "task"}
    assert sorted(tasks) == [0, 1, 2] and len([x for x in lines if x["type"] == "task"]) == 3  # each index once
    assert (tasks[1]["phase"], tasks[1]["exitCode"], tasks[1]["reason"]) == ("Failed", 3, "NonZeroExit")
    assert all(tasks[i]["phase"] == "Succeeded" and tasks[i]["exitCode"] == 0 for i in (0, 2))
    assert {i: t["output"] for i, t in tasks.items()} == {i: f"out {i}\n" for i in range(3)}
    assert (lines[-1]["phase"], lines[-1]["succeeded"], lines[-1]["failed"]) == ("Failed", 2, 1)

    got = http.get(f"/v1/batches/api-{uid}").json()  # later: the tails outlive the sandboxes
    assert got["phase"] == "Failed" and [x["output"] for x in got["results"]] == ["out 0\n", "out 1\n", "out 2\n"]
    assert len({x["sandbox"] for x in got["results"]}) == 3
    assert sum(x["launchType"] == "warm" for x in got["results"]) == 3
    assert events(http, f"api-{uid}")[-1]["type"] == "end"  # a finished batch: its lines at once, then the end
    listed = http.get("/v1/batches", params={"pool": pool_name}).json()["items"]
    assert [b["name"] for b in listed] == [f"api-{uid}"] and all(x["output"] is None for x in listed[0]["results"])

    assert http.delete(f"/v1/batches/api-{uid}").status_code == 204
    assert http.get(f"/v1/batches/api-{uid}").json()["code"] == "not_found"
    assert http.get(f"/v1/batches/api-{uid}/events").status_code == 404
    missing = http.post("/v1/batches", json={"pool": f"none-{uid}", "replicas": 1, "task": {"command": "true"}})
    assert missing.status_code == 404 and "none-" in missing.json()["message"]
    both = http.post("/v1/batches", json={"pool": pool_name, "replicas": 1, "task": {"command": "x", "argv": ["x"]}})
    assert both.status_code == 400 and "exactly one of argv and command" in both.json()["message"]


def test_sdk_iterates_results_as_tasks_end_sync_and_async(operator, api_ns, pool_name, execds):
    from corral.client import AsyncClient, Client

    with Client(operator.api_url, operator.api_token) as client:
        with client.batch(pool_name, 4, ["sh", "-c", 'sleep "$CORRAL_BATCH_INDEX"; echo "sdk $CORRAL_BATCH_INDEX"'],
                          timeout=60) as batch:
            order = [(r.index, r.phase, r.output) for r in batch]  # 4 > 3 warm: one cold, started meanwhile
        assert sorted(order) == [(i, "Succeeded", f"sdk {i}\n") for i in range(4)]
        assert [i for i, _, _ in order] == [0, 1, 2, 3]  # as they ended (1 s apart)
        assert client.batches(pool_name) == []  # `with` deleted it

    async def run() -> list[tuple[int, int | None]]:
        async with AsyncClient(operator.api_url, operator.api_token) as client:
            async with client.batch(pool_name, 2, TASK) as batch:
                got = [(r.index, r.exit_code) async for r in batch]
                final = await batch.refresh()
                assert (final.phase, final.failed) == ("Failed", 1)
                return got

    assert sorted(asyncio.run(run())) == [(0, 0), (1, 3)]


def test_cli_batch_prints_a_summary_and_exits_1_when_a_task_failed(operator, api_ns, pool_name, execds):
    from typer.testing import CliRunner

    from corral.client.cli import app

    env = {"CORRAL_API_URL": operator.api_url, "CORRAL_API_TOKEN": operator.api_token, "COLUMNS": "200"}
    res = CliRunner().invoke(app, ["batch", pool_name, "-n", "2", "--rm", "--", "sh", "-c", TASK], env=env)
    assert res.exit_code == 1, res.output
    rows = {int(cells[0]): cells for line in res.output.splitlines() if line.startswith("│")
            and (cells := [c.strip() for c in line.split("│")[1:-1]])[0].isdigit()}
    assert rows[0][2:5] == ["Succeeded", "0", "Completed"] and rows[0][5] == "out 0"
    assert rows[1][2:5] == ["Failed", "3", "NonZeroExit"] and rows[1][5] == "out 1"
    assert "1 succeeded, 1 failed of 2" in res.output
    ok = CliRunner().invoke(app, ["batch", pool_name, "-n", "1", "--rm", "-q", "--", "echo", "fine"], env=env)
    assert ok.exit_code == 0, ok.output
    assert "fine" in ok.output
    missing = CliRunner().invoke(app, ["batch", "no-such-pool", "-n", "1", "--", "true"], env=env)
    assert missing.exit_code == 1 and "no-such-pool" in missing.output
