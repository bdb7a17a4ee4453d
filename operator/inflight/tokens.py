"""TokenBook: what this process did with execd tokens (the tokens themselves: corral.operator.tokens).

- installed, (ns, sandbox) -> (pod uid, claim uid): the claim's token this process put into that pod's execd
  (corral.operator.reconcile.handover). A later use by the same claim on the same pod needs no round trip; a release
  knows whether execd may hold a claim's token that must be taken back. Gone when taken back, when the pod is
  replaced (Restart recycling), or with the sandbox.
- key secrets: namespaces whose execd key Secret this process created (or found): one create per namespace. Gone
  when the namespace is being deleted (its Secret goes with it), or when its last sandbox is gone (the namespace may
  go and come back).

A restarted operator re-creates a key Secret once per namespace (a 409, as good), and puts a claim's token in again
on first use (execd accepts the claim's own token for that).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Key = tuple[str, str]  # (namespace, sandbox)


@dataclass
class TokenBook:
    _installed: dict[Key, tuple[str, str]] = field(default_factory=dict)
    _key_secrets: set[str] = field(default_factory=set)

    def installed(self, ns: str, sandbox: str) -> tuple[str, str] | None:
        """(pod uid, claim uid) whose claim token this process put into the sandbox's execd, if any."""
        return self._installed.get((ns, sandbox))

    def note_installed(self, ns: str, sandbox: str, pod_uid: str, claim_uid: str) -> None:
        self._installed[(ns, sandbox)] = (pod_uid, claim_uid)

    def take(self, ns: str, sandbox: str) -> tuple[str, str] | None:
        """Forget what was installed in the sandbox (its claim is over, or its pod replaced); returns it."""
        return self._installed.pop((ns, sandbox), None)

    def key_secret_needed(self, ns: str) -> bool:
        return ns not in self._key_secrets

    def key_secret_made(self, ns: str) -> None:
        self._key_secrets.add(ns)

    def namespace_gone(self, ns: str) -> None:
        """The namespace is being deleted: its key Secret goes with it."""
        self._key_secrets.discard(ns)

    def sandbox_gone(self, ns: str, sandbox: str, *, last_in_namespace: bool) -> None:
        self._installed.pop((ns, sandbox), None)
        if last_in_namespace:
            self._key_secrets.discard(ns)

    def forget_where(self, sandbox: Callable[[Key], bool]) -> None:
        """Drop what was installed in the sandboxes `sandbox` picks (sandboxes gone while another replica held their
        shard: their cleanup ran there)."""
        for key in [k for k in self._installed if sandbox(k)]:
            del self._installed[key]

    def has_key_secret(self, ns: str) -> bool:
        return ns in self._key_secrets

    def __len__(self) -> int:
        return len(self._installed) + len(self._key_secrets)
