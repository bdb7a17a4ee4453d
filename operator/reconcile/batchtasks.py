"""A SandboxBatch's tasks in execd: start each as a background command, then follow it to its end over one Server-Sent
Events connection per sandbox (execd's GET /v1/command/{id}/wait: its status at once, a keepalive comment every
KEEPALIVE seconds, its exit). No request is made while a task runs; a broken connection is opened again (backing off)
by the same command id, which is also how a restarted operator re-attaches: the id is in the batch's status.

A task is started with a key naming its batch, index and sandbox (execd's `key`): a restarted operator that finds no
id in the status (it died between the start and the status write) asks execd to start it again and gets the command
that already runs, never a second run, and never a command of another batch or claim that used the same sandbox
before (a Pool's Noop recycling keeps the pod and its execd's finished commands).

An execd that does not answer (refused, timed out, 5xx, a wait stream cut) is asked again, backing off; once it has
been silent for EXECD_PATIENCE seconds in a row the index fails (ExecdUnreachable) and the batch goes on. Every line
of a wait stream, keepalive comments included, counts as an answer: a task that runs for hours on a healthy stream
never comes near it, and no request is added to notice it.

When a task has ended, the tail of its output (core.outputs) is read once, before its end goes into the status (the
end releases the sandbox), and kept in memory for the claims API's results.

A follower only updates its index's entry in memory and asks for a reconcile of the batch COALESCE seconds later;
tasks that end together are written to the status in one write.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import httpx

from corral.api.batch import BatchTask

from ..batchbook import BatchState
from ..context import Context
from ..core import batches as b
from ..core import vocabulary as v
from ..core.outputs import LogsTail, NotLogs, Tail
from .handover import ExecdUnreachable, hand_over

log = logging.getLogger("corral.operator.batch")

COMMAND_PATH = "/v1/command"  # execd: POST starts a command; /{id}/wait follows one (execd/commands.py, waits.py)
KEEPALIVE = 15.0  # seconds between execd's keepalive comments on a wait stream
READ_TIMEOUT = 3 * KEEPALIVE  # no byte for this long: the connection is dead, open it again
COALESCE = 0.05  # seconds between a task's end and the status write that carries it (and every other end by then)
MAX_BACKOFF = 30.0
EXECD_PATIENCE = 120.0  # seconds an index's execd may stay silent (every attempt failing) before the index fails
TAIL_TIMEOUT = 5.0  # seconds for reading an ended task's output tail (core.outputs) before its end is written


def mark(ctx: Context, st: BatchState, ns: str, batch: str) -> None:
    """Ask for the batch's status to be written COALESCE seconds from now, with everything that changed meanwhile.
    The write goes out from here, not through the work queue: a pool refilling hundreds of sandboxes keeps the
    queue's workers waiting on the API server, and a task's end must not wait for a free worker."""
    if st.flush_at is not None:
        return
    st.flush_at = time.time() + COALESCE

    def go() -> None:
        from .batches import flush  # batches.py starts the followers: imported late

        task = asyncio.ensure_future(flush(ctx, ns, batch))
        _FLUSHES.add(task)
        task.add_done_callback(_FLUSHES.discard)

    asyncio.get_running_loop().call_later(COALESCE, go)


_FLUSHES: set[asyncio.Task[None]] = set()  # running flushes (the loop keeps only weak references to tasks)


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


def task_key(batch_uid: str, index: int, sandbox_uid: str) -> str:
    """execd's key of index `index`'s task in the sandbox with uid `sandbox_uid` (see the module docstring)."""
    return f"{batch_uid}/{index}/{sandbox_uid}"


async def _start(ctx: Context, url: str, token: str, task: BatchTask, index: int, key: str) -> str:
    """The id of index `index`'s command: started now, or (execd answers 200 for a key it holds) the one a previous
    process started and did not live to write down."""
    headers = {"Authorization": f"Bearer {token}"}
    r = await ctx.http().post(url + COMMAND_PATH, json={**b.task_request(task, index), "key": key}, headers=headers)
    if 400 <= r.status_code < 500 and r.status_code not in (401, 408, 429):
        raise StartRefused(f"execd refused the task ({r.status_code}): {r.text[:300]}")
    r.raise_for_status()
    return str(r.json()["id"])


async def _wait(ctx: Context, url: str, token: str, command_id: str, contact: Contact) -> dict[str, Any] | None:
    """The command's final status from its wait stream; None if execd does not know the command."""
    timeout = httpx.Timeout(10.0, read=READ_TIMEOUT)
    async with ctx.http().stream("GET", f"{url}{COMMAND_PATH}/{command_id}/wait", params={"keepalive": KEEPALIVE},
                                 headers={"Authorization": f"Bearer {token}"}, timeout=timeout) as r:
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


async def output_tail(ctx: Context, url: str, token: str, command_id: str, *,
                      timeout: float = TAIL_TIMEOUT) -> Tail | None:
    """The tail of a command's output (core.outputs: the logs body is read as it streams, only the tail kept); None
    if execd does not answer with it within `timeout` (it restarted, the sandbox is going, ...)."""
    parser = LogsTail()

    async def read() -> Tail | None:
        async with ctx.http().stream("GET", f"{url}{COMMAND_PATH}/{command_id}/logs",
                                     headers={"Authorization": f"Bearer {token}"}) as r:
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


async def follow(ctx: Context, st: BatchState, ns: str, batch: str, batch_uid: str, index: int,
                 task: BatchTask, *, patience: float = EXECD_PATIENCE) -> None:
    """Start (or find) index `index`'s task and follow it to its end; the outcome goes into its entry. The index
    fails (ExecdUnreachable) once its execd has not answered for `patience` seconds in a row."""
    assert st.indexes is not None
    entry = st.indexes[index]
    backoff = 0.5
    contact = Contact()
    while True:
        m = ctx.cache.claim_sandbox(ns, b.claim_label(batch, index))
        pod = ctx.cache.pod(ns, m.name) if m is not None else None
        if m is None or m.deleting or pod is None or not m.endpoint:
            return  # lost or not there yet: the sandbox's watch event brings the batch's reconcile back
        if entry.get("sandbox") not in (None, m.name):
            return  # not the sandbox this index's task ran in: the reconcile fails the index (SandboxLost)
        url = f"http://{m.endpoint}"
        attempt = time.monotonic()
        try:
            token = await hand_over(ctx, ns, m.name, m.uid, pod.uid, url, batch_uid)
            if not entry.get("commandId"):
                entry["commandId"] = await _start(ctx, url, token, task, index, task_key(batch_uid, index, m.uid))
                contact.heard()
                entry["phase"] = b.RUNNING
                mark(ctx, st, ns, batch)
            final = await _wait(ctx, url, token, entry["commandId"], contact)
        except StartRefused as exc:
            _end(entry, v.FAILED, v.R_START_FAILED, str(exc), None)
            break
        except (httpx.HTTPError, ExecdUnreachable, ValueError) as exc:
            silent = contact.silent()
            if silent >= patience:
                _end(entry, v.FAILED, b.R_EXECD_UNREACHABLE,
                     f"execd of sandbox {m.name} did not answer for {silent:.0f} s (last: {exc or type(exc).__name__})",
                     None)
                break
            if contact.at >= attempt:  # it answered during this attempt (a stream that broke): start over
                backoff = 0.5
            pause = min(backoff, patience - silent)  # the last attempt goes out when the patience runs out
            log.info("batch %s/%s index %d: execd of %s: %s; again in %.1fs", ns, batch, index, m.name,
                     exc or type(exc).__name__, pause)
            await asyncio.sleep(pause)
            backoff = min(MAX_BACKOFF, backoff * 2)
            continue
        if final is None:
            _end(entry, v.FAILED, b.R_TASK_LOST, f"execd of sandbox {m.name} no longer knows the task's command "
                 f"{entry['commandId']} (it restarted)", None)
        else:
            # its output's tail before the end is written: the end releases the sandbox (Delete: at once)
            tail = await output_tail(ctx, url, token, entry["commandId"])
            if tail is not None:
                ctx.batches.outputs.put(batch_uid, index, tail)
            outcome = b.task_outcome(final.get("exit_code"), signal=final.get("signal"),
                                     timed_out=bool(final.get("timed_out")), interrupted=bool(final.get("interrupted")))
            _end(entry, outcome.phase, outcome.reason, outcome.message, outcome.exit_code)
        break
    mark(ctx, st, ns, batch)


def _end(entry: dict[str, Any], phase: str, reason: str, message: str, exit_code: int | None) -> None:
    entry.update(phase=phase, reason=reason, message=message)
    if exit_code is not None:
        entry["exitCode"] = exit_code
