"""Sharded mode: more than one active operator replica, each reconciling the pools (and everything on them) of the
shards it holds, each shard under its own Lease (coordination.k8s.io/v1).

Turned on by CORRAL_SHARDS=N (N >= 1; unset or 0: the default active/standby mode of corral.operator.leadership).
Every replica then runs standalone kopf: all of them watch everything (their caches are complete and current, so a
shard that moves needs no re-list), but a replica only *reconciles* keys whose shard it holds.

The shard function (`shard_of`, `ShardMap.shard`): a pool is hashed by (namespace, pool kind, pool name) into one of
N shards (blake2b, stable across processes). A claim belongs to its poolRef's shard, a batch to its poolRef's, a
sandbox to its pool label's (a cold sandbox without one: its claim's or batch's pool), a pod is reconciled under its
sandbox's key. Templates are hashed by (namespace, "SandboxTemplate", name): a template reconcile writes only the
template's own status and NetworkPolicy. A key whose object is no longer in the cache (the reconcile that clears
in-memory state after a deletion) keeps the shard it had when last seen.

Leases, in CORRAL_SHARD_NAMESPACE (default: the operator's namespace), all labelled `corral.dev/shards=<group>`:
- `<group>-shard-<i>` for i in 0..N-1 (group: CORRAL_SHARD_GROUP, default `corral`): holderIdentity is the
  replica acting on shard i;
- `<group>-replica-<hash>`, one per live replica (its membership; holderIdentity is the replica, the annotation
  `corral.dev/claims-api-address` its claims API address): how replicas find each other, including one that holds
  no shard yet.
One watch on the leases feeds every replica's view; writes are the renewals (each held lease every
leaseDurationSeconds/3, the only periodic API calls of an idle sharded operator, counted under resource="Lease"),
plus acquisitions and releases when membership changes. All writes are merge patches preconditioned on the lease's
resourceVersion (optimistic concurrency: of two replicas taking one free shard, one gets a 409).

Who holds what (`assign`): the live members (a member lease renewed within its duration, as observed locally) share
the shards evenly, fair share = ceil(N / live replicas) for some of them and floor for the rest; current holders
keep what they hold up to their quota (least movement), the rest go round-robin. Every replica computes the same
assignment from the same view; views differ for a moment, and the CAS writes settle it. A replica
- releases a shard assigned to another: it stops acting on it first, then clears holderIdentity;
- acquires a shard assigned to it once the shard is free: never held, released, or expired (no renewal observed
  for leaseDurationSeconds, timed with the local monotonic clock from when this replica saw the last change, never
  from the holder's clock, as client-go's leader election does);
- acts on a shard only until `renewed + duration * (1 - SAFETY)`, measured from when it *sent* its last successful
  renewal. A replica that cannot renew (partitioned, paused) so stops acting before anyone else may take over.
A replica killed without goodbye: its shards are free `leaseDurationSeconds` after its last renewal was observed,
and its member lease expires with them, so the survivors' assignment covers them: a shard moves within the lease
time (plus the watch's delivery). A replica that sees any lease of another run out counts that one gone: out of its
assignment, its member lease cleared, and each of its shard leases cleared as it runs out if another replica is to
take it (`reap`: holderIdentity removed, a CAS like every write). A replica that joined since (the Deployment's
replacement pod) times leases from its own first sight of them and would otherwise wait a whole duration more. A
replica stopped (SIGTERM) releases its shards before its claims API drains (handlers.cleanup).

On acquiring a shard the replica requests a reconcile of every object in it (from the cache); on losing it, the
queue's timers for its keys are cancelled and its batches' task followers stopped; requests for keys of shards not
held are dropped (`Context.request`), and so is a queued key whose shard went meanwhile (handlers.dispatch). What the
replica keeps in memory for the shard's objects goes on losing it and again on acquiring it (Context.forget, and
whatever a reconcile still running at the loss noted after it): claim adoptions and bindings, phases written and
awaiting their echo, first-seen times, pod creates, expected creates and refill pacing, batch states, and with them
whatever was kept for objects the cache no longer has (their cleanup reconcile may have run on another replica).
Another replica acts on them meanwhile, so that memory is stale when the shard comes back: a Bound awaiting its echo,
overtaken by the other replica's writes, would hold the claim back for good; a binding the other replica undid would
make the claim wait for a sandbox that is gone. (Kept: a claim token noted as put into a live sandbox's execd, which
only makes a later take-back restart the pod if execd does not answer, until the sandbox's deletion event reaches
this replica; template specs and namespace state, no shard's. A claim pending across a handover measures its
latency from when its current holder first saw it.) A key whose object is gone keeps its last shard for GONE_TTL
seconds (`ShardMap.shard`): the request, the dispatch and a lost shard's timers agree on where its cleanup runs.

What must never happen during a handover, when two replicas may both act on one shard for a moment (a reconcile that
started before the old holder stopped; a paused process): one sandbox bound to two claims (or batch indexes), one
claim bound to two sandboxes, one SandboxBatch index given two sandboxes, or a batch task run in a sandbox its index
then gives up. The first is excluded by the adoption patch's resourceVersion precondition (reconcile/claims.py
`_adopt`, reconcile/batches.py `_adopt`: the second replica's patch carries the version it saw unclaimed, and gets a
409). The second by the claim's Bound status write, preconditioned on the claim's resourceVersion (`_bind`): of two
replicas binding one claim, only one write succeeds; the other reads the claim once, sees it bound elsewhere and
deletes the sandbox it took. Every other claim status write of a pass is conditional on the version the pass decided
on too (Pending while it waits, Failed, Finished; a failed claim's sandbox is deleted only once Failed is written):
a replica whose view is behind never writes over a claim that the other bound. The third by the batch's status
write, preconditioned on the resourceVersion of the batch that replica's entries are built on (reconcile/batches.py
`_write`; never the cache's newer version, which may hold the other's entries not merged in): the other reads the
batch once, keeps for each index the sandbox the status names (`settle_indexes`) and deletes the one it took; a
sandbox left labelled for an index whose status names another (its taker died first) is deleted by the next
reconcile. The fourth because a pass that gives an index a sandbox
writes the status before it starts the task (both replicas may then follow one task: execd's keyed start makes it
one command). None of this costs a write on the normal path: a replica's own consecutive writes are conditional on
the version its last one returned. Reconciles still running when a shard is released are not waited for: these
preconditions make the overlap safe (its cost: a sandbox taken, deleted and refilled). The kube tier drives both
replicas at the same claims, and at the same batches, at once (tests/kube/test_operator_shards.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .constants import L_CLAIM, L_POOL, L_POOL_KIND
from .metrics import SHARDS_HELD

log = logging.getLogger("corral.operator.shards")

L_SHARDS = "corral.dev/shards"
A_ADDRESS = "corral.dev/claims-api-address"
SHARD_PREFIX = "-shard-"  # after the group: corral-shard-0
MEMBER_PREFIX = "-replica-"
SAFETY = 0.2  # a holder stops acting this share of the lease duration before others may take over
RENEW_EVERY = 1 / 3  # of the lease duration
DEAD_AFTER = 10  # lease durations without a renewal: a member lease is deleted
GONE_TTL = 60.0  # seconds a key whose object is gone from the cache keeps its last shard (ShardMap.shard)
Key = tuple[str, str, str]


# ---- pure parts ----------------------------------------------------------------------------------------------------

def shard_of(namespace: str, kind: str, name: str, shards: int) -> int:
    """The shard of (namespace, kind, name) among `shards`: stable across processes and restarts."""
    digest = hashlib.blake2b(f"{namespace}/{kind}/{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def fair_share(shards: int, replicas: int) -> int:
    """The most shards one replica holds when `replicas` share `shards`."""
    return math.ceil(shards / max(1, replicas))


def member_lease_name(identity: str, group: str = "corral") -> str:
    return group + MEMBER_PREFIX + hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()


def assign(shards: int, members: Iterable[str], holders: Mapping[int, str | None]) -> dict[int, str]:
    """Shard -> member: each live member gets floor or ceil of shards/members (the ceil goes to those holding most
    now, then by name), current holders keep what they hold within their quota, the rest go round-robin. Every
    replica computes the same answer from the same view."""
    live = sorted(set(members))
    if not live:
        return {}
    base, extra = divmod(shards, len(live))
    counts = Counter(h for h in holders.values() if h in live)
    order = sorted(live, key=lambda m: (-counts[m], m))
    left = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}
    result: dict[int, str] = {}
    for s in range(shards):
        h = holders.get(s)
        if h is not None and left.get(h, 0) > 0:
            result[s] = h
            left[h] -= 1
    turn = 0
    for s in range(shards):
        if s in result:
            continue
        while left[order[turn % len(order)]] == 0:
            turn += 1
        m = order[turn % len(order)]
        result[s] = m
        left[m] -= 1
        turn += 1
    return result


@dataclass
class Observed:
    """One lease as this replica last saw it; `seen` is the local monotonic time its record last changed."""

    holder: str | None
    duration: float
    rv: str
    seen: float
    renew: str = ""
    address: str = ""

    def live(self, now: float) -> bool:
        return bool(self.holder) and now - self.seen < self.duration

    def expires(self) -> float:
        return self.seen + self.duration


def observe(previous: Observed | None, body: Mapping[str, Any], now: float) -> Observed:
    """The new view of a lease from its body: `seen` moves only when holder or renewTime changed."""
    meta, spec = body.get("metadata") or {}, body.get("spec") or {}
    holder = spec.get("holderIdentity") or None
    renew = str(spec.get("renewTime") or "")
    seen = now
    if previous is not None and previous.holder == holder and previous.renew == renew:
        seen = previous.seen
    return Observed(holder=holder, duration=float(spec.get("leaseDurationSeconds") or 0), rv=meta.get("resourceVersion",
                    ""), seen=seen, renew=renew, address=(meta.get("annotations") or {}).get(A_ADDRESS, ""))


@dataclass(frozen=True)
class Plan:
    acquire: tuple[int, ...] = ()
    release: tuple[int, ...] = ()
    reap: tuple[int, ...] = ()  # ran out in this replica's view, assigned to another: cleared for it (see `plan`)


def plan(me: str, shards: int, leases: Mapping[int, Observed], members: Iterable[str], held: Iterable[int],
         now: float) -> Plan:
    """What this replica does with the shard leases, given its view at `now` (local monotonic time)."""
    held = set(held)
    holders = {s: (me if s in held else (o.holder if o.live(now) else None)) for s, o in leases.items()}
    for s in held:
        holders[s] = me
    target = assign(shards, {*members, me}, holders)
    release = tuple(sorted(s for s in held if target.get(s) != me))
    acquire = tuple(sorted(s for s, m in target.items() if m == me and s not in held
                           and s in leases and (leases[s].holder in (None, me) or not leases[s].live(now))))
    # A lease that ran out here (its holder died without releasing it) and that another replica is to take: cleared,
    # so that it takes it at once. That replica may have joined since (a Deployment's replacement pod): it times the
    # lease from its own first sight of it and would wait a whole duration more.
    reap = tuple(sorted(s for s, o in leases.items() if s not in held and o.holder not in (None, me)
                        and not o.live(now) and target.get(s) not in (None, me)))
    return Plan(acquire=acquire, release=release, reap=reap)


LEFTOVER_AFTER = 300.0  # s of wall clock without a renewal: a lease of no current shard belongs to nobody alive


def leftovers(items: Iterable[Mapping[str, Any]], namespace: str, group: str, shards: int,
              now: datetime) -> tuple[list[tuple[str, str]], float | None]:
    """The group's leases in `namespace` that the current configuration has no use for: shard leases of index >=
    shards, and with sharding off (shards=0) every lease of the group, member leases included. Each is left over
    once it is free (no holder) or has not been renewed for LEFTOVER_AFTER s (wall clock, from its renewTime: a
    replica of an earlier configuration still running, a rolling update, keeps its leases until then). Returns
    [(name, resourceVersion)] to delete, and the seconds until the next one held now would be left over (None:
    none)."""
    shard_prefix, member_prefix = group + SHARD_PREFIX, group + MEMBER_PREFIX
    gone: list[tuple[str, str]] = []
    wait: float | None = None
    for body in items:
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        name = meta.get("name", "")
        if meta.get("namespace") != namespace:
            continue
        if name.startswith(shard_prefix) and name[len(shard_prefix):].isdigit():
            if int(name[len(shard_prefix):]) < shards:
                continue
        elif not (shards == 0 and name.startswith(member_prefix)):
            continue
        left = 0.0
        if spec.get("holderIdentity"):
            try:
                renewed = datetime.fromisoformat(str(spec.get("renewTime")).replace("Z", "+00:00"))
                left = LEFTOVER_AFTER - (now - renewed).total_seconds()
            except ValueError:
                left = 0.0  # a holder without a readable renewTime: never renewed by a replica of ours
        if left <= 0:
            gone.append((name, meta.get("resourceVersion", "")))
        else:
            wait = left if wait is None else min(wait, left)
    return gone, wait


async def sweep_leftovers(kube: Any, namespace: str, group: str, shards: int) -> float | None:
    """Delete the group's leftover leases (`leftovers`), each conditional on the version seen. One list of the
    group's leases; returns the seconds until the next leftover (None: none left)."""
    from .kube import ignore

    items, _ = await kube.list_all("Lease", {L_SHARDS: group})
    gone, wait = leftovers(items, namespace, group, shards, datetime.now(UTC))
    for name, rv in gone:
        log.info("deleting lease %s/%s: no replica of this configuration (%s) uses it", namespace, name,
                 f"{shards} shards" if shards else "sharding off")
        await ignore({404, 409}, kube.delete("Lease", name, namespace, resource_version=rv or None))
    return wait


async def keep_sweeping(kube: Any, namespace: str, group: str, shards: int, still: Callable[[], bool]) -> None:
    """sweep_leftovers, again when the next leftover is due, while still() (a replica's role that sweeps) holds.
    Ends when none is left: only a replica of the earlier configuration still running (a rolling update) renews
    one, and it keeps this going (one list per LEFTOVER_AFTER s) only until it stops."""
    while still():
        try:
            wait = await sweep_leftovers(kube, namespace, group, shards)
        except Exception as exc:  # noqa: BLE001 - leftovers are untidy, not harmful: not retried until next time
            log.warning("could not sweep leftover shard leases in %s (again at the next takeover): %s", namespace,
                        exc)
            return
        if wait is None:
            return
        await asyncio.sleep(wait + 1)


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---- which shard a reconcile key is in -----------------------------------------------------------------------------

def pool_ref(body: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of a claim's or a batch's spec.poolRef; the name is "" when it has none."""
    ref = (body.get("spec") or {}).get("poolRef") or {}
    return ref.get("kind") or "WarmPool", ref.get("name") or ""


class ShardMap:
    """(kind, namespace, name) -> shard, from the cache (see the module docstring)."""

    def __init__(self, cache: Any, shards: int) -> None:
        self.cache, self.shards = cache, shards
        self._last: dict[Key, int] = {}  # the shard of a key when its object was last seen
        self._gone: dict[Key, float] = {}  # keys whose object the cache no longer has -> since when (oldest first)

    def _pool_ref(self, ns: str, body: Mapping[str, Any] | None) -> int | None:
        return None if body is None else shard_of(ns, *pool_ref(body), self.shards)

    def _compute(self, kind: str, ns: str, name: str) -> int | None:
        """Pools and templates by their own name; claims and batches by their poolRef; a sandbox by its pool label,
        else by what holds it (a claim or a batch: Cache.holder)."""
        cache = self.cache
        if kind == "SandboxClaim":
            return self._pool_ref(ns, cache.claim(ns, name))
        if kind == "SandboxBatch":
            return self._pool_ref(ns, cache.batch(ns, name))
        if kind == "Sandbox":
            body = cache.sandbox(ns, name)
            if body is None:
                return None
            labels = (body.get("metadata") or {}).get("labels") or {}
            if labels.get(L_POOL):
                return shard_of(ns, labels.get(L_POOL_KIND) or "WarmPool", labels[L_POOL], self.shards)
            claim = labels.get(L_CLAIM)
            found = self._pool_ref(ns, cache.holder(ns, claim)) if claim else None
            return found if found is not None else shard_of(ns, "Sandbox", name, self.shards)
        return shard_of(ns, kind, name, self.shards)

    def shard(self, key: Key) -> int:
        """The key's shard. A key whose object the cache no longer has keeps the shard it had for GONE_TTL seconds:
        its deletion is asked about more than once (the request, then dispatch, then a lost shard's timers), and
        each must get the same answer, or the reconcile that cleans up after it runs nowhere."""
        found = self._compute(*key) if self.cache.ready else None
        if found is None:
            now = time.monotonic()
            while self._gone:  # the oldest first: forget those gone for GONE_TTL
                old, since = next(iter(self._gone.items()))
                if now - since < GONE_TTL:
                    break
                del self._gone[old]
                self._last.pop(old, None)
            last = self._last.get(key)
            if last is None:
                return shard_of(key[1], key[0], key[2], self.shards)
            self._gone.setdefault(key, now)
            return last
        self._last[key] = found
        if self._gone:
            self._gone.pop(key, None)  # (made again under its name)
        return found


# ---- the lease loop ------------------------------------------------------------------------------------------------

@dataclass
class ShardSettings:
    shards: int
    namespace: str
    group: str = "corral"
    duration: float = 15.0
    address: str = ""

    @staticmethod
    def home(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
        """(namespace, group) of the shard leases, whether sharding is on or not (off: to sweep what it left)."""
        env = os.environ if environ is None else environ
        return (env.get("CORRAL_SHARD_NAMESPACE") or env.get("CORRAL_NAMESPACE") or "corral-system",
                env.get("CORRAL_SHARD_GROUP") or "corral")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, api_port: int | None = None) -> ShardSettings | None:
        env = os.environ if environ is None else environ
        n = int(env.get("CORRAL_SHARDS") or 0)
        if n <= 0:
            return None
        address = env.get("CORRAL_SHARD_ADDRESS", "")
        if not address and api_port:
            host = env.get("CORRAL_POD_IP") or env.get("CORRAL_API_HOST") or ""
            if host and host not in ("0.0.0.0", "::"):
                address = f"http://[{host}]:{api_port}" if ":" in host else f"http://{host}:{api_port}"
        namespace, group = cls.home(env)
        return cls(shards=n, namespace=namespace, group=group,
                   duration=float(env.get("CORRAL_SHARD_LEASE_SECONDS") or 15), address=address)


@dataclass
class Shards:
    """This replica's shard leases: which it holds, and the loop that keeps them (see the module docstring)."""

    settings: ShardSettings
    me: str
    kube: Any
    shard_map: ShardMap
    on_acquired: Callable[[int], Any] = lambda s: None
    on_lost: Callable[[int], Any] = lambda s: None
    leases: dict[int, Observed] = field(default_factory=dict)
    members: dict[str, Observed] = field(default_factory=dict)  # member lease name -> view
    valid_until: dict[int, float] = field(default_factory=dict)  # held shards: act until (monotonic)
    _rv: dict[str, str] = field(default_factory=dict)  # lease name -> the resourceVersion of our last write
    _renewed: dict[str, float] = field(default_factory=dict)  # lease name -> when our last renewal was sent
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _watch: asyncio.Task[None] | None = None

    @property
    def n(self) -> int:
        return self.settings.shards

    @property
    def member_name(self) -> str:
        return member_lease_name(self.me, self.settings.group)

    def shard_lease(self, s: int) -> str:
        return f"{self.settings.group}{SHARD_PREFIX}{s}"

    def held(self, now: float | None = None) -> set[int]:
        t = time.monotonic() if now is None else now
        return {s for s, until in self.valid_until.items() if t < until}

    def owns(self, shard: int) -> bool:
        until = self.valid_until.get(shard)
        return until is not None and time.monotonic() < until

    def owns_key(self, key: Key) -> bool:
        """Whether this replica reconciles the key. Before the cache is complete every key is let in (a claim's
        pool may not be known yet): dispatch asks again once the cache is ready, before it runs anything."""
        if not self.shard_map.cache.ready:
            return True
        return self.owns(self.shard_map.shard(key))

    def owner_address(self, shard: int) -> tuple[str | None, str]:
        """(holder identity, its claims API address) of a shard as last observed; (None, '') when nobody live."""
        now = time.monotonic()
        obs = self.leases.get(shard)
        if obs is None or not obs.live(now):
            return None, ""
        for m in self.members.values():
            if m.holder == obs.holder and m.live(now):
                return obs.holder, m.address
        return obs.holder, ""

    # ---- API -------------------------------------------------------------------------------------------------------
    def _lease(self, name: str, holder: str | None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name, "namespace": self.settings.namespace,
                                "labels": {L_SHARDS: self.settings.group}}
        if annotations:
            meta["annotations"] = annotations
        spec: dict[str, Any] = {"leaseDurationSeconds": max(1, math.ceil(self.settings.duration))}
        if holder:
            spec.update(holderIdentity=holder, acquireTime=now_micro(), renewTime=now_micro())
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def _write(self, name: str, rv: str, spec: dict[str, Any], annotations: dict[str, str] | None = None) -> \
            dict[str, Any] | None:
        """A CAS merge patch of a lease; None on a conflict (someone else wrote it since `rv`)."""
        from .kube import status_code

        meta: dict[str, Any] = {"resourceVersion": rv}
        if annotations:
            meta["annotations"] = annotations
        try:
            return await self.kube.patch("Lease", name, self.settings.namespace, {"metadata": meta, "spec": spec})
        except Exception as exc:
            if status_code(exc) in (404, 409):
                return None
            raise

    async def _bootstrap(self) -> None:
        from .kube import status_code

        items, _ = await self.kube.list_all("Lease", {L_SHARDS: self.settings.group})
        now = time.monotonic()
        self._apply(items, now)
        for s in range(self.n):
            if s not in self.leases:
                try:
                    created = await self.kube.create(self._lease(self.shard_lease(s), None))
                    self._apply([created], now)
                except Exception as exc:
                    if status_code(exc) != 409:
                        raise
        await self._join()

    async def _join(self) -> None:
        from .kube import status_code

        name = self.member_name
        ann = {A_ADDRESS: self.settings.address}
        sent = time.monotonic()
        try:
            body = await self.kube.create(self._lease(name, self.me, ann))
        except Exception as exc:
            if status_code(exc) != 409:
                raise
            body = await self.kube.get("Lease", name, self.settings.namespace)
            body = await self._write(name, body["metadata"]["resourceVersion"], {
                "holderIdentity": self.me, "renewTime": now_micro(),
                "leaseDurationSeconds": max(1, math.ceil(self.settings.duration))}, ann) or body
        self._rv[name], self._renewed[name] = body["metadata"]["resourceVersion"], sent
        self._apply([body], time.monotonic())

    def _apply(self, items: Iterable[Mapping[str, Any]], now: float, deleted: bool = False) -> None:
        for body in items:
            name = (body.get("metadata") or {}).get("name", "")
            shard_prefix, member_prefix = self.settings.group + SHARD_PREFIX, self.settings.group + MEMBER_PREFIX
            if name.startswith(shard_prefix) and name[len(shard_prefix):].isdigit():
                s = int(name[len(shard_prefix):])
                if s >= self.n:
                    continue
                if deleted:
                    self.leases.pop(s, None)
                else:
                    self.leases[s] = observe(self.leases.get(s), body, now)
            elif name.startswith(member_prefix):
                if deleted:
                    self.members.pop(name, None)
                else:
                    self.members[name] = observe(self.members.get(name), body, now)

    def live_members(self, now: float) -> set[str]:
        return {o.holder for o in self.members.values() if o.holder and o.live(now)}

    async def _watch_leases(self) -> None:
        from lightkube.resources.coordination_v1 import Lease

        while True:
            try:
                self.kube._count("watch", "Lease")  # noqa: SLF001 - the operator's one counter of API calls
                async for event, obj in self.kube.client.watch(
                        Lease, namespace=self.settings.namespace, labels={L_SHARDS: self.settings.group},
                        server_timeout=600):
                    body = obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)
                    self._apply([body], time.monotonic(), deleted=event == "DELETED")
                    self._wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep watching; renewals go on meanwhile
                log.warning("watching shard leases failed (%s); retrying", exc)
                await asyncio.sleep(1)

    async def _step(self) -> None:
        now = time.monotonic()
        d = self.settings.duration
        # losses first: a held shard whose renewal did not go through in time
        for s in [s for s, until in self.valid_until.items() if now >= until]:
            await self._lose(s, "its lease was not renewed in time")
        if now - self._renewed.get(self.member_name, 0) >= d * RENEW_EVERY:
            await self._renew_member()
        await self._forget_dead(now)
        # A replica with a lease that ran out here (no renewal seen for its duration) is gone: out of the assignment,
        # and its member lease cleared, so that every view drops it now (a replica that joined since counts a member
        # lease live for a duration from its own first sight, and would keep a share for it); its shard leases are
        # cleared as each runs out, for whoever is to take them (`plan`). Alive after all, it joins again.
        gone = {o.holder for o in (*self.leases.values(), *self.members.values())
                if o.holder and o.holder != self.me and not o.live(now)}
        for name, obs in list(self.members.items()):
            if name != self.member_name and obs.holder in gone:
                await self._reap(name, obs)
        p = plan(self.me, self.n, self.leases, self.live_members(now) - gone, self.held(now), now)
        for s in p.release:
            await self._release(s)
        for s in p.acquire:
            await self._acquire(s)
        for s in p.reap:
            await self._reap(self.shard_lease(s), self.leases[s])
        for s in sorted(self.held()):
            name = self.shard_lease(s)
            if time.monotonic() - self._renewed.get(name, 0) >= d * RENEW_EVERY:
                await self._renew(s)

    async def _forget_dead(self, now: float) -> None:
        """A member lease not renewed for DEAD_AFTER durations is a replica gone for good (a killed pod): deleted,
        conditional on the version seen (one delete per dead replica, not a periodic call)."""
        for name, obs in list(self.members.items()):
            if name != self.member_name and now - obs.seen > obs.duration * DEAD_AFTER:
                self.members.pop(name, None)
                with contextlib.suppress(Exception):
                    await self.kube.delete("Lease", name, self.settings.namespace, resource_version=obs.rv)

    async def _renew_member(self) -> None:
        name = self.member_name
        sent = time.monotonic()
        rv = self._rv.get(name) or (self.members.get(name).rv if name in self.members else "")  # type: ignore[union-attr]
        body = await self._write(name, rv, {"holderIdentity": self.me, "renewTime": now_micro()})
        if body is None:
            await self._join()
            return
        self._rv[name], self._renewed[name] = body["metadata"]["resourceVersion"], sent
        self._apply([body], time.monotonic())

    async def _acquire(self, s: int) -> None:
        name, obs = self.shard_lease(s), self.leases[s]
        sent = time.monotonic()
        body = await self._write(name, obs.rv, {
            "holderIdentity": self.me, "acquireTime": now_micro(), "renewTime": now_micro(),
            "leaseDurationSeconds": max(1, math.ceil(self.settings.duration))})
        if body is None:
            return  # someone else was faster (or the view was stale): the watch brings the new state
        self._rv[name], self._renewed[name] = body["metadata"]["resourceVersion"], sent
        self._apply([body], time.monotonic())
        self.valid_until[s] = sent + self.settings.duration * (1 - SAFETY)
        SHARDS_HELD.set(len(self.valid_until))
        log.info("shard %d acquired (previous holder %s)", s, obs.holder or "none")
        await _call(self.on_acquired, s)

    async def _renew(self, s: int) -> None:
        name = self.shard_lease(s)
        sent = time.monotonic()
        try:
            body = await self._write(name, self._rv.get(name, ""), {"holderIdentity": self.me,
                                                                      "renewTime": now_micro()})
        except Exception as exc:  # noqa: BLE001 - retried at the next step; acting stops at valid_until
            log.warning("renewing shard %d failed: %s", s, exc)
            return
        if body is None:
            await self._lose(s, "its lease was taken (409 on renewal)")
            return
        self._rv[name], self._renewed[name] = body["metadata"]["resourceVersion"], sent
        self._apply([body], time.monotonic())
        if s in self.valid_until:
            self.valid_until[s] = sent + self.settings.duration * (1 - SAFETY)

    async def _lose(self, s: int, why: str) -> None:
        if self.valid_until.pop(s, None) is None:
            return
        SHARDS_HELD.set(len(self.valid_until))
        log.warning("shard %d lost: %s", s, why)
        await _call(self.on_lost, s)

    async def _release(self, s: int) -> None:
        """Stop acting first, then clear the holder (a CAS: a lease we no longer hold is left alone)."""
        name = self.shard_lease(s)
        if self.valid_until.pop(s, None) is not None:
            SHARDS_HELD.set(len(self.valid_until))
            log.info("shard %d released (assigned to another replica)", s)
            await _call(self.on_lost, s)
        with contextlib.suppress(Exception):
            body = await self._write(name, self._rv.get(name, ""), {"holderIdentity": None, "renewTime": None,
                                                                      "acquireTime": None})
            if body is not None:
                self._apply([body], time.monotonic())

    async def _reap(self, name: str, obs: Observed) -> None:
        """Clear the holder of a lease that ran out in this replica's view: no renewal seen for its duration, so its
        holder has stopped acting on it (as for an acquisition). Every replica then sees it free at once, including
        one that joined less than a duration ago. A CAS on the version seen: a renewal meanwhile wins."""
        try:
            body = await self._write(name, obs.rv, {"holderIdentity": None, "renewTime": None, "acquireTime": None})
        except Exception as exc:  # noqa: BLE001 - retried at the next step, if it still applies
            log.warning("clearing lease %s of %s failed: %s", name, obs.holder, exc)
            return
        if body is not None:
            log.info("lease %s of %s ran out (no renewal seen for %.0f s): cleared for the others", name,
                     obs.holder, obs.duration)
            self._apply([body], time.monotonic())

    def _next_wake(self) -> float:
        now, d = time.monotonic(), self.settings.duration
        times = [self._renewed.get(self.member_name, now) + d * RENEW_EVERY]
        times += [self._renewed.get(self.shard_lease(s), now) + d * RENEW_EVERY for s in self.valid_until]
        times += list(self.valid_until.values())
        # a lease or member observed live expires: the assignment changes then
        times += [o.expires() for o in (*self.leases.values(), *self.members.values()) if o.live(now)]
        return max(0.05, min(times) - now + 0.01)

    async def _run(self) -> None:
        while True:
            try:
                await self._bootstrap()
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. the namespace is not there yet
                log.warning("shard leases: could not start (%s); retrying", exc)
                await asyncio.sleep(2)
        self._watch = asyncio.create_task(self._watch_leases(), name="corral-shard-watch")
        while True:
            self._wake.clear()
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the next step retries; held shards lapse at valid_until
                log.exception("shard lease step failed")
                await asyncio.sleep(0.5)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._next_wake())

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="corral-shards")

    async def stop(self) -> None:
        """Stop acting, release every held shard and leave (delete the member lease): the others take over now."""
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for s in sorted(self.valid_until):
            await self._release(s)
        name = self.member_name
        with contextlib.suppress(Exception):
            await self.kube.delete("Lease", name, self.settings.namespace, resource_version=self._rv.get(name))


async def _call(fn: Callable[[int], Any], s: int) -> None:
    result = fn(s)
    if asyncio.iscoroutine(result):
        await result


# ---- wiring into the operator (handlers.startup) -------------------------------------------------------------------

RECONCILED = ("SandboxTemplate", "WarmPool", "Pool", "SandboxClaim", "SandboxBatch", "Sandbox")


def start_shards(ctx: Any, settings: ShardSettings, me: str) -> Shards:
    """Sharded mode for the operator's Context: its requests are gated by the shards held (Context.request)."""
    shard_map = ShardMap(ctx.cache, settings.shards)
    sweeping: set[asyncio.Task[None]] = set()

    def keys_in(s: int) -> list[Key]:
        return [(kind, b["metadata"]["namespace"], b["metadata"]["name"]) for kind in RECONCILED
                for b in ctx.cache.all_objects(kind)
                if shard_map.shard((kind, b["metadata"]["namespace"], b["metadata"]["name"])) == s]

    def in_shard(s: int) -> Callable[[Key], bool]:
        return lambda key: shard_map.shard(key) == s or ctx.cache.get(*key) is None

    def acquired(s: int) -> None:
        """Everything in the shard is looked at again: the previous holder may have left it half-done. What this
        replica kept of the shard from an earlier tenure is dropped first (a reconcile still running when it lost
        the shard may have noted something after `lost`)."""
        ctx.forget(in_shard(s))
        keys = keys_in(s)
        for key in keys:
            ctx.request(*key)
        log.info("shard %d: %d objects to reconcile", s, len(keys))
        if s == 0:  # shard 0's holder tidies the leases of shards an earlier configuration had (more of them)
            task = asyncio.create_task(keep_sweeping(ctx.kube, settings.namespace, settings.group, settings.shards,
                                                     lambda: 0 in shards.valid_until), name="corral-lease-sweep")
            sweeping.add(task)
            task.add_done_callback(sweeping.discard)

    def lost(s: int) -> None:
        """Nothing of the shard runs here any more: its deadline timers go, its batches' task followers stop, and
        what this replica kept in memory for its objects goes (Context.forget; with it, what it kept for objects
        gone from the cache, whose cleanup may have run on another replica)."""
        if ctx.queue is not None:
            ctx.queue.cancel_where(lambda key: shard_map.shard(key) == s)
        ctx.forget(in_shard(s))

    shards = Shards(settings=settings, me=me or f"corral-{os.getpid()}", kube=ctx.kube, shard_map=shard_map,
                    on_acquired=acquired, on_lost=lost)
    ctx.shards = shards
    shards.start()
    log.info("sharded mode: %d shards, leases in %s, this replica %s (claims API at %s)", settings.shards,
             settings.namespace, shards.me, settings.address or "unknown")
    return shards
