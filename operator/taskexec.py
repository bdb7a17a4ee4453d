"""A batch task in a sandbox's execd, as both runtimes drive it: start it as a background command with a key, follow
it to its end over one Server-Sent Events connection, read the tail of its output once it ended.

The Kubernetes reconcilers (reconcile/batchtasks.py) and the Docker runtime (docker/batches.py) differ in where a
sandbox is, how its token is found and where a result is kept; what they say to execd is this module. It speaks HTTP,
so it is not part of the domain core (corral.operator.core knows no client), and it knows neither runtime.

- `start`: POST /v1/command with the core's request and a key (execd answers 200 with the command it already holds
  for that key, so asking again after a restart never runs the task twice); a 4xx other than 401/408/429 is
  StartRefused (the index fails, no retry).
- `wait`: GET /v1/command/{id}/wait: the command's status at once, a keepalive comment every KEEPALIVE seconds, its
  exit. Every line counts as contact (`Contact`): a task that runs for hours on a healthy stream never nears the
  runtimes' EXECD_PATIENCE, and no request is added to notice a silent execd. READ_TIMEOUT without a byte: the
  connection is dead and the caller opens it again.
- `output_tail`: GET /v1/command/{id}/logs read as it streams (core.outputs keeps only the tail), within a timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx

from corral.api.batch import BatchTask

from .core import batches as core
from .core.outputs import LogsTail, NotLogs, Tail

log = logging.getLogger("corral.operator.batch")

COMMAND_PATH = "/v1/command"  # execd: POST starts a command; /{id}/wait follows one, /{id}/logs its output
KEEPALIVE = 15.0  # seconds between execd's keepalive comments on a wait stream
READ_TIMEOUT = 3 * KEEPALIVE  # no byte for this long: the connection is dead, open it again
MAX_BACKOFF = 30.0  # longest pause between two attempts to reach an execd
EXECD_PATIENCE = 120.0  # seconds an index's execd may stay silent (every attempt failing) before the index fails
TAIL_TIMEOUT = 5.0  # seconds for reading an ended task's output tail before its end is recorded without it


class StartRefused(Exception):
    """execd refused the task as written (4xx): the index fails, no retry."""


class Contact:
    """When a follower last heard from its execd (monotonic seconds): an answer to a request, or any line of a wait
    stream, keepalives included."""

    def __init__(self) -> None:
        self.at = time.monotonic()

    def heard(self) -> None:
        self.at = time.monotonic()

    def silent(self) -> float:
        return time.monotonic() - self.at


def task_key(batch_uid: str, index: int, sandbox: str) -> str:
    """execd's key of index `index`'s task in the sandbox `sandbox` (its uid on Kubernetes, its name on Docker):
    another batch or claim that used the same sandbox before (a Pool's Noop recycling keeps its execd and its finished
    commands) never matches it."""
    return f"{batch_uid}/{index}/{sandbox}"


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def start(http: httpx.AsyncClient, url: str, token: str, task: BatchTask, index: int, key: str) -> str:
    """The id of index `index`'s command: started now, or (execd answers 200 for a key it holds) the one a previous
    process started and did not live to write down."""
    r = await http.post(url + COMMAND_PATH, json={**core.task_request(task, index), "key": key}, headers=_auth(token))
    if 400 <= r.status_code < 500 and r.status_code not in (401, 408, 429):
        raise StartRefused(f"execd refused the task ({r.status_code}): {r.text[:300]}")
    r.raise_for_status()
    return str(r.json()["id"])


async def wait(http: httpx.AsyncClient, url: str, token: str, command_id: str,
               contact: Contact) -> dict[str, Any] | None:
    """The command's final status from its wait stream; None if execd does not know the command."""
    async with http.stream("GET", f"{url}{COMMAND_PATH}/{command_id}/wait", params={"keepalive": KEEPALIVE},
                           headers=_auth(token), timeout=httpx.Timeout(10.0, read=READ_TIMEOUT)) as r:
        if r.status_code == 404:
            return None
        r.raise_for_status()
        contact.heard()
        event = ""
        async for line in r.aiter_lines():
            contact.heard()
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "exit":
                final: dict[str, Any] = json.loads(line[6:])
                return final
    raise httpx.ReadError("the wait stream ended without an exit event")


async def output_tail(http: httpx.AsyncClient, url: str, token: str, command_id: str, *,
                      timeout: float = TAIL_TIMEOUT) -> Tail | None:
    """The tail of a command's output (core.outputs: the logs body is read as it streams, only the tail kept); None
    if execd does not answer with it within `timeout` (it restarted, the sandbox is going, ...)."""
    parser = LogsTail()

    async def read() -> Tail | None:
        async with http.stream("GET", f"{url}{COMMAND_PATH}/{command_id}/logs", headers=_auth(token)) as r:
            if r.status_code != 200:
                return None
            async for data in r.aiter_bytes():
                parser.feed(data)
        return parser.result()

    try:
        return await asyncio.wait_for(read(), timeout)
    except (httpx.HTTPError, NotLogs, TimeoutError) as exc:
        log.info("output of command %s at %s: %s", command_id, url, exc or type(exc).__name__)
        return None
