"""Background output is bounded in total, not only per command: the oldest finished commands' output is dropped
first, then a running command's oldest chunks, and the logs answer says what was dropped."""

from __future__ import annotations

import time

import pytest
from execdutil import launch, stop

pytestmark = pytest.mark.execd
KIB = 1024
PER_COMMAND = 64 * KIB
TOTAL = 96 * KIB
WAIT = 60.0  # deadline for a background command to get where the test needs it (not a timing assertion)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    d = launch(tmp_path_factory.mktemp("execd-small"), log_buffer_bytes=PER_COMMAND, retained_output_bytes=TOTAL)
    yield d
    stop(d)


def write(n: int, then: str = "") -> str:
    return f"head -c {n} /dev/zero | tr '\\0' x{'; ' + then if then else ''}"


def start(c, command: str) -> str:
    r = c.post("/v1/command", json={"command": command, "background": True})
    assert r.status_code == 202, r.text
    return r.json()["id"]


def logs(c, cid: str) -> dict:
    r = c.get(f"/v1/command/{cid}/logs")
    assert r.status_code == 200, r.text
    return r.json()


def kept(body: dict) -> int:
    return sum(len(ch["data"]) for ch in body["chunks"])


def wait_until(predicate, what: str):
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if (value := predicate()):
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def test_oldest_finished_output_goes_first(small):
    """Five finished commands of 48 KiB each under a 96 KiB total: the two newest keep everything, the three oldest
    lost all their output and say so."""
    with small.client() as c:
        ids = []
        for _ in range(5):
            ids.append(start(c, write(48 * KIB)))
            wait_until(lambda: not c.get(f"/v1/command/{ids[-1]}").json()["running"], "the command to finish")
        answers = [logs(c, cid) for cid in ids]
    assert sum(kept(a) for a in answers) <= TOTAL
    for old in answers[:3]:
        assert (old["truncated"], kept(old), old["dropped_bytes"]) == (True, 0, 48 * KIB), old
        assert old["dropped"] > 0
    for new in answers[3:]:
        assert (new["truncated"], kept(new), new["dropped_bytes"], new["dropped"]) == (False, 48 * KIB, 0, 0)
        assert "".join(ch["data"] for ch in new["chunks"]) == "x" * (48 * KIB)


def test_finished_output_goes_before_a_running_commands(small):
    """A finished command holds 48 KiB; a running one then writes 80 KiB (64 KiB kept: its own bound). Over the
    total, the finished command's output is dropped, the running command keeps its newest output."""
    with small.client() as c:
        done = start(c, write(48 * KIB))
        wait_until(lambda: not c.get(f"/v1/command/{done}").json()["running"], "the first command to finish")
        live = start(c, write(80 * KIB, "sleep 60"))
        try:
            body = wait_until(lambda: (b := logs(c, live)) and kept(b) + b["dropped_bytes"] == 80 * KIB and b,
                              "the running command's output")
            assert body["running"] and body["truncated"] and kept(body) <= PER_COMMAND
            first = logs(c, done)
            assert (first["truncated"], kept(first), first["dropped_bytes"]) == (True, 0, 48 * KIB)
            assert kept(body) + kept(first) <= TOTAL
        finally:
            c.delete(f"/v1/command/{live}", params={"signal": "KILL"})
