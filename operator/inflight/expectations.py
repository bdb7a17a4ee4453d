"""Expectations: creates this process made for a pool that the cache has not shown yet.

A pool counts them as members, so a reconcile that runs before the new sandbox's watch event does not create it a
second time (or overshoot a Pool's poolMax). An entry goes when the cache shows the name, after `ttl` seconds (a
create whose object never shows up, deleted at once say, must not hold the pool's count forever), or with the pool
(`forget`). Keyed by (kind, namespace, pool).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Expectations:
    ttl: float = 60.0
    _pending: dict[Any, dict[str, float]] = field(default_factory=dict)

    def expect(self, key: Any, name: str) -> None:
        self._pending.setdefault(key, {})[name] = time.monotonic()

    def outstanding(self, key: Any, seen: set[str]) -> int:
        """Creates for `key` still expected, given the names the cache shows (those, and expired ones, are dropped)."""
        pending = self._pending.get(key)
        if not pending:
            return 0
        now = time.monotonic()
        for name in [n for n, t in pending.items() if n in seen or now - t > self.ttl]:
            del pending[name]
        if not pending:
            del self._pending[key]
        return len(pending)

    def forget(self, key: Any) -> None:
        """The pool is gone."""
        self._pending.pop(key, None)

    def forget_where(self, pool: Callable[[Any], bool]) -> None:
        """The pools `pool` picks (a shard this replica no longer holds): as if gone."""
        for key in [k for k in self._pending if pool(k)]:
            del self._pending[key]

    def __len__(self) -> int:
        return len(self._pending)
