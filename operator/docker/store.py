"""Claim and sandbox state in SQLite (WAL): the part of the truth Docker labels cannot hold (they are immutable).

Two tables. `sandboxes`: one row per sandbox container this operator made or is making (a row is written *before*
the container is created, so a crash leaves a row to clean up, never an unknown container). `claims`: one row per
claim. `sandboxes.claim` is UNIQUE and a sandbox has one `claim` column, so a sandbox can never serve two claims and
a claim never holds two sandboxes. Warm adoption is one IMMEDIATE transaction (see `adopt`).

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


def now() -> float:
    return time.time()
