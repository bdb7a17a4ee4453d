"""SandboxStarts: a sandbox's pod from our create until the watch shows it, and the statuses held back meanwhile.

- pod creates, (ns, sandbox) -> when this process created the sandbox's pod: until the pod shows up in the cache,
  a reconcile does not create it again; after `POD_CREATE_GRACE` seconds it does (a create that was lost). Gone
  when the pod is seen (`pod_seen`) or the sandbox is gone.
- settling, (ns, sandbox) -> when an intermediate (not Ready) status of a starting pod was first held back: such a
  status waits `settle` seconds, so a pod that gets Ready meanwhile costs one status write instead of one per pod
  phase (created, scheduled, running); an idle pool sandbox's may wait longer (the caller says how long). Gone when
  the status is written (`settled`) or the sandbox is gone.

A restarted operator has neither: it may create a pod again (a 409, harmless) and writes one intermediate status.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

POD_CREATE_GRACE = 30.0  # seconds we trust our own pod create before trying again

Key = tuple[str, str]  # (namespace, sandbox)


@dataclass
class SandboxStarts:
    settle: float = 0.3
    _pod_creates: dict[Key, float] = field(default_factory=dict)
    _settling: dict[Key, float] = field(default_factory=dict)

    def pod_create_due(self, key: Key, now: float) -> bool:
        """Whether to create the sandbox's pod: we have not, or our create is older than POD_CREATE_GRACE."""
        created = self._pod_creates.get(key)
        return created is None or now - created > POD_CREATE_GRACE

    def pod_created(self, key: Key, now: float) -> float:
        """Our pod create went through; returns when to look again if the pod has not shown up by then."""
        self._pod_creates[key] = now
        return now + POD_CREATE_GRACE + 1

    def pod_seen(self, key: Key) -> None:
        self._pod_creates.pop(key, None)

    def settle_until(self, key: Key, now: float, settle: float | None = None) -> float | None:
        """When an intermediate status of this sandbox may be written (None: now); `settle` seconds from when it was
        first held back (the default: `self.settle`)."""
        settle = self.settle if settle is None else settle
        if not settle:
            return None
        first = self._settling.setdefault(key, now)
        return first + settle if now - first < settle else None

    def settled(self, key: Key) -> None:
        """Its status was written."""
        self._settling.pop(key, None)

    def sandbox_gone(self, key: Key) -> None:
        self._pod_creates.pop(key, None)
        self._settling.pop(key, None)

    def forget_where(self, sandbox: Callable[[Key], bool]) -> None:
        """The sandboxes `sandbox` picks (a shard this replica no longer holds): as if gone."""
        for book in (self._pod_creates, self._settling):
            for key in [k for k in book if sandbox(k)]:
                del book[key]

    def __len__(self) -> int:
        return len(self._pod_creates) + len(self._settling)
