"""execd survives its own death and keeps its token to itself: a supervisor process starts the server again after a
`kill -9` (as a command running `kill -9 $PPID` or an OOM kill would), the token is in no environment any process of
the sandbox's uid can read, neither execd's memory, and PUT /v1/token rotates it for good (a restart keeps the new
one)."""

from __future__ import annotations

import os
import secrets
import time

import httpx
import pytest
from execdutil import TOKEN, launch, stop

pytestmark = pytest.mark.execd
BACK = 15.0  # deadline for the server to answer again (the supervisor's first backoff is 0.25 s; imports ~1 s)


@pytest.fixture
def daemon(tmp_path):
    d = launch(tmp_path, token_file=True)
    yield d
    stop(d)


def run(c: httpx.Client, command: str) -> dict:
    r = c.post("/v1/command", json={"command": command})
    assert r.status_code == 200, r.text
    return r.json()


def server_pid(c: httpx.Client) -> int:
    return int(run(c, "echo $PPID")["stdout"])


def answers(d, token: str, deadline: float = BACK) -> bool:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            r = httpx.get(f"{d.url}/v1/env", headers={"Authorization": f"Bearer {token}"}, timeout=2.0)
            if r.status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


def test_killed_by_a_command_it_answers_again(daemon):
    with daemon.client(timeout=10.0) as c:
        before = server_pid(c)
        with pytest.raises(httpx.HTTPError):  # the server dies mid-request
            c.post("/v1/command", json={"command": "kill -9 $PPID; sleep 5"})
        assert answers(daemon, TOKEN), "execd did not come back after kill -9"
        after = server_pid(c)
        assert after != before
        os.kill(after, 9)  # and again, from outside (an OOM kill)
        assert answers(daemon, TOKEN)
        assert run(c, "echo ok")["stdout"] == "ok\n"
    assert daemon.proc.poll() is None  # the supervisor itself lives on


def test_stop_ends_supervisor_and_server(tmp_path):
    d = launch(tmp_path)
    with d.client(timeout=10.0) as c:
        pid = server_pid(c)
    stop(d)
    assert d.proc.returncode == 0
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


@pytest.mark.parametrize("via_file", [True, False], ids=["token-file", "token-env"])
def test_token_in_no_readable_environ_or_memory(tmp_path, via_file):
    """As in a sandbox, execd and its commands run as one uid without capabilities. From a
    command (the sandbox's code): no /proc/<pid>/environ or cmdline it can read holds the token, and execd's own
    environ, memory and fds (supervisor and server) cannot be opened at all. Delivered in a file, the file is gone
    and the token was never in execd's environment (read here as root)."""
    d = launch(tmp_path, token_file=via_file, unprivileged=True)
    try:
        assert not (tmp_path / "token").exists()
        with d.client(timeout=30.0) as c:
            server = server_pid(c)
            half = len(TOKEN) // 2  # the scanning shell's own command line must not hold the token
            scan = (f"t={TOKEN[:half]}; t=${{t}}{TOKEN[half:]}; "
                    f'for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do grep -l -a -F "$t" $f 2>/dev/null; done; '
                    f"for p in {server} {d.proc.pid}; do for f in environ mem; do "
                    f"(exec 3</proc/$p/$f) 2>/dev/null && echo READABLE $p $f; done; "
                    f"for x in /proc/$p/fd/*; do (exec 3<$x) 2>/dev/null && echo READABLE $x; done; done; true")
            out = run(c, scan)
            assert run(c, "grep CapEff /proc/self/status")["stdout"].split()[1] == "0000000000000000"
            assert out["stdout"] == "", out
        if via_file:
            for pid in (server, d.proc.pid):
                with open(f"/proc/{pid}/environ", "rb") as f:
                    assert TOKEN.encode() not in f.read()
    finally:
        stop(d)


def test_rotated_token_replaces_the_old_one_and_survives_a_restart(daemon):
    new = secrets.token_hex(32)
    with httpx.Client(base_url=daemon.url, timeout=10.0) as c:
        wrong = c.put("/v1/token", json={"token": new}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert c.put("/v1/token", json={"token": "short"}, headers=daemon.headers).status_code == 400
        r = c.put("/v1/token", json={"token": new}, headers=daemon.headers)
        assert r.status_code == 200, r.text
        assert c.get("/v1/env", headers=daemon.headers).status_code == 401
        fresh = {"Authorization": f"Bearer {new}"}
        pid = int(c.post("/v1/command", json={"command": "echo $PPID"}, headers=fresh).json()["stdout"])
        os.kill(pid, 9)
        assert answers(daemon, new)
        assert c.get("/v1/env", headers=daemon.headers).status_code == 401
