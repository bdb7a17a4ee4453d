"""PTY over WebSocket: an interactive bash driven like a person would (type, read, resize, Ctrl-C, reattach)."""

from __future__ import annotations

import json
import time

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

pytestmark = pytest.mark.execd
PROMPT = "PTY-PROMPT$ "
WAIT = 30.0  # generous for a loaded machine; every wait is bounded


class Term:
    def __init__(self, daemon, sid: str, **query: str) -> None:
        qs = "&".join(f"{k}={v}" for k, v in query.items())
        self.ws: ClientConnection = connect(
            f"ws://127.0.0.1:{daemon.port}/v1/pty/{sid}/ws" + (f"?{qs}" if qs else ""),
            additional_headers=daemon.headers, open_timeout=WAIT,
        ).__enter__()  # closed by close()
        self.out = b""
        self.replay = b""
        self.control: list[dict] = []

    def type(self, text: str | bytes) -> None:
        self.ws.send(b"\x00" + (text.encode() if isinstance(text, str) else text))

    def send_json(self, **msg) -> None:
        self.ws.send(json.dumps(msg))

    def pump(self, timeout: float) -> None:
        frame = self.ws.recv(timeout=timeout)
        if isinstance(frame, bytes):
            if frame[:1] == b"\x03":
                self.replay += frame[1:]
            self.out += frame[1:]  # replay and live output, in order
        else:
            self.control.append(json.loads(frame))

    def wait_for(self, text: str, after: int = 0) -> int:
        """Read until `text` shows in the output after position `after`; returns the position after it."""
        deadline = time.monotonic() + WAIT
        while (pos := self.out.find(text.encode(), after)) < 0:
            left = deadline - time.monotonic()
            assert left > 0, f"{text!r} not seen; output so far: {self.out[-500:]!r}"
            try:
                self.pump(left)
            except TimeoutError:
                pass
        return pos + len(text)

    def wait_control(self, kind: str) -> dict:
        deadline = time.monotonic() + WAIT
        while not any(c["type"] == kind for c in self.control):
            left = deadline - time.monotonic()
            assert left > 0, f"no {kind} frame; got {self.control}"
            self.pump(left)
        return next(c for c in self.control if c["type"] == kind)

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def shell(client):
    r = client.post(
        "/v1/pty",
        json={"argv": ["/bin/bash", "--norc", "--noprofile", "-i"], "env": {"PS1": PROMPT}, "cols": 80, "rows": 24},
    )
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    yield sid
    client.delete(f"/v1/pty/{sid}")


def test_interactive_shell(daemon, client, shell):
    term = Term(daemon, shell)
    try:
        assert term.wait_control("attached")["offset"] == 0
        pos = term.wait_for(PROMPT)
        term.type("echo hello-$((6*7))\n")
        pos = term.wait_for("hello-42\r\n", pos)
        pos = term.wait_for(PROMPT, pos)

        term.send_json(type="resize", rows=40, cols=100)
        term.type("stty size\n")
        pos = term.wait_for("40 100", pos)
        pos = term.wait_for(PROMPT, pos)

        term.type("sleep 300; echo after-sleep-$?\n")
        time.sleep(0.5)
        term.type(b"\x03")  # Ctrl-C, through the line discipline, to the foreground group
        pos = term.wait_for(PROMPT, pos)
        term.type("echo status-$?\n")
        pos = term.wait_for("status-130", pos)

        term.type("sleep 301\n")
        time.sleep(0.5)
        term.send_json(type="signal", signal="INT")
        pos = term.wait_for(PROMPT, pos)

        term.send_json(type="ping")
        term.wait_control("pong")
        term.send_json(type="bogus")
        term.wait_control("error")
        assert client.get(f"/v1/pty/{shell}").json()["attached"] is True
    finally:
        term.close()


def test_reattach_replays_output(daemon, client, shell):
    term = Term(daemon, shell)
    term.type("echo first-$((1+1))\n")
    term.wait_for("first-2")
    term.close()
    deadline = time.monotonic() + WAIT
    while client.get(f"/v1/pty/{shell}").json()["attached"] and time.monotonic() < deadline:
        time.sleep(0.02)
    offset = client.get(f"/v1/pty/{shell}").json()["output_offset"]

    again = Term(daemon, shell)  # no `since`: everything buffered
    try:
        again.wait_control("attached")
        deadline = time.monotonic() + WAIT
        while b"first-2" not in again.replay and time.monotonic() < deadline:
            again.pump(WAIT)
        assert b"first-2" in again.replay
        again.type("echo second-$((2+1))\n")
        again.wait_for("second-3")
    finally:
        again.close()

    since = Term(daemon, shell, since=str(offset))  # only what came after `offset`
    try:
        assert since.wait_control("attached")["offset"] == offset
        deadline = time.monotonic() + WAIT
        while b"second-3" not in since.replay and time.monotonic() < deadline:
            since.pump(WAIT)
        assert b"second-3" in since.replay and b"first-2" not in since.replay
    finally:
        since.close()


def test_one_writer_at_a_time(daemon, shell):
    first = Term(daemon, shell)
    try:
        first.wait_control("attached")
        with pytest.raises(InvalidStatus) as err:
            Term(daemon, shell)
        assert err.value.response.status_code == 409
        second = Term(daemon, shell, takeover="1")
        with pytest.raises(ConnectionClosed) as closed:
            for _ in range(1000):
                first.pump(WAIT)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4001
        second.type("echo taken-over\n")
        second.wait_for("taken-over")
        second.close()
    finally:
        first.close()


def test_exit_code_and_command(daemon, client):
    sid = client.post("/v1/pty", json={"command": "printf 'hi from pty\\n'; exit 3"}).json()["id"]
    term = Term(daemon, sid)
    try:
        assert term.wait_control("exit")["exit_code"] == 3
        assert b"hi from pty" in term.replay + term.out
    finally:
        term.close()
    status = client.get(f"/v1/pty/{sid}").json()
    assert status["exit_code"] == 3 and not status["running"]
    assert client.delete(f"/v1/pty/{sid}").status_code == 204
    assert client.get(f"/v1/pty/{sid}").status_code == 404


def test_unknown_session(daemon, client):
    with pytest.raises(InvalidStatus) as err:
        Term(daemon, "nope")
    assert err.value.response.status_code == 404
    assert client.get("/v1/pty/nope").status_code == 404
