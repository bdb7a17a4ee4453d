"""A SandboxBatch's tasks in execd: start each as a background command, then follow it to its end over one Server-Sent
Events connection per sandbox (execd's GET /v1/command/{id}/wait: its status at once, a keepalive comment every
KEEPALIVE seconds, its exit). No request is made while a task runs; a broken connection is opened again (backing off)
by the same command id, which is also how a restarted operator re-attaches: the id is in the batch's status.

What is said to execd (the keyed start, the wait stream, the output tail) is operator/taskexec.py, shared with the
Docker runtime. A task is started with a key naming its batch, index and sandbox (execd's `key`): a restarted
operator that finds no id in the status (it died between the start and the status write) asks execd to start it
again and gets the command that already runs, never a second run, and never a command of another batch or claim that
used the same sandbox before (a Pool's Noop recycling keeps the pod and its execd's finished commands).

An execd that does not answer (refused, timed out, 5xx, a wait stream cut) is asked again, backing off; once it has
been silent for EXECD_PATIENCE seconds in a row the index fails (ExecdUnreachable) and the batch goes on. Every line
of a wait stream, keepalive comments included, counts as an answer: a task that runs for hours on a healthy stream
never comes near it, and no request is added to notice it.

When a task has ended, its end goes into the status at once and the tail of its output (core.outputs) is read
meanwhile, once, and kept in memory for the claims API's results; the sandbox is released only after that read
(BatchState.reading), so the output is still there to read.

A follower only updates its index's entry in memory and asks for the batch's status write COALESCE seconds later,
and no sooner than MIN_GAP after the previous one: tasks that start or end together are one write, and a batch whose
tasks end one after another costs the API server at most one write per MIN_GAP, however busy the machine is. While
such a write is pending the queue's reconciles leave the status to it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx

from corral.api.batch import BatchTask

from .. import taskexec
from ..batchbook import BatchState
from ..context import Context
from ..core import batches as b
from ..core import vocabulary as v
from ..core.outputs import Tail
from ..taskexec import EXECD_PATIENCE, MAX_BACKOFF, TAIL_TIMEOUT, Contact, StartRefused, start, task_key, wait
from .handover import ExecdUnreachable, hand_over

log = logging.getLogger("corral.operator.batch")

COALESCE = 0.05  # seconds between a task's end and the status write that carries it (and every other end by then)
MIN_GAP = 0.2  # seconds at least between two status writes of one batch asked for by its followers


def mark(ctx: Context, st: BatchState, ns: str, batch: str) -> None:
    """Ask for the batch's status to be written COALESCE seconds from now (MIN_GAP after the last write at the
    soonest), with everything that changed meanwhile. The write goes out from here, not through the work queue: a
    pool refilling hundreds of sandboxes keeps the queue's workers waiting on the API server, and a task's end must
    not wait for a free worker."""
    if st.flush_at is not None:
        return
    now = time.monotonic()
    delay = max(COALESCE, st.written_at + MIN_GAP - now)
    st.flush_at = now + delay

    def go() -> None:
        from .batches import flush  # batches.py starts the followers: imported late

        task = asyncio.ensure_future(flush(ctx, ns, batch))
        _FLUSHES.add(task)
        task.add_done_callback(_FLUSHES.discard)

    asyncio.get_running_loop().call_later(delay, go)


_FLUSHES: set[asyncio.Task[None]] = set()  # running flushes (the loop keeps only weak references to tasks)


async def output_tail(ctx: Context, url: str, token: str, command_id: str, *,
                      timeout: float = TAIL_TIMEOUT) -> Tail | None:
    """The tail of a command's output through the operator's pooled client (taskexec.output_tail)."""
    return await taskexec.output_tail(ctx.http(), url, token, command_id, timeout=timeout)


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
                entry["commandId"] = await start(ctx.http(), url, token, task, index,
                                                task_key(batch_uid, index, m.uid))
                contact.heard()
                entry["phase"] = b.RUNNING
                mark(ctx, st, ns, batch)
            final = await wait(ctx.http(), url, token, entry["commandId"], contact)
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
            outcome = b.task_outcome(final.get("exit_code"), signal=final.get("signal"),
                                     timed_out=bool(final.get("timed_out")), interrupted=bool(final.get("interrupted")))
            _end(entry, outcome.phase, outcome.reason, outcome.message, outcome.exit_code)
            # The end goes into the status now; the output's tail is read meanwhile, and the sandbox is released
            # (shutdownPolicy) only once it is read: `reading` holds the release back (batches._check_indexes). A
            # reader of the results before then reads the tail from the sandbox itself (the claims API does).
            st.reading.add(index)
            mark(ctx, st, ns, batch)
            try:
                tail = await output_tail(ctx, url, token, entry["commandId"])
                if tail is not None:
                    ctx.batches.outputs.put(batch_uid, index, tail)
            finally:
                st.reading.discard(index)
            ctx.request("SandboxBatch", ns, batch)  # the release that waited for it
        break
    mark(ctx, st, ns, batch)


def _end(entry: dict[str, Any], phase: str, reason: str, message: str, exit_code: int | None) -> None:
    entry.update(phase=phase, reason=reason, message=message)
    if exit_code is not None:
        entry["exitCode"] = exit_code
