"""unit: batches through the claims API (issue 17) without a cluster: the tail of execd's logs body read as it
streams (core.outputs), the events stream built from a backend's states (claimsapi/events.py), and the SDK and CLI
over the real app (the SDK's requests forwarded in process to a backend whose batch progresses state by state)."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime

import httpx
import pytest

from corral.api.wire import Batch, BatchTaskResult
from corral.client import _ops as ops
from corral.client.cli import app, tail_lines
from corral.client.errors import InvalidRequest, NotFound
from corral.client.sync import Client
from corral.operator.claimsapi import NotFound as Missing
from corral.operator.claimsapi.events import BatchFollower, ndjson
from corral.operator.core.outputs import LogsTail, NotLogs, OutputStore, tail_of


def logs_body(chunks: list[tuple[bytes, str]], **trailer: object) -> bytes:
    items = [{"seq": i + 1, "stream": "stdout", "data": base64.b64encode(d).decode() if enc == "base64" else d.decode(),
              "encoding": enc} for i, (d, enc) in enumerate(chunks)]
    return json.dumps({"id": "c1", "running": False, "chunks": items, "next_cursor": len(items), "dropped": 0,
                       "dropped_bytes": 0, "truncated": False, **trailer}).encode()


def test_logs_tail_keeps_the_last_bytes_whatever_the_pieces():
    body = logs_body([(f"line {i}\n".encode(), "utf-8") for i in range(5000)] + [(b"\xff\xfe end\n", "base64")])
    for piece in (1, 7, 4096, len(body)):
        tail = LogsTail(limit=32)
        for at in range(0, len(body), piece):
            tail.feed(body[at:at + piece])
        got = tail.result()
        assert got.text.endswith("line 4999\n\ufffd\ufffd end\n") and len(got.text.encode()) <= 32 + 4, got
        assert got.truncated and got.size == sum(len(f"line {i}\n") for i in range(5000)) + 7
    small = LogsTail()
    small.feed(logs_body([(b"hello\n", "utf-8"), (b"world\n", "utf-8")]))
    assert small.result().text == "hello\nworld\n" and not small.result().truncated
    dropped = LogsTail()
    dropped.feed(logs_body([(b"x", "utf-8")], dropped=3, truncated=True))
    assert dropped.result().truncated  # execd dropped older chunks: said so even though the tail is whole
    with pytest.raises(NotLogs):
        broken = LogsTail()
        broken.feed(b'{"error": "nope"}')
        broken.result()
    with pytest.raises(NotLogs):  # one chunk past the bound: not buffered without end
        LogsTail().feed(b'{"chunks":[{"data":"' + b"a" * (2 << 20))
    assert tail_of("é".encode()[1:] + b"ok", truncated=True).text == "ok"  # a character cut at the start is dropped


def test_output_store_is_bounded_and_keyed_by_uid():
    store = OutputStore(max_chars=10)
    store.put("u1", 0, tail_of(b"abcdef", truncated=False))
    store.put("u1", 1, tail_of(b"ghijkl", truncated=False))
    assert store.get("u1", 0) is None and store.get("u1", 1).text == "ghijkl" and len(store) == 1
    assert store.get("u2", 1) is None


def state(phase: str, ended: dict[int, int], replicas: int = 3, running: int = 0) -> Batch:
    results = [BatchTaskResult(index=i, phase=("Succeeded" if ended[i] == 0 else "Failed") if i in ended else
                               "Running", exit_code=ended.get(i), output=f"out {i}\n" if i in ended else None)
               for i in range(replicas)]
    failed = sum(1 for c in ended.values() if c)
    return Batch(name="b", pool="p", pool_kind="WarmPool", phase=phase, replicas=replicas, bound=replicas,
                 running=running, succeeded=len(ended) - failed, failed=failed, created=datetime.now(UTC),
                 results=results)


def test_follower_sends_each_ended_index_once_then_end():
    f = BatchFollower()
    first = f.step(state("Running", {}, running=3))
    assert [e.type for e in first] == ["progress"]
    assert f.step(state("Running", {}, running=3)) == []  # nothing changed: nothing sent
    second = f.step(state("Running", {2: 3}, running=2))
    assert [(e.type, e.task.index, e.failed) for e in second] == [("task", 2, 1)]
    last = f.step(state("Failed", {0: 0, 1: 0, 2: 3}))
    assert [(e.type, e.task.index if e.task else None) for e in last] == [("task", 0), ("task", 1), ("end", None)]
    assert f.ended and last[-1].phase == "Failed" and last[-1].succeeded == 2


def test_ndjson_adds_keepalives_and_ends_on_error():
    async def run() -> list[dict]:
        async def states():
            await asyncio.sleep(0.25)  # quiet: keepalive lines meanwhile
            yield state("Running", {1: 0}, running=2)
            raise Missing("batch b was deleted")

        lines = [json.loads(x) async for x in ndjson(state("Running", {}, running=3), states(), keepalive=0.1)]
        return lines

    lines = asyncio.run(run())
    types = [x["type"] for x in lines]
    assert types[0] == "progress" and types.count("progress") >= 2 and types[-2:] == ["task", "error"]
    assert lines[-1]["error"] == {"code": "not_found", "message": "batch b was deleted"}


class Progressing:
    """A backend whose one batch goes Running -> index 1 fails -> Succeeded for 0 and 2 (finished), state by state."""

    def __init__(self) -> None:
        self.created, self.deleted = [], []

    async def create_batch(self, req):
        if req.pool != "p":
            raise Missing(f"no WarmPool or Pool named {req.pool!r}")
        self.created.append(req)
        return state("Pending", {}).model_copy(update={"name": req.name, "bound": 0})

    async def get_batch(self, name):
        return state("Failed", {0: 0, 1: 3, 2: 0}).model_copy(update={"name": name})

    async def list_batches(self, pool=None):
        return [state("Running", {}, running=3)]

    async def delete_batch(self, name):
        self.deleted.append(name)

    async def watch_batch(self, name):
        for s in (state("Running", {}, running=3), state("Running", {1: 3}, running=2),
                  state("Failed", {0: 0, 1: 3, 2: 0})):
            yield s.model_copy(update={"name": name})


def forwarding_client(backend) -> Client:
    from fastapi.testclient import TestClient

    from corral.operator.claimsapi import create_app

    http = TestClient(create_app(backend, "t"))

    def forward(request: httpx.Request) -> httpx.Response:
        r = http.request(request.method, request.url.raw_path.decode(), headers=dict(request.headers),
                         content=request.content)
        return httpx.Response(r.status_code, content=r.content, headers=r.headers)

    return Client("http://api.test", "t", transport=httpx.MockTransport(forward), retry=ops.Retry(attempts=1))


def test_sdk_iterates_results_as_they_end_and_checks_requests_first():
    backend = Progressing()
    with forwarding_client(backend) as c:
        b = c.batch("p", 3, ["sh", "-c", "exit 0"], env={"A": "1"}, timeout=30)
        assert b.name.startswith("b-") and backend.created[0].task.argv == ["sh", "-c", "exit 0"]
        assert backend.created[0].task.env == {"A": "1"} and backend.created[0].task.timeout_seconds == 30
        assert [(r.index, r.exit_code, r.output) for r in b] == [(1, 3, "out 1\n"), (0, 0, "out 0\n"),
                                                                 (2, 0, "out 2\n")]
        assert b.wait().failed == 1
        with pytest.raises(InvalidRequest, match="CORRAL_BATCH_INDEX"):
            c.batch("p", 2, "true", env={"CORRAL_BATCH_INDEX": "7"})
        with pytest.raises(InvalidRequest, match="replicas"):
            c.batch("p", 0, "true")
        with pytest.raises(NotFound, match="no WarmPool or Pool"):
            c.batch("nope", 1, "true")
        assert c.delete_batch(b.name) and backend.deleted == [b.name]


def test_follow_drops_task_lines_seen_before_a_reconnect_and_gives_up_in_time():
    f = ops.BatchFollow(retry=ops.Retry(backoff=0.0))
    line = '{"type":"task","batch":"b","phase":"Running","replicas":2,"bound":2,"running":1,"succeeded":1,' \
           '"failed":0,"task":{"index":0,"phase":"Succeeded","exitCode":0}}'
    assert f.feed(line).task.index == 0 and f.feed(line) is None and f.feed("") is None
    for _ in range(ops.RECONNECTS - 1):
        f.broken("b", None)
    with pytest.raises(Exception, match="following batch b failed"):
        f.broken("b", None)


def test_cli_batch_shows_a_summary_and_exits_1_when_a_task_failed(monkeypatch):
    from typer.testing import CliRunner

    from corral.client import cli

    backend = Progressing()
    monkeypatch.setattr(cli.Ctx, "client", lambda self, **kw: forwarding_client(backend))
    res = CliRunner().invoke(app, ["batch", "p", "-n", "3", "--", "sh", "-c", "exit $CORRAL_BATCH_INDEX"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 1, res.output
    assert backend.created[0].replicas == 3 and backend.created[0].task.argv == ["sh", "-c", "exit $CORRAL_BATCH_INDEX"]
    rows = {int(cells[0]): cells for line in res.output.splitlines() if line.startswith("│")
            and (cells := [c.strip() for c in line.split("│")[1:-1]])[0].isdigit()}
    assert rows[1][2:5] == ["Failed", "3", "-"] and rows[0][2:4] == ["Succeeded", "0"] and rows[2][5] == "out 2"
    assert "2 succeeded, 1 failed of 3" in res.output and "index 1 failed" in res.output
    res = CliRunner().invoke(app, ["batch", "nope", "-n", "1", "--", "true"])
    assert res.exit_code == 1 and "no WarmPool or Pool named 'nope'" in res.output
    res = CliRunner().invoke(app, ["batch", "p", "-n", "2"])
    assert res.exit_code == 2 and "Missing argument" in res.output


def test_tail_lines_for_the_table():
    assert tail_lines("a\n\nb\nc\nd\n", 2) == "c\nd"
    assert tail_lines("x" * 300, 1, width=10) == "…" + "x" * 9
    assert tail_lines(None) == ""
