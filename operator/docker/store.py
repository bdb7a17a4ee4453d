"""Claim and sandbox state in SQLite (WAL): the part of the truth Docker labels cannot hold (they are immutable).

`sandboxes`: one row per sandbox container this operator made or is making (a row is written *before* the
container is created, so a crash leaves a row to clean up, never an unknown container). `claims`: one row per claim.
`sandboxes.claim` is UNIQUE and a sandbox has one `claim` column, so a sandbox can never serve two claims and a
claim never holds two sandboxes. Warm adoption is one IMMEDIATE transaction (see `adopt`).

`batches` and `batch_tasks`: a batch and one row per index (its sandbox, its task's execd command id, how it ended
and the tail of its output). A batch index holds its sandbox like a claim, through `sandboxes.claim` = the claim
label `<batch>_<index>` (core.batches; never a claim's name), so the pool rules count it as taken. A whole batch is
bound in one transaction (`bind_batch`); an index's end is recorded with its sandbox's release in one (`end_task`).

One connection, one lock: every method is a short transaction; callers run them from worker threads.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from corral.operator.core import batches as batchrules
from corral.operator.core.vocabulary import ApiLaunchType, ApiPhase, PoolKind
from corral.operator.planning import Member

SCHEMA = """
CREATE TABLE IF NOT EXISTS sandboxes (
  name TEXT PRIMARY KEY,
  container_id TEXT,
  pool TEXT,
  pool_kind TEXT,
  template TEXT NOT NULL,
  hash TEXT,
  image TEXT,
  state TEXT NOT NULL,          -- creating | ready | releasing | recycling | deleting | retained
  claim TEXT UNIQUE,
  created REAL NOT NULL,
  ip TEXT,
  host_port INTEGER,
  launch_type TEXT,             -- warm | cold (set when claimed)
  retained_from TEXT,           -- state retained: the claim it was retained from,
  retained_pool TEXT,           --   that claim's pool (the sandbox left it),
  retained_at REAL              --   and when
);
CREATE INDEX IF NOT EXISTS sandboxes_pool ON sandboxes(pool, state);
CREATE TABLE IF NOT EXISTS claims (
  name TEXT PRIMARY KEY,
  pool TEXT NOT NULL,
  pool_kind TEXT NOT NULL,
  sandbox TEXT,
  phase TEXT NOT NULL,          -- Pending | Ready | Paused | Expired | Failed
  launch_type TEXT,
  created REAL NOT NULL,
  ready_at REAL,
  expires_at REAL,
  shutdown_policy TEXT NOT NULL DEFAULT 'Delete',
  env TEXT NOT NULL DEFAULT '{}',
  snapshot TEXT,
  message TEXT
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
  name TEXT PRIMARY KEY,
  uid TEXT NOT NULL,            -- random per batch: its execd command keys derive from it
  pool TEXT NOT NULL,
  pool_kind TEXT NOT NULL,
  replicas INTEGER NOT NULL,
  task TEXT NOT NULL,           -- the corral.api BatchTask (JSON, camelCase)
  shutdown_policy TEXT NOT NULL DEFAULT 'Delete',
  ttl_after_finished INTEGER,
  created REAL NOT NULL,
  started_at REAL,              -- when its first index was bound
  finished_at REAL,             -- when it reached its final phase
  phase TEXT,                   -- its final phase once reached (until then, counted from its tasks)
  message TEXT                  -- why indexes wait (the pool is at poolMax, or not in the pools file)
);
CREATE TABLE IF NOT EXISTS batch_tasks (
  batch TEXT NOT NULL,
  idx INTEGER NOT NULL,
  phase TEXT NOT NULL,          -- Pending | Bound | Running | Succeeded | Failed (core.batches)
  sandbox TEXT,                 -- the sandbox it has (or had, once its task ended)
  launch_type TEXT,             -- warm | cold
  command_id TEXT,              -- execd's id of its background command: how a restarted operator re-attaches
  exit_code INTEGER,
  reason TEXT,
  message TEXT,
  output TEXT,                  -- the tail of its output, read once when it ended
  output_truncated INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (batch, idx)
);
"""
# Columns added after the first schema: (table, column, type). A store written by an older operator gets them at open.
ADDED_COLUMNS = (("sandboxes", "retained_from", "TEXT"), ("sandboxes", "retained_pool", "TEXT"),
                 ("sandboxes", "retained_at", "REAL"))


@dataclass
class SandboxRow:
    name: str
    template: str
    state: str
    created: float
    container_id: str | None = None
    pool: str | None = None
    pool_kind: str | None = None
    hash: str | None = None
    image: str | None = None
    claim: str | None = None
    ip: str | None = None
    host_port: int | None = None
    launch_type: str | None = None
    retained_from: str | None = None
    retained_pool: str | None = None
    retained_at: float | None = None

    def member(self) -> Member:
        return Member(name=self.name, namespace="docker", uid=self.container_id or "", template=self.template,
                      pool=self.pool, pool_kind=self.pool_kind, claim=self.claim, blueprint_hash=self.hash,
                      ready=self.state == "ready", created=self.created, deleting=self.state == "deleting")


@dataclass
class ClaimRow:
    name: str
    pool: str
    pool_kind: PoolKind
    phase: ApiPhase
    created: float
    sandbox: str | None = None
    launch_type: ApiLaunchType | None = None
    ready_at: float | None = None
    expires_at: float | None = None
    shutdown_policy: Literal["Delete", "Retain"] = "Delete"
    env: dict[str, str] = field(default_factory=dict)
    snapshot: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class IndexHolder:
    """An index of a batch as the holder of its sandbox (tokens.Holder): its claim label, its batch's creation."""

    name: str
    created: float


@dataclass
class BatchRow:
    name: str
    uid: str
    pool: str
    pool_kind: PoolKind
    replicas: int
    task: str
    created: float
    shutdown_policy: Literal["Delete", "Retain"] = "Delete"
    ttl_after_finished: int | None = None
    started_at: float | None = None
    finished_at: float | None = None
    phase: str | None = None
    message: str | None = None

    def holder(self, index: int) -> IndexHolder:
        return IndexHolder(batchrules.claim_label(self.name, index), self.created)


@dataclass
class TaskRow:
    batch: str
    idx: int
    phase: str
    sandbox: str | None = None
    launch_type: str | None = None
    command_id: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    output: str | None = None
    output_truncated: bool = False


class Store:
    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            for table, column, kind in ADDED_COLUMNS:
                have = {r["name"] for r in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction (the write lock is taken at BEGIN, so read-then-write cannot race)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # --- meta -------------------------------------------------------------------------------------------------------
    def meta(self, key: str, default: Callable[[], str]) -> str:
        """A persistent value, created by `default()` the first time."""
        with self.tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
            if row:
                return row["value"]
            value = default()
            db.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (key, value))
            return value

    # --- sandboxes --------------------------------------------------------------------------------------------------
    @staticmethod
    def _sandbox(row: sqlite3.Row | None) -> SandboxRow | None:
        return SandboxRow(**dict(row)) if row else None

    def add_sandbox(self, row: SandboxRow) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO sandboxes(name, container_id, pool, pool_kind, template, hash, image, state, claim, "
                "created, ip, host_port, launch_type) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (row.name, row.container_id, row.pool, row.pool_kind, row.template, row.hash, row.image, row.state,
                 row.claim, row.created, row.ip, row.host_port, row.launch_type),
            )

    def update_sandbox(self, name: str, **values: Any) -> None:
        cols = ", ".join(f"{k}=?" for k in values)
        with self.tx() as db:
            db.execute(f"UPDATE sandboxes SET {cols} WHERE name=?", (*values.values(), name))

    def retire_idle(self, name: str) -> bool:
        """An idle, ready sandbox goes to `deleting` in one conditional write, so no claim can adopt it from then on;
        False if it is not idle and ready any more (a claim took it first)."""
        with self.tx() as db:
            return db.execute("UPDATE sandboxes SET state='deleting' WHERE name=? AND state='ready' AND claim IS NULL",
                              (name,)).rowcount == 1

    def remove_sandbox(self, name: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM sandboxes WHERE name=?", (name,))

    def sandbox(self, name: str) -> SandboxRow | None:
        with self._lock:
            return self._sandbox(self._db.execute("SELECT * FROM sandboxes WHERE name=?", (name,)).fetchone())

    def sandboxes(self, *, pool: str | None = None, states: Sequence[str] | None = None) -> list[SandboxRow]:
        q, args = "SELECT * FROM sandboxes WHERE 1=1", []
        if pool is not None:
            q += " AND pool=?"
            args.append(pool)
        if states:
            q += f" AND state IN ({','.join('?' * len(states))})"
            args.extend(states)
        with self._lock:
            return [SandboxRow(**dict(r)) for r in self._db.execute(q + " ORDER BY created", args)]

    # --- claims -----------------------------------------------------------------------------------------------------
    @staticmethod
    def _claim(row: sqlite3.Row | None) -> ClaimRow | None:
        if not row:
            return None
        d = dict(row)
        d["env"] = json.loads(d["env"] or "{}")
        return ClaimRow(**d)

    def claim(self, name: str) -> ClaimRow | None:
        with self._lock:
            return self._claim(self._db.execute("SELECT * FROM claims WHERE name=?", (name,)).fetchone())

    def claims(self, *, pool: str | None = None, phases: Sequence[str] | None = None) -> list[ClaimRow]:
        q, args = "SELECT * FROM claims WHERE 1=1", []
        if pool is not None:
            q += " AND pool=?"
            args.append(pool)
        if phases:
            q += f" AND phase IN ({','.join('?' * len(phases))})"
            args.extend(phases)
        with self._lock:
            return [self._claim(r) for r in self._db.execute(q + " ORDER BY created, name", args)]  # type: ignore[misc]

    def update_claim(self, name: str, **values: Any) -> None:
        if "env" in values:
            values["env"] = json.dumps(values["env"])
        cols = ", ".join(f"{k}=?" for k in values)
        with self.tx() as db:
            db.execute(f"UPDATE claims SET {cols} WHERE name=?", (*values.values(), name))

    def remove_claim(self, name: str) -> None:
        with self.tx() as db:
            db.execute("DELETE FROM claims WHERE name=?", (name,))
            db.execute("UPDATE sandboxes SET claim=NULL WHERE claim=?", (name,))

    def adopt(self, claim: ClaimRow, order: Callable[[list[Member]], list[Member]],
              cold: Callable[[], SandboxRow] | None, cold_limit: int | None = None,
              ) -> tuple[ClaimRow, SandboxRow | None, bool]:
        """Record a new claim and bind it to a sandbox, in one transaction.

        Warm: the first ready, idle member of the pool in `order(candidates)` is bound (UPDATE ... WHERE claim IS
        NULL, inside the write lock, so it can be nobody else's). Cold: when no candidate is left, `cold()` gives a
        new `creating` sandbox row that is inserted already bound to the claim, unless the pool already has
        `cold_limit` sandboxes (a Pool's poolMax, counted in the same transaction). Returns (claim, sandbox, created):
        `created` is False when a claim of that name already existed (an idempotent retry), which is returned as is.
        """
        with self.tx() as db:
            existing = self._claim(db.execute("SELECT * FROM claims WHERE name=?", (claim.name,)).fetchone())
            if existing:
                sbx = self._sandbox(db.execute("SELECT * FROM sandboxes WHERE name=?",
                                               (existing.sandbox,)).fetchone()) if existing.sandbox else None
                return existing, sbx, False
            rows = [SandboxRow(**dict(r)) for r in db.execute(
                "SELECT * FROM sandboxes WHERE pool=? AND state='ready' AND claim IS NULL", (claim.pool,))]
            chosen: SandboxRow | None = None
            if claim.snapshot is None:
                by_name = {r.name: r for r in rows}
                for m in order([r.member() for r in rows]):
                    cur = db.execute("UPDATE sandboxes SET claim=?, launch_type='warm' WHERE name=? AND claim IS NULL",
                                     (claim.name, m.name))
                    if cur.rowcount == 1:
                        chosen = by_name[m.name]
                        chosen.claim, chosen.launch_type = claim.name, "warm"
                        claim.launch_type = "warm"
                        break
            if chosen is None and cold is not None and cold_limit is not None:
                total = db.execute("SELECT count(*) FROM sandboxes WHERE pool=?", (claim.pool,)).fetchone()[0]
                if total >= cold_limit:
                    cold = None
            if chosen is None and cold is not None:
                chosen = cold()
                chosen.claim, chosen.launch_type = claim.name, "cold"
                claim.launch_type = "cold"
                db.execute(
                    "INSERT INTO sandboxes(name, container_id, pool, pool_kind, template, hash, image, state, claim, "
                    "created, launch_type) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (chosen.name, None, chosen.pool, chosen.pool_kind, chosen.template, chosen.hash, chosen.image,
                     "creating", chosen.claim, chosen.created, "cold"),
                )
            claim.sandbox = chosen.name if chosen else None
            db.execute(
                "INSERT INTO claims(name, pool, pool_kind, sandbox, phase, launch_type, created, ready_at, expires_at, "
                "shutdown_policy, env, snapshot, message) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (claim.name, claim.pool, claim.pool_kind, claim.sandbox, claim.phase, claim.launch_type, claim.created,
                 claim.ready_at, claim.expires_at, claim.shutdown_policy, json.dumps(claim.env), claim.snapshot,
                 claim.message),
            )
            return claim, chosen, True

    def end_claim(self, name: str, *, expired: bool, message: str | None = None) -> str | None:
        """End a claim in one transaction: the claim row is deleted (or kept as Expired) and its sandbox leaves it
        in state `releasing` (never `ready` with no claim, which another claim could adopt before the release).
        A sandbox still `creating` (a cold start in flight) stays so; the start releases it. Returns the sandbox."""
        with self.tx() as db:
            row = db.execute("SELECT sandbox FROM claims WHERE name=?", (name,)).fetchone()
            if row is None:
                return None
            if expired:
                db.execute("UPDATE claims SET phase='Expired', sandbox=NULL, message=? WHERE name=?", (message, name))
            else:
                db.execute("DELETE FROM claims WHERE name=?", (name,))
            db.execute("UPDATE sandboxes SET claim=NULL, state=CASE WHEN state='creating' THEN 'creating' "
                       "ELSE 'releasing' END WHERE claim=?", (name,))
            return row["sandbox"]

    def finish_cold(self, claim: str, sandbox: str, ready_at: float) -> bool:
        """A cold start finished: the claim becomes Ready if it still waits for this sandbox; otherwise the sandbox
        goes to `releasing`. One transaction, so the sandbox is never idle-and-ready in between."""
        with self.tx() as db:
            row = db.execute("SELECT phase, sandbox FROM claims WHERE name=?", (claim,)).fetchone()
            if row and row["phase"] == "Pending" and row["sandbox"] == sandbox:
                db.execute("UPDATE sandboxes SET state='ready' WHERE name=?", (sandbox,))
                db.execute("UPDATE claims SET phase='Ready', ready_at=? WHERE name=?", (ready_at, claim))
                return True
            db.execute("UPDATE sandboxes SET state='releasing', claim=NULL WHERE name=?", (sandbox,))
            return False

    def bind_cold(self, claim: str, row: SandboxRow) -> None:
        """Give a Pending claim (whose sandbox was lost) a new cold sandbox row, in one transaction."""
        with self.tx() as db:
            db.execute(
                "INSERT INTO sandboxes(name, container_id, pool, pool_kind, template, hash, image, state, claim, "
                "created, launch_type) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (row.name, None, row.pool, row.pool_kind, row.template, row.hash, row.image, "creating", claim,
                 row.created, "cold"),
            )
            db.execute("UPDATE claims SET sandbox=?, launch_type='cold' WHERE name=?", (row.name, claim))

    # --- batches ----------------------------------------------------------------------------------------------------
    def add_batch(self, row: BatchRow) -> tuple[BatchRow, bool]:
        """Record a new batch with one Pending task per index; (the batch of that name, whether it is new)."""
        with self.tx() as db:
            existing = db.execute("SELECT * FROM batches WHERE name=?", (row.name,)).fetchone()
            if existing:
                return BatchRow(**dict(existing)), False
            db.execute("INSERT INTO batches(name, uid, pool, pool_kind, replicas, task, shutdown_policy, "
                       "ttl_after_finished, created) VALUES (?,?,?,?,?,?,?,?,?)",
                       (row.name, row.uid, row.pool, row.pool_kind, row.replicas, row.task, row.shutdown_policy,
                        row.ttl_after_finished, row.created))
            db.executemany("INSERT INTO batch_tasks(batch, idx, phase) VALUES (?,?,'Pending')",
                           [(row.name, i) for i in range(row.replicas)])
            return row, True

    def batch(self, name: str) -> BatchRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM batches WHERE name=?", (name,)).fetchone()
            return BatchRow(**dict(row)) if row else None

    def batches(self, *, finished: bool | None = None) -> list[BatchRow]:
        q = "SELECT * FROM batches"
        if finished is not None:
            q += " WHERE phase IS NOT NULL" if finished else " WHERE phase IS NULL"
        with self._lock:
            return [BatchRow(**dict(r)) for r in self._db.execute(q + " ORDER BY created, name")]

    @staticmethod
    def _task(row: sqlite3.Row) -> TaskRow:
        d = dict(row)
        d["output_truncated"] = bool(d["output_truncated"])
        return TaskRow(**d)

    def tasks(self, batch: str) -> list[TaskRow]:
        with self._lock:
            return [self._task(r) for r in self._db.execute("SELECT * FROM batch_tasks WHERE batch=? ORDER BY idx",
                                                            (batch,))]

    def task(self, batch: str, index: int) -> TaskRow | None:
        with self._lock:
            row = self._db.execute("SELECT * FROM batch_tasks WHERE batch=? AND idx=?", (batch, index)).fetchone()
            return self._task(row) if row else None

    def batch_with_tasks(self, name: str) -> tuple[BatchRow | None, list[TaskRow]]:
        with self._lock:
            return self.batch(name), self.tasks(name)

    def batches_with_tasks(self, *, pool: str | None = None) -> list[tuple[BatchRow, list[TaskRow]]]:
        with self._lock:
            return [(b, self.tasks(b.name)) for b in self.batches() if pool is None or b.pool == pool]

    def update_batch(self, name: str, **values: Any) -> None:
        cols = ", ".join(f"{k}=?" for k in values)
        with self.tx() as db:
            db.execute(f"UPDATE batches SET {cols} WHERE name=?", (*values.values(), name))

    def update_task(self, batch: str, index: int, **values: Any) -> None:
        cols = ", ".join(f"{k}=?" for k in values)
        with self.tx() as db:
            db.execute(f"UPDATE batch_tasks SET {cols} WHERE batch=? AND idx=?", (*values.values(), batch, index))

    def bind_batch(self, batch: BatchRow, indexes: Sequence[int], order: Callable[[list[Member]], list[Member]],
                   cold: Callable[[], SandboxRow], cold_limit: int | None = None) -> list[tuple[int, SandboxRow]]:
        """Bind the batch's Pending `indexes`, in one transaction: the pool's ready, idle sandboxes in
        `order(candidates)` first (as `adopt` binds a claim), then a new `creating` row from `cold()` for each index
        left, as long as the pool has fewer than `cold_limit` sandboxes (a Pool's poolMax). Returns (index, sandbox)
        for each index bound; the others stay Pending."""
        with self.tx() as db:
            pending = {r["idx"] for r in db.execute("SELECT idx FROM batch_tasks WHERE batch=? AND phase='Pending'",
                                                    (batch.name,))}
            todo = [i for i in indexes if i in pending]
            rows = [SandboxRow(**dict(r)) for r in db.execute(
                "SELECT * FROM sandboxes WHERE pool=? AND state='ready' AND claim IS NULL", (batch.pool,))]
            by_name = {r.name: r for r in rows}
            candidates = iter(order([r.member() for r in rows]))
            bound: list[tuple[int, SandboxRow]] = []
            while todo:
                m = next(candidates, None)
                if m is None:
                    break
                label = batchrules.claim_label(batch.name, todo[0])
                if db.execute("UPDATE sandboxes SET claim=?, launch_type='warm' WHERE name=? AND claim IS NULL",
                              (label, m.name)).rowcount == 1:
                    chosen = by_name[m.name]
                    chosen.claim, chosen.launch_type = label, "warm"
                    bound.append((todo.pop(0), chosen))
            room = len(todo)
            if todo and cold_limit is not None:
                total = db.execute("SELECT count(*) FROM sandboxes WHERE pool=?", (batch.pool,)).fetchone()[0]
                room = max(0, cold_limit - total)
            for i in todo[:room]:
                row = cold()
                row.claim, row.launch_type = batchrules.claim_label(batch.name, i), "cold"
                db.execute(
                    "INSERT INTO sandboxes(name, container_id, pool, pool_kind, template, hash, image, state, claim, "
                    "created, launch_type) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (row.name, None, row.pool, row.pool_kind, row.template, row.hash, row.image, "creating",
                     row.claim, row.created, "cold"),
                )
                bound.append((i, row))
            db.executemany("UPDATE batch_tasks SET phase='Bound', sandbox=?, launch_type=? WHERE batch=? AND idx=?",
                           [(row.name, row.launch_type, batch.name, i) for i, row in bound])
            if bound:
                db.execute("UPDATE batches SET started_at=COALESCE(started_at, ?) WHERE name=?",
                           (time.time(), batch.name))
            return bound

    def finish_batch_cold(self, batch: str, index: int, sandbox: str) -> bool:
        """The cold sandbox of a batch index started: ready if the index still waits for it; otherwise (the batch
        was deleted meanwhile) it goes to `releasing`. One transaction."""
        with self.tx() as db:
            row = db.execute("SELECT phase, sandbox FROM batch_tasks WHERE batch=? AND idx=?",
                             (batch, index)).fetchone()
            if row and row["phase"] == batchrules.BOUND and row["sandbox"] == sandbox:
                db.execute("UPDATE sandboxes SET state='ready' WHERE name=?", (sandbox,))
                return True
            db.execute("UPDATE sandboxes SET state='releasing', claim=NULL WHERE name=?", (sandbox,))
            return False

    def unbind_task(self, batch: str, index: int, sandbox: str) -> None:
        """A Bound index whose sandbox never started (the operator stopped meanwhile) is Pending again."""
        with self.tx() as db:
            db.execute("UPDATE batch_tasks SET phase='Pending', sandbox=NULL, launch_type=NULL "
                       "WHERE batch=? AND idx=? AND sandbox=? AND phase='Bound' AND command_id IS NULL",
                       (batch, index, sandbox))

    def end_task(self, batch: str, index: int, *, phase: str, reason: str, message: str, exit_code: int | None,
                 output: str | None, output_truncated: bool, release: bool) -> tuple[bool, str | None]:
        """Record how an index ended, once, and (`release`) let its sandbox go in the same transaction (state
        `releasing`, as a claim's end does). Returns (whether it ended now, the sandbox to release)."""
        with self.tx() as db:
            row = db.execute("SELECT phase, sandbox FROM batch_tasks WHERE batch=? AND idx=?",
                             (batch, index)).fetchone()
            if row is None or row["phase"] in batchrules.INDEX_ENDED:
                return False, None
            db.execute("UPDATE batch_tasks SET phase=?, reason=?, message=?, exit_code=?, output=?, "
                       "output_truncated=? WHERE batch=? AND idx=?",
                       (phase, reason, message, exit_code, output, int(output_truncated), batch, index))
            sandbox = row["sandbox"]
            if not release or not sandbox:
                return True, None
            cur = db.execute("UPDATE sandboxes SET claim=NULL, state='releasing' WHERE name=? AND claim=? "
                             "AND state='ready'", (sandbox, batchrules.claim_label(batch, index)))
            return True, sandbox if cur.rowcount == 1 else None

    def finish_batch(self, name: str, phase: str, finished_at: float) -> bool:
        """Record the batch's final phase, once."""
        with self.tx() as db:
            return db.execute("UPDATE batches SET phase=?, finished_at=?, message=NULL WHERE name=? AND phase IS NULL",
                              (phase, finished_at, name)).rowcount == 1

    def remove_batch(self, name: str) -> list[tuple[str, int, bool]]:
        """Delete a batch and its tasks, in one transaction. Its sandboxes leave it in state `releasing` (a sandbox
        still `creating` stays so, without its label: its start releases it). Returns (sandbox, index, whether its
        task had ended) for each released one."""
        with self.tx() as db:
            phases = {batchrules.claim_label(name, r["idx"]): (r["idx"], r["phase"]) for r in db.execute(
                "SELECT idx, phase FROM batch_tasks WHERE batch=?", (name,))}
            out = []
            for r in db.execute(f"SELECT name, claim, state FROM sandboxes WHERE claim IN "
                                f"({','.join('?' * len(phases))})", list(phases)).fetchall():
                if r["state"] == "creating":
                    db.execute("UPDATE sandboxes SET claim=NULL WHERE name=?", (r["name"],))
                    continue
                db.execute("UPDATE sandboxes SET claim=NULL, state='releasing' WHERE name=?", (r["name"],))
                index, phase = phases[r["claim"]]
                out.append((r["name"], index, phase in batchrules.INDEX_ENDED))
            db.execute("DELETE FROM batch_tasks WHERE batch=?", (name,))
            db.execute("DELETE FROM batches WHERE name=?", (name,))
            return out


def now() -> float:
    return time.time()
