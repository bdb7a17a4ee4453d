"""PoolLocks: one asyncio lock per Pool, so its capacity check and its creates never interleave.

A Pool's reconcile (refill, recycling) and a claim's cold start inside it both count the members and then create:
two at once would each see room for one more and overshoot poolMax. The lock exists only while someone holds it or
waits for it (`hold` counts them), so there is nothing to clean up when a Pool goes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class _Entry:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


@dataclass
class PoolLocks:
    _locks: dict[tuple[str, str], _Entry] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def hold(self, ns: str, name: str) -> AsyncIterator[None]:
        entry = self._locks.setdefault((ns, name), _Entry())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._locks[(ns, name)]

    def __len__(self) -> int:
        return len(self._locks)
