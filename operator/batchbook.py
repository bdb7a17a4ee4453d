"""What this operator process knows of each SandboxBatch beyond its status: the per-index entries as it last wrote
them or is about to (the followers update them in place; a reconcile writes them, coalesced), the task followers it
runs, which indexes it bound itself, and which batches wait for a pool to appear or to have room.

The status is the durable copy: a restarted operator starts from it (`BatchState.indexes is None` until then) and
re-attaches to each running task by the command id written there.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from .core import metrics
from .core.outputs import OutputStore

Key = tuple[str, str]  # (namespace, batch)
PoolKey = tuple[str, str, str]  # (pool kind, namespace, pool)


@dataclass
class BatchState:
    indexes: list[dict[str, Any]] | None = None  # per-index entries (the status's wire form); None: not loaded yet
    written: dict[str, Any] | None = None  # the status this process last wrote (an unchanged one is not written)
    followers: dict[int, asyncio.Task[None]] = field(default_factory=dict)  # index -> its task's follower
    conditions: list[dict[str, Any]] = field(default_factory=list)
    times: dict[str, str] = field(default_factory=dict)  # startTime / completionTime as written
    logged: str | None = None  # the phase last logged
    # metrics: what this process has counted (a restarted one counts what ended before it started as counted)
    pool: str = ""
    running_counted: set[int] = field(default_factory=set)
    ended_counted: set[int] = field(default_factory=set)
    final_counted: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one status write at a time
    flush_at: float | None = None  # when the status write the followers asked for goes out (None: none asked)
    written_at: float = 0.0  # time.monotonic() of this process's last status write (the next waits MIN_GAP after it)
    reading: set[int] = field(default_factory=set)  # ended indexes whose output tail is being read: not released yet
    # The resourceVersion of the batch that `indexes` are built on: the one they were loaded from, this process's own
    # last status write's, or the one it read after a conflict. Every status write is conditional on it
    # (batches._write): never on the cache's newer version, which may carry another replica's entries not merged in.
    rv: str = ""
    # sandboxes this process adopted or created for an index and no status write has recorded yet: name -> uid (a
    # lost one is deleted by uid, whether or not the cache shows it yet)
    taken: dict[str, str] = field(default_factory=dict)

    def following(self, index: int) -> bool:
        task = self.followers.get(index)
        return task is not None and not task.done()

    def cancel(self, index: int | None = None) -> None:
        for i in [index] if index is not None else list(self.followers):
            task = self.followers.pop(i, None)
            if task is not None:
                task.cancel()


@dataclass
class BatchBook:
    states: dict[Key, BatchState] = field(default_factory=dict)
    waiting: dict[PoolKey, set[str]] = field(default_factory=dict)
    # the tails of ended tasks' outputs, read as each ended (before its sandbox goes): the claims API's results
    outputs: OutputStore = field(default_factory=OutputStore)

    def state(self, ns: str, name: str) -> BatchState:
        return self.states.setdefault((ns, name), BatchState())

    def forget(self, ns: str, name: str) -> None:
        """The batch is gone (or going): stop following its tasks."""
        st = self.states.pop((ns, name), None)
        if st is not None:
            st.cancel()
            metrics.batch_tasks_running(ns, st.pool, -len(st.running_counted))

    def wait_for_pool(self, kind: str, ns: str, pool: str, batch: str) -> None:
        self.waiting.setdefault((kind, ns, pool), set()).add(batch)

    def waiting_on(self, kind: str, ns: str, pool: str) -> set[str]:
        """The batches that waited for this pool (each wakes once; one still short of room registers again)."""
        return self.waiting.pop((kind, ns, pool), set())

    def close(self) -> None:
        for st in self.states.values():
            st.cancel()
