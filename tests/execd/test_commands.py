"""Commands on a real daemon with real processes: exit codes, order, timeouts, background, env/cwd, binary output."""

from __future__ import annotations

import base64
import json
import os
import time

import httpx
import pytest

pytestmark = pytest.mark.execd


def run(client: httpx.Client, **body) -> dict:
    r = client.post("/v1/command", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def pids_with(marker: str) -> list[int]:
    """Processes whose command line contains `marker` (the process table is the ground truth)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(name))
            except OSError:
                pass
    return found


def wait_started(marker: str, count: int, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while len(pids_with(marker)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(pids_with(marker)) >= count


def wait_gone(marker: str, seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := pids_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    events, name = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[6:])))
    return events


@pytest.mark.parametrize("code", [0, 1, 2, 42, 255])
def test_exit_codes(client, code):
    assert run(client, command=f"exit {code}")["exit_code"] == code


def test_stdout_stderr_and_duration(client):
    out = run(client, command="echo out; echo err >&2")
    assert (out["stdout"], out["stderr"]) == ("out\n", "err\n")
    assert out["duration_ms"] >= 0 and not out["timed_out"]


def test_argv_without_shell(client):
    assert run(client, argv=["printf", "%s|", "a b", "$HOME"])["stdout"] == "a b|$HOME|"


def test_killed_by_signal_reports_it(client):
    out = run(client, command="kill -TERM $$")
    assert out["exit_code"] == 143 and out["signal"] == "SIGTERM"


def test_env_and_cwd(client, ws_dir):
    (ws_dir / "sub").mkdir()
    out = run(client, command='echo "$FOO:$PWD"', env={"FOO": "bar baz"}, cwd=str(ws_dir / "sub"))
    assert out["stdout"] == f"bar baz:{ws_dir / 'sub'}\n"
    assert run(client, command="pwd", cwd="")["stdout"].strip()  # empty cwd -> workspace


def test_token_is_not_leaked_into_commands(client):
    assert "CORRAL_EXECD" not in run(client, command="env")["stdout"]


def test_bad_cwd_and_missing_program_are_errors(client):
    r = client.post("/v1/command", json={"command": "true", "cwd": "/no/such/dir"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_cwd"
    r = client.post("/v1/command", json={"argv": ["/no/such/program"]})
    assert r.status_code == 400 and set(r.json()) == {"code", "message"}
    r = client.post("/v1/command", json={"command": "true", "argv": ["true"]})
    assert r.status_code == 400 and set(r.json()) == {"code", "message"}


def test_non_utf8_output_is_intact(client):
    out = run(client, command=r"printf '\377\376\000abc\200'; printf 'ok' >&2")
    assert out["stdout_encoding"] == "base64"
    assert base64.b64decode(out["stdout"]) == b"\xff\xfe\x00abc\x80"
    assert (out["stderr"], out["stderr_encoding"]) == ("ok", "utf-8")


def test_utf8_multibyte_output_is_text(client):
    out = run(client, command="printf 'h\\303\\251llo \\342\\202\\254'")
    assert (out["stdout"], out["stdout_encoding"]) == ("héllo €", "utf-8")


def test_timeout_kills_the_whole_tree(client):
    marker = f"{int.from_bytes(os.urandom(3), 'big') % 900 + 100}.{os.getpid()}"
    # a child, a grandchild in the background, and one that escapes into its own session
    command = f"sleep {marker}1 & (sleep {marker}2 &) ; setsid sleep {marker}3 & sleep {marker}4"
    out = run(client, command=command, timeout=1.0)
    assert out["timed_out"] and out["exit_code"] == 137 and out["signal"] == "SIGKILL"
    assert wait_gone(marker) == [], "a process of the timed-out command survived"


def test_stream_is_ordered(client):
    command = "for i in $(seq 1 50); do echo out$i; echo err$i >&2; sleep 0.001; done; exit 7"
    with client.stream("POST", "/v1/command/stream", json={"command": command}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[0][0] == "start" and events[-1][0] == "exit"
    assert events[-1][1]["exit_code"] == 7
    chunks = [e for name, e in events if name in ("stdout", "stderr")]
    assert [c["seq"] for c in chunks] == list(range(1, len(chunks) + 1))
    out = "".join(c["data"] for c in chunks if c["stream"] == "stdout")
    err = "".join(c["data"] for c in chunks if c["stream"] == "stderr")
    assert out == "".join(f"out{i}\n" for i in range(1, 51))
    assert err == "".join(f"err{i}\n" for i in range(1, 51))


def test_stream_binary_chunks(client):
    with client.stream("POST", "/v1/command/stream", json={"command": r"printf '\377\000\201'"}) as r:
        events = sse_events(r)
    data = b"".join(
        base64.b64decode(e["data"]) if e["encoding"] == "base64" else e["data"].encode()
        for name, e in events if name == "stdout"
    )
    assert data == b"\xff\x00\x81"


def test_stream_disconnect_kills_the_tree(daemon):
    marker = f"{int.from_bytes(os.urandom(3), 'big') % 900 + 100}.{os.getpid() + 7}"
    with daemon.client() as c:
        with c.stream("POST", "/v1/command/stream", json={"command": f"sleep {marker}1 & sleep {marker}2"}) as r:
            lines = r.iter_lines()  # keep the iterator: closing it early closes the connection
            assert next(lines).startswith("event: start")
            wait_started(marker, 3)  # sh and both sleeps
            time.sleep(0.3)
            assert len(pids_with(marker)) == 3, "the stream must keep the command alive while connected"
    assert wait_gone(marker) == []


def test_run_disconnect_kills_the_tree(daemon):
    marker = f"{int.from_bytes(os.urandom(3), 'big') % 900 + 100}.{os.getpid() + 11}"
    with pytest.raises(httpx.ReadTimeout):
        with daemon.client(timeout=1.5) as c:
            c.post("/v1/command", json={"command": f"sleep {marker}1 & sleep {marker}2"})
    assert wait_gone(marker) == []


def test_background_status_logs_interrupt(client):
    r = client.post(
        "/v1/command",
        json={"command": "trap 'echo got-term; exit 5' TERM; echo started; while :; do sleep 0.05; done",
              "background": True},
    )
    assert r.status_code == 202, r.text
    cid = r.json()["id"]
    assert r.json()["running"]
    deadline = time.monotonic() + 30
    logs = {"chunks": []}
    while time.monotonic() < deadline and not logs["chunks"]:
        logs = client.get(f"/v1/command/{cid}/logs").json()
        time.sleep(0.02)
    assert "".join(c["data"] for c in logs["chunks"]) == "started\n"
    assert client.get(f"/v1/command/{cid}").json()["running"]
    assert cid in [c["id"] for c in client.get("/v1/command").json()["commands"]]
    status = client.delete(f"/v1/command/{cid}").json()
    assert not status["running"] and status["interrupted"]
    later = client.get(f"/v1/command/{cid}/logs", params={"cursor": logs["next_cursor"]}).json()
    assert "got-term" in "".join(c["data"] for c in later["chunks"])
    assert client.get(f"/v1/command/{cid}").json()["exit_code"] == 5


def test_background_interrupt_escalates_to_kill(client):
    r = client.post("/v1/command", json={"command": "trap '' TERM; sleep 600", "background": True})
    cid = r.json()["id"]
    time.sleep(0.2)
    status = client.delete(f"/v1/command/{cid}", params={"signal": "TERM"}).json()
    assert not status["running"] and status["signal"] in ("SIGKILL", "SIGTERM")


def test_background_timeout(client):
    cid = client.post("/v1/command", json={"command": "sleep 600", "background": True, "timeout": 0.5}).json()["id"]
    deadline = time.monotonic() + 30
    while client.get(f"/v1/command/{cid}").json()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    status = client.get(f"/v1/command/{cid}").json()
    assert status["timed_out"] and status["exit_code"] == 137


def test_unknown_command_is_404(client):
    r = client.get("/v1/command/nope")
    assert r.status_code == 404 and r.json()["code"] == "not_found"
    assert client.delete("/v1/command/nope").status_code == 404


def test_set_env_reaches_later_commands(client):
    try:
        assert client.put("/v1/env", json={"env": {"CLAIM": "c1", "BOTH": "injected"}}).status_code == 200
        out = run(client, command='echo "$CLAIM $BOTH"', env={"BOTH": "request"})["stdout"]
        assert out == "c1 request\n"
        client.put("/v1/env", json={"env": {"MORE": "m"}, "merge": True})
        assert client.get("/v1/env").json()["env"] == {"CLAIM": "c1", "BOTH": "injected", "MORE": "m"}
        assert client.put("/v1/env", json={"env": {"A=B": "x"}}).status_code == 400
    finally:
        client.put("/v1/env", json={"env": {}})
    assert run(client, command='echo "${CLAIM:-unset}"')["stdout"] == "unset\n"


def test_run_as_user(client):
    if os.geteuid() != 0:
        pytest.fail("this test needs root (the test bed runs as root)")
    out = run(client, command="id -u; echo $HOME", user="nobody")
    assert out["stdout"].split()[0] == "65534"
    assert client.post("/v1/command", json={"command": "true", "user": "no-such-user"}).status_code == 400
