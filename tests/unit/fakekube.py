"""An in-memory Kubernetes API for the reconcilers' unit tests: the verbs of `corral.operator.kube.Kube` they call,
with the API server's rules that the operator's correctness rests on, and a way to break it.

What it keeps of a real API server: resourceVersions (one counter for everything, bumped by each write), a merge
patch or a delete made conditional by a resourceVersion (or uid) answers 409 once the object changed, creates answer
409 for a taken name and honour `generateName`, status writes go through the status subresource only, deleting an
object deletes what it owns (garbage collection by ownerReferences), and a namespace being deleted refuses creates
with 403. Every call is recorded (`calls`), and `fail()` / `before()` inject faults and concurrent writers.

What stands in for kopf: each `Operator` has its own watch-fed indices, refreshed only when the test says so
(`Operator.sync()`), so a test decides exactly how stale each operator's view of the cluster is.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from corral.operator.cache import INDEX, Cache, PodInfo, claim_keys, sandbox_keys
from corral.operator.constants import L_CLAIM, L_MANAGED_BY, L_SANDBOX, MANAGED_BY
from corral.operator.context import Context, Settings

Key = tuple[str, str, str]  # (kind, namespace, name)


def api_error(code: int, message: str) -> ApiError:
    return ApiError(status=Status.from_dict({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                             "code": code, "message": message}))


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386: null deletes, objects merge, everything else (lists too) replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        elif isinstance(value, dict):
            target[key] = {}
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@dataclass
class Call:
    verb: str
    kind: str
    namespace: str
    name: str
    sub: str = ""
    body: Any = None
    code: int | None = None  # the error status it got (None: it succeeded or is still running)


@dataclass
class Fault:
    verb: str
    kind: str
    name: str | None
    code: int
    message: str
    times: int


class FakeKube:
    """Dicts in, dicts out, like `corral.operator.kube.Kube`."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.calls: list[Call] = []
        self.terminating: set[str] = set()  # namespaces being deleted: creates there answer 403
        self._rv = itertools.count(1)
        self._uid = itertools.count(1)
        self._faults: list[Fault] = []
        self._hooks: list[tuple[str, str, Callable[[Call], Awaitable[None] | None]]] = []

    # ---- test controls ---------------------------------------------------------------------------------------
    def fail(self, verb: str, kind: str, code: int, *, name: str | None = None, message: str = "injected",
             times: int = 1) -> None:
        """The next `times` calls of verb on kind (and name, if given) answer `code`."""
        self._faults.append(Fault(verb, kind, name, code, message, times))

    def before(self, verb: str, kind: str, hook: Callable[[Call], Awaitable[None] | None]) -> None:
        """Run hook(call) before each call of verb on kind: another writer acting at that moment."""
        self._hooks.append((verb, kind, hook))

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as if someone else had made it (not recorded as a call). Returns the stored copy."""
        return self._store(copy.deepcopy(obj))

    def edit(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> None:
        """Someone else merge-patches an object (not recorded, no hooks): its resourceVersion moves on."""
        obj = self.objects[(kind, namespace, name)]
        merge_patch(obj, patch)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))

    def remove(self, kind: str, namespace: str, name: str) -> None:
        """Someone else deletes an object (not recorded); its dependents go with it."""
        self._remove((kind, namespace, name))

    def find(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        obj = self.objects.get((kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def of_kind(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items())
                if k == kind and namespace in (None, ns)]

    def made(self, verb: str, kind: str | None = None, *, sub: str | None = None, ok: bool | None = None) -> list[Call]:
        """The recorded calls of verb (on kind; on that subresource; that succeeded (ok) or failed (not ok))."""
        return [c for c in self.calls if c.verb == verb and kind in (None, c.kind) and sub in (None, c.sub)
                and (ok is None or (c.code is None) == ok)]

    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.verb in ("create", "patch", "delete")]

    def reset_calls(self) -> None:
        self.calls.clear()

    # ---- the API ------------------------------------------------------------------------------------------------
    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        call = await self._enter("create", obj["kind"], meta["namespace"], meta.get("name") or meta["generateName"],
                                 body=obj)
        if meta["namespace"] in self.terminating:
            self._raise(call, 403, f'{obj["kind"].lower()}s "{call.name}" is forbidden: unable to create new '
                                   f'content in namespace {meta["namespace"]} because it is being terminated')
        obj = copy.deepcopy(obj)
        if not obj["metadata"].get("name"):
            obj["metadata"]["name"] = f"{meta['generateName']}{next(self._uid):05x}"
        elif (obj["kind"], meta["namespace"], meta["name"]) in self.objects:
            self._raise(call, 409, f'{obj["kind"]} "{meta["name"]}" already exists')
        return copy.deepcopy(self._store(obj))

    async def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        call = await self._enter("get", kind, namespace, name)
        return copy.deepcopy(self._existing(call))

    async def list_all(self, kind: str,
                       labels: dict[str, str | None] | None = None) -> tuple[list[dict[str, Any]], int]:
        await self._enter("list", kind, "", "")
        items = [o for o in self.of_kind(kind) if all(
            k in (o["metadata"].get("labels") or {}) and (v is None or o["metadata"]["labels"][k] == v)
            for k, v in (labels or {}).items())]
        return items, max((int(o["metadata"]["resourceVersion"]) for o in self.objects.values()), default=0)

    async def patch(self, kind: str, name: str, namespace: str, patch: dict[str, Any], *,
                    status: bool = False) -> dict[str, Any]:
        call = await self._enter("patch", kind, namespace, name, "status" if status else "", patch)
        obj = self._existing(call)
        want_rv = (patch.get("metadata") or {}).get("resourceVersion")
        if want_rv is not None and want_rv != obj["metadata"]["resourceVersion"]:
            self._raise(call, 409, f"Operation cannot be fulfilled on {kind} {name!r}: the object has been modified")
        if status:
            merge_patch(obj, {"status": patch.get("status")} if "status" in patch else {})
        else:
            merge_patch(obj, {k: v for k, v in patch.items() if k != "status"})
            if "spec" in patch:
                obj["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        return copy.deepcopy(obj)

    async def delete(self, kind: str, name: str, namespace: str, *, uid: str | None = None,
                     resource_version: str | None = None, foreground: bool = False) -> None:
        call = await self._enter("delete", kind, namespace, name,
                                 body={"uid": uid, "resourceVersion": resource_version, "foreground": foreground})
        obj = self._existing(call)
        if (uid and uid != obj["metadata"]["uid"]) or (
                resource_version and resource_version != obj["metadata"]["resourceVersion"]):
            self._raise(call, 409, f"Precondition failed for {kind} {name!r}")
        self._remove((kind, namespace, name))

    async def close(self) -> None:
        pass

    # ---- internals ----------------------------------------------------------------------------------------------
    async def _enter(self, verb: str, kind: str, namespace: str, name: str, sub: str = "", body: Any = None) -> Call:
        await asyncio.sleep(0)  # a round trip: concurrent reconciles interleave here, as they do on a real server
        call = Call(verb, kind, namespace, name, sub, copy.deepcopy(body))
        self.calls.append(call)
        for hverb, hkind, hook in list(self._hooks):
            if (hverb, hkind) == (verb, kind):
                result = hook(call)
                if result is not None:
                    await result
        for fault in self._faults:
            if fault.times > 0 and (fault.verb, fault.kind) == (verb, kind) and fault.name in (None, name):
                fault.times -= 1
                self._raise(call, fault.code, fault.message)
        return call

    def _raise(self, call: Call, code: int, message: str) -> None:
        call.code = code
        raise api_error(code, message)

    def _existing(self, call: Call) -> dict[str, Any]:
        obj = self.objects.get((call.kind, call.namespace, call.name))
        if obj is None:
            self._raise(call, 404, f'{call.kind} "{call.name}" not found')
        assert obj is not None
        return obj

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        meta.setdefault("uid", f"uid-{next(self._uid):04d}")
        meta.setdefault("creationTimestamp", iso(time.time()))
        meta.setdefault("generation", 1)
        meta["resourceVersion"] = str(next(self._rv))
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return obj

    def _remove(self, key: Key) -> None:
        obj = self.objects.pop(key, None)
        if obj is None:
            return
        uid = obj["metadata"]["uid"]
        for other_key, other in list(self.objects.items()):
            refs = other["metadata"].get("ownerReferences") or []
            if any(r.get("uid") == uid for r in refs) and other_key[1] == key[1]:
                rest = [r for r in refs if r.get("uid") != uid]
                other["metadata"]["ownerReferences"] = rest
                if not rest:
                    self._remove(other_key)


class RecordingQueue:
    """The WorkQueue's interface, recording what the reconcilers ask for instead of running it."""

    def __init__(self) -> None:
        self.added: list[Key] = []
        self.timers: dict[Key, float] = {}

    def add(self, key: Key) -> None:
        self.added.append(key)

    def add_at(self, key: Key, when: float) -> None:
        self.timers[key] = min(when, self.timers.get(key, when))

    def cancel_at(self, key: Key) -> None:
        self.timers.pop(key, None)

    def cancel_where(self, pred: Callable[[Key], bool]) -> int:
        keys = [k for k in self.timers if pred(k)]
        for k in keys:
            del self.timers[k]
        return len(keys)


@dataclass
class Operator:
    """One operator process against the fake: a real Context and Cache, fed by its own indices."""

    kube: FakeKube
    settings: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.stores: dict[str, dict[Any, list[Any]]] = {name: {} for name in INDEX.values()}
        self.queue = RecordingQueue()
        self.ctx = Context(settings=Settings(**self.settings), kube=self.kube, cache=Cache(),  # type: ignore[arg-type]
                           queue=self.queue)  # type: ignore[arg-type]
        self.ctx.cache.bind(self.stores)
        self.sync()

    def sync(self) -> None:
        """The watch catches up: every index shows the objects as they are now (what kopf's index handlers would
        store, see corral.operator.handlers), and adoptions the cache now shows are no longer reserved."""
        for store in self.stores.values():
            store.clear()
        for (kind, ns, name), obj in sorted(self.kube.objects.items()):
            body = copy.deepcopy(obj)
            labels = body["metadata"].get("labels") or {}
            if kind in ("SandboxTemplate", "WarmPool", "Pool", "SandboxBatch"):
                keys: dict[Any, Any] = {(ns, name): body}
            elif kind == "SandboxClaim":
                keys = claim_keys(ns, name, body.get("spec") or {}, body)
            elif kind == "Sandbox":
                keys = sandbox_keys(ns, name, labels, body)
                if labels.get(L_CLAIM):
                    self.ctx.claims.adoption_seen(ns, name)
            elif kind == "Pod" and L_SANDBOX in labels and labels.get(L_MANAGED_BY) == MANAGED_BY:
                keys = {(ns, labels[L_SANDBOX]): PodInfo.of(body)}
            else:
                continue
            store = self.stores[INDEX[kind]]
            for key, value in keys.items():
                store.setdefault(key, []).append(value)
