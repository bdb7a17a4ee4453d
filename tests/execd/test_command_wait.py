"""GET /v1/command/{id}/wait on a real daemon: one SSE connection per command that ends with it, keepalive comments
in between, no effect on the command when it is closed, and the end delivered at once to a caller that comes back."""

from __future__ import annotations

import json
import time

import httpx
import pytest

pytestmark = pytest.mark.execd


def start(client: httpx.Client, **body) -> str:
    r = client.post("/v1/command", json={**body, "background": True})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def read(response: httpx.Response) -> list[tuple[str, object]]:
    """(event name, data) for events and ("comment", text) for comment lines, in order."""
    out: list[tuple[str, object]] = []
    name = None
    for line in response.iter_lines():
        if line.startswith(":"):
            out.append(("comment", line[1:].strip()))
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            out.append((name or "", json.loads(line[6:])))
    return out


def test_wait_streams_status_keepalives_and_the_exit(client):
    cid = start(client, command="sleep 2.2; exit 3")
    t0 = time.monotonic()
    with client.stream("GET", f"/v1/command/{cid}/wait", params={"keepalive": 1}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = read(r)
    elapsed = time.monotonic() - t0
    names = [n for n, _ in events]
    assert names[0] == "status" and names[-1] == "exit"
    assert events[0][1]["running"] is True
    assert names.count("comment") >= 1 and set(names[1:-1]) == {"comment"}
    final = events[-1][1]
    assert final["running"] is False and final["exit_code"] == 3 and final["id"] == cid
    assert 1.5 < elapsed < 10


def test_closing_the_wait_leaves_the_command_running_and_a_new_wait_gets_the_end(client):
    cid = start(client, command="sleep 1; echo done")
    with client.stream("GET", f"/v1/command/{cid}/wait") as r:
        first = next(r.iter_lines())
        assert first == "event: status"
    time.sleep(1.5)  # the command ends while nobody waits
    status = client.get(f"/v1/command/{cid}").json()
    assert status["running"] is False and status["exit_code"] == 0 and not status["interrupted"]
    t0 = time.monotonic()
    with client.stream("GET", f"/v1/command/{cid}/wait") as r:
        events = read(r)
    assert time.monotonic() - t0 < 2
    assert [n for n, _ in events] == ["status", "exit"] and events[-1][1]["exit_code"] == 0
    logs = client.get(f"/v1/command/{cid}/logs").json()
    assert "done" in "".join(c["data"] for c in logs["chunks"])


def test_a_timeout_is_reported_in_the_exit(client):
    cid = start(client, command="sleep 30", timeout=0.5)
    with client.stream("GET", f"/v1/command/{cid}/wait") as r:
        events = read(r)
    assert events[-1][0] == "exit" and events[-1][1]["timed_out"] is True


def test_unknown_command_and_bad_keepalive(client):
    r = client.get("/v1/command/0123456789abcdef/wait")
    assert r.status_code == 404 and set(r.json()) == {"code", "message"}
    cid = start(client, command="true")
    assert client.get(f"/v1/command/{cid}/wait", params={"keepalive": 0}).status_code == 400


def test_a_second_start_with_the_same_key_answers_the_first_command_and_runs_nothing(client, ws_dir):
    """How the operator starts a batch's task: keyed by batch, index and sandbox, so an operator that died between
    its POST and writing the id down asks again and gets the same command (running or ended), not a second run."""
    body = {"command": 'echo run >> keyed.txt; sleep 0.5', "cwd": str(ws_dir), "background": True,
            "key": "batch-uid/3/sandbox-uid"}
    first = client.post("/v1/command", json=body)
    assert first.status_code == 202 and first.json()["key"] == body["key"]
    again = client.post("/v1/command", json=body)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"] and again.json()["running"]
    with client.stream("GET", f"/v1/command/{first.json()['id']}/wait") as r:
        assert read(r)[-1][0] == "exit"
    ended = client.post("/v1/command", json=body)  # ended, still retained: still that command
    assert ended.status_code == 200 and ended.json()["id"] == first.json()["id"] and ended.json()["exit_code"] == 0
    other = client.post("/v1/command", json={**body, "key": "batch-uid/4/sandbox-uid"})
    assert other.status_code == 202 and other.json()["id"] != first.json()["id"]
    unkeyed = client.post("/v1/command", json={"command": "true", "background": True})
    assert unkeyed.status_code == 202 and unkeyed.json()["key"] is None
    with client.stream("GET", f"/v1/command/{other.json()['id']}/wait") as r:
        read(r)
    assert (ws_dir / "keyed.txt").read_text().split() == ["run", "run"]  # keys 3 and 4, once each
    assert client.post("/v1/command", json={**body, "key": ""}).status_code == 400
