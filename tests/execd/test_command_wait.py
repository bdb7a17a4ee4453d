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
