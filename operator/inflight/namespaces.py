"""NamespaceRepairs: namespaces being deleted, and the lost-pod repair in flight in each.

When a namespace is deleted its pods go before its sandboxes, and every sandbox then looks like one whose pod was
lost. Repairing them would cost one GET and one refused create each, thousands in a big namespace. So:

- terminating, ns -> when a create in it was first refused because the namespace is being deleted
  (`mark_terminating`). Sandboxes and pools made before that are left alone (`terminating_since`); newer ones are
  not (the namespace was re-created). An entry is forgotten `forget_after` seconds after it was made, on the next
  mark of any namespace (a long gone namespace, or one re-created: its new objects are never skipped anyway).
- repairs, ns -> the repair in flight there, which the others wait for (`pod_repair`): the first finds the namespace
  going, and the ones that waited then skip. A real repair wave (a node lost) pays one extra round trip. An entry
  lives exactly as long as its repair.

A restarted operator pays the first refused create again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class NamespaceRepairs:
    forget_after: float = 600.0
    _terminating: dict[str, float] = field(default_factory=dict)
    _repairs: dict[str, asyncio.Future[None]] = field(default_factory=dict)

    def mark_terminating(self, ns: str, now: float) -> None:
        """A create in `ns` was refused: the namespace is being deleted."""
        self._terminating.setdefault(ns, now)
        for other, since in list(self._terminating.items()):
            if now - since > self.forget_after:
                del self._terminating[other]

    def is_terminating(self, ns: str) -> bool:
        return ns in self._terminating

    def terminating_since(self, ns: str, created: float) -> bool:
        """Whether an object created at `created` sits in a namespace seen being deleted after it was made."""
        since = self._terminating.get(ns)
        return since is not None and created <= since

    @contextlib.asynccontextmanager
    async def pod_repair(self, ns: str) -> AsyncIterator[None]:
        """Around re-creating a lost pod in `ns`: while one such repair is in flight there, the others wait for it,
        then go on together."""
        ahead = self._repairs.get(ns)
        if ahead is not None:
            await asyncio.shield(ahead)  # a waiter cancelled must not cancel the others' wait
            yield
            return
        done = asyncio.get_running_loop().create_future()
        self._repairs[ns] = done
        try:
            yield
        finally:
            del self._repairs[ns]
            done.set_result(None)

    @property
    def repairs_in_flight(self) -> int:
        return len(self._repairs)

    def __len__(self) -> int:
        return len(self._terminating) + len(self._repairs)
