"""ClaimBook: a claim's adoption and binding between our writes and the watch events that report them.

A warm claim adopts a sandbox with one conditional patch, then writes its own status; the cache shows either a few
milliseconds later. Meanwhile:

- `reserved`, (ns, sandbox) -> (ns, holder): a sandbox this process is adopting (or has adopted) for a claim (or a
  SandboxBatch index: the holder is its claim label). Concurrent claims in one process skip it, so they never race
  for it (across processes the resourceVersion decides). Set just before the adoption patch; gone when the patch
  fails, when the cache shows the sandbox labelled (`adoption_seen`), or when the sandbox is gone (`sandbox_gone`).
- `bound`, (ns, holder) -> sandbox: the sandbox a claim adopted or cold-started, until the cache shows it labelled
  for the claim (`binding_seen`). A claim finding it here does not decide again. Gone then, when the claim fails
  (`unbind`), or when the claim is gone (`claim_gone`).
- the phase last written to a claim's status, until the watch brings it back: a pass in between would write it
  twice (`awaiting_echo`). Gone when seen, or with the claim.
- when the operator first saw a claim pending (its claim latency starts there): gone when it binds, or with the
  claim.
- a live claim's validated spec, per (uid, generation): a claim is reconciled on each event of its own and of its
  sandbox, and validating its spec each time was a pydantic parse per pass on the hot path (`spec`). Gone when the
  claim ends (Failed, Finished) or is gone; an invalid spec is never kept.

After a restart the book is empty, and the cache is current (kopf fills it before any handler runs): a claim bound
before finds its sandbox by label, one whose adoption patch went through but whose status was not written binds then.
The same holds for a claim whose shard moves to another replica and back (sharded mode): everything kept for the
shard's claims goes when it moves (`forget_where`), since the other replica acts on them meanwhile. Kept, a phase
written here whose echo was overtaken by the other replica's writes would hold the claim back for good
(`awaiting_echo`), a binding the other replica undid would make it wait for a sandbox that is gone, and the claims
deleted meanwhile (their cleanup reconcile runs on the other replica) would leak their entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from corral.api import SandboxClaimSpec, validate

Key = tuple[str, str]  # (namespace, name)


@dataclass
class ClaimBook:
    reserved: dict[Key, Key] = field(default_factory=dict)
    bound: dict[Key, str] = field(default_factory=dict)
    _phase_written: dict[Key, str] = field(default_factory=dict)
    _first_seen: dict[Key, float] = field(default_factory=dict)
    _specs: dict[Key, tuple[str, Any, SandboxClaimSpec]] = field(default_factory=dict)

    # ---- adoption: a sandbox held for a claim until the cache shows it labelled --------------------------------------
    def reserve(self, ns: str, sandbox: str, holder: str) -> None:
        self.reserved[(ns, sandbox)] = (ns, holder)

    def unreserve(self, ns: str, sandbox: str) -> None:
        """The adoption patch failed: the sandbox is free again (as far as this process knows)."""
        self.reserved.pop((ns, sandbox), None)

    def reserved_in(self, ns: str) -> set[str]:
        return {name for (rns, name) in self.reserved if rns == ns}

    def is_reserved(self, ns: str, sandbox: str) -> bool:
        return (ns, sandbox) in self.reserved

    def adoption_seen(self, ns: str, sandbox: str) -> None:
        """The cache shows the sandbox with a claim label: its own watch event holds it from now on."""
        self.reserved.pop((ns, sandbox), None)

    # ---- binding: the sandbox a claim got, until the cache shows it --------------------------------------------------
    def bind(self, ns: str, holder: str, sandbox: str) -> None:
        self.bound[(ns, holder)] = sandbox

    def bound_to(self, ns: str, holder: str) -> str | None:
        return self.bound.get((ns, holder))

    def is_bound(self, ns: str, holder: str) -> bool:
        return (ns, holder) in self.bound

    def binding_seen(self, ns: str, holder: str) -> None:
        """The cache shows a sandbox labelled for the claim."""
        self.bound.pop((ns, holder), None)

    unbind = binding_seen  # the claim failed: it holds no sandbox

    # ---- the claim's own status --------------------------------------------------------------------------------------
    def phase_written(self, ns: str, name: str, phase: str) -> None:
        self._phase_written[(ns, name)] = phase

    def awaiting_echo(self, ns: str, name: str, cached_phase: str | None) -> bool:
        """Whether a phase we wrote has not reached the cache yet (acting on the cached claim would write it again).
        Once the cache shows it, it is forgotten."""
        written = self._phase_written.get((ns, name))
        if written is None:
            return False
        if written != cached_phase:
            return True
        del self._phase_written[(ns, name)]
        return False

    def first_seen(self, ns: str, name: str, now: float) -> float:
        """When the operator first saw this claim pending (set now if it had not)."""
        return self._first_seen.setdefault((ns, name), now)

    def decided(self, ns: str, name: str) -> None:
        """The claim is bound: its latency is measured."""
        self._first_seen.pop((ns, name), None)

    def spec(self, claim: dict[str, Any], *, keep: bool = True) -> SandboxClaimSpec:
        """The claim's validated spec, worked out once per spec generation (kept only if `keep`: a claim that has
        ended is reconciled rarely, and dropped here). Raises CorralValidationError."""
        meta = claim["metadata"]
        key, version = (meta["namespace"], meta["name"]), (meta.get("uid", ""), meta.get("generation"))
        hit = self._specs.get(key)
        if hit is not None and hit[:2] == version:
            if not keep:
                del self._specs[key]
            return hit[2]
        spec = validate(SandboxClaimSpec, claim.get("spec") or {})
        if keep:
            self._specs[key] = (*version, spec)
        else:
            self._specs.pop(key, None)
        return spec

    # ---- cleanup -------------------------------------------------------------------------------------------------
    def claim_gone(self, ns: str, name: str) -> None:
        """The claim is deleted: everything kept for it goes."""
        self.bound.pop((ns, name), None)
        self._phase_written.pop((ns, name), None)
        self._first_seen.pop((ns, name), None)
        self._specs.pop((ns, name), None)

    def sandbox_gone(self, ns: str, sandbox: str) -> None:
        """The sandbox is deleted: a reservation of it (an adoption whose labelled event never came) goes."""
        self.reserved.pop((ns, sandbox), None)

    def forget_where(self, holder: Callable[[str, str], bool]) -> int:
        """Everything kept for the holders (claims, or SandboxBatch indexes by their claim label) that
        `holder(ns, name)` picks: reservations made for them, bindings, phases written, first-seen times, specs (a
        shard this replica no longer holds, see corral.operator.shards). Returns how many entries went."""
        gone = [k for k, h in self.reserved.items() if holder(*h)]
        for k in gone:
            del self.reserved[k]
        n = len(gone)
        for book in (self.bound, self._phase_written, self._first_seen, self._specs):
            keys = [k for k in book if holder(*k)]
            for k in keys:
                del book[k]
            n += len(keys)
        return n

    def __len__(self) -> int:
        """Entries held in all (a leak shows here first)."""
        return (len(self.reserved) + len(self.bound) + len(self._phase_written) + len(self._first_seen)
                + len(self._specs))
