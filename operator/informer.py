"""The hot kinds' watch streams, without kopf: SandboxClaims, Sandboxes, and the Pods of Corral's sandboxes.

A warm claim is a handful of watch events (the claim's ADDED, its status echo, the adopted sandbox's label and status
echoes, the refill's sandbox and pod events). Through kopf each cost several ms of operator CPU (a per-object worker
task, body and patch wrappers, handler selection, per-handler kwargs), about a third of the operator's CPU in a
claim burst, and a claim's event waited behind the refill's. Here each kind has one `Informer`: its own HTTP stream
and task, events decoded by msgspec straight into Structs holding only the fields Corral reads (a Pod's spec and
a whole object's managedFields are skipped, never built), applied to a store, then reacted to (reconcile requests,
claims API wake-ups: `react_claim`, `react_sandbox`, `react_pod`, what kopf's on.event handlers did). kopf stays for
the other kinds (templates, pools, batches: few events), peering, probes, startup and cleanup.

How one kind is followed:
1. list, paged (LIST_PAGE objects a page, `continue`), then watch from the list's resourceVersion with bookmarks;
2. each event replaces the object's values in the store under the keys the Cache reads (cache.claim_keys,
   cache.sandbox_keys; a Pod's PodInfo under (namespace, its sandbox's name)): the values kopf's indices held, so the
   reconcilers do not change. Values are built fresh from each event's JSON: nothing is deep-copied;
3. the API server ends a watch after WATCH_TIMEOUT (600 s, as kopf's watches): it is re-opened from the last
   resourceVersion seen (bookmarks keep that fresh), so an idle operator makes one request per kind per 10 minutes;
   a stream silent for WATCH_TIMEOUT + WATCH_GRACE is dropped as dead and re-opened;
4. 410 Gone (the version is older than the server keeps): list again; what the store held that the new listing lacks
   gets a synthesized DELETED event (an object deleted while the stream was broken does not stay as a ghost);
5. any other error: reconnect after a backoff (0.5 s doubling to 30 s, reset by a stream that delivered events).
Every list page and watch opened is counted in corral_api_requests_total (verbs "list" and "watch").

The informers run from startup to cleanup whatever the replica's role: a standby keeps its store current (its work
queue is held meanwhile, see handlers._hold_or_resync), so on takeover only kopf's kinds need checking
(corral.operator.resync). `Cache.ready` needs every informer's initial listing applied, and kopf's indices filled.

Fairness: each stream is its own task, and a task yields to the event loop after every chunk it read, so a claim's
event never waits behind a refill's burst of sandbox and pod events for more than one chunk's work (the work per
event is a decode, a few dict updates and a queue add: tens of microseconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import aiohttp
import msgspec
from lightkube import ApiError
from lightkube.models.meta_v1 import Status

from . import metrics
from .cache import Cache, PodInfo, claim_keys, sandbox_keys
from .claimsapi import kube_server as claims_api
from .constants import GROUP, L_CLAIM, L_MANAGED_BY, L_POOL, L_POOL_KIND, L_SANDBOX, MANAGED_BY, VERSION
from .core.batches import parse_claim_label
from .kube import Kube

log = logging.getLogger("corral.operator.informer")

WATCH_TIMEOUT = 600  # seconds: the server ends each watch after this (kopf's watches use the same)
WATCH_GRACE = 60.0  # seconds past WATCH_TIMEOUT before a silent stream is given up as dead
LIST_PAGE = 500
BACKOFF_MIN, BACKOFF_MAX = 0.5, 30.0
_UNSET = msgspec.UNSET


# ---- wire shapes: only what Corral reads (everything else in the JSON is skipped by the decoder) ------------------

class Meta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    generateName: str | msgspec.UnsetType = _UNSET
    generation: int | msgspec.UnsetType = _UNSET
    creationTimestamp: str | None | msgspec.UnsetType = _UNSET
    deletionTimestamp: str | None | msgspec.UnsetType = _UNSET
    labels: dict[str, str] | None | msgspec.UnsetType = _UNSET
    annotations: dict[str, str] | None | msgspec.UnsetType = _UNSET
    ownerReferences: list[dict[str, Any]] | msgspec.UnsetType = _UNSET
    finalizers: list[str] | msgspec.UnsetType = _UNSET


_META_FIELDS = tuple(f for f in Meta.__struct_fields__)


class Obj(msgspec.Struct):
    """A custom resource (claim, sandbox) as a body dict's parts; `code` is set on an ERROR event's Status."""
    apiVersion: str = ""
    kind: str = ""
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: dict[str, Any] = {}
    status: dict[str, Any] | str = {}  # a string in an ERROR event's Status ("Failure")
    code: int = 0
    message: str = ""


class Condition(msgspec.Struct):
    type: str = ""
    status: str = ""


class PodIP(msgspec.Struct):
    ip: str = ""


class PodMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    deletionTimestamp: str | None = None
    labels: dict[str, str] = {}


class PodSpec(msgspec.Struct):
    nodeName: str | None = None


class PodStatus(msgspec.Struct):
    phase: str | None = None
    conditions: list[Condition] = []
    podIP: str | None = None
    podIPs: list[PodIP] = []
    message: str | None = None
    reason: str | None = None


class PodObj(msgspec.Struct):
    metadata: PodMeta = msgspec.field(default_factory=PodMeta)
    spec: PodSpec = msgspec.field(default_factory=PodSpec)
    status: PodStatus | str = msgspec.field(default_factory=PodStatus)  # a string in an ERROR event's Status
    code: int = 0
    message: str = ""


class ObjEvent(msgspec.Struct):
    type: str
    object: Obj


class PodEvent(msgspec.Struct):
    type: str
    object: PodObj


class ListMeta(msgspec.Struct):
    resourceVersion: str = ""
    continue_: str = msgspec.field(default="", name="continue")


class ObjList(msgspec.Struct):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[Obj] | None = None


class PodList(msgspec.Struct):
    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[PodObj] | None = None


def meta_dict(m: Meta) -> dict[str, Any]:
    """The metadata as a dict with the keys the JSON had (absent stays absent, as in the API's own bodies)."""
    out: dict[str, Any] = {}
    for f in _META_FIELDS:
        v = getattr(m, f)
        if v is not _UNSET:
            out[f] = v
    return out


def body_of(o: Obj, api_version: str, kind: str) -> dict[str, Any]:
    """The body the Cache serves (what kopf's indices held: apiVersion, kind, metadata, spec, status)."""
    return {"apiVersion": o.apiVersion or api_version, "kind": o.kind or kind, "metadata": meta_dict(o.metadata),
            "spec": o.spec, "status": o.status if isinstance(o.status, dict) else {}}


def pod_info(p: PodObj) -> PodInfo:
    m, s = p.metadata, p.status if isinstance(p.status, PodStatus) else PodStatus()
    ips = tuple(i.ip for i in s.podIPs if i.ip) or ((s.podIP,) if s.podIP else ())
    return PodInfo(name=m.name, namespace=m.namespace, uid=m.uid, phase=s.phase,
                   ready=any(c.type == "Ready" and c.status == "True" for c in s.conditions), pod_ips=ips,
                   node=p.spec.nodeName, deleting=bool(m.deletionTimestamp), message=s.message or s.reason,
                   resource_version=m.resourceVersion)


# ---- the store -------------------------------------------------------------------------------------------------

class Bucket:
    """The values under one key (what a kopf index gives for a key): iterating yields the values, one per object."""

    __slots__ = ("by_uid",)

    def __init__(self) -> None:
        self.by_uid: dict[str, Any] = {}

    def __iter__(self) -> Iterator[Any]:
        return iter(self.by_uid.values())

    def __len__(self) -> int:
        return len(self.by_uid)

    def __bool__(self) -> bool:
        return bool(self.by_uid)

    def __repr__(self) -> str:
        return repr(list(self.by_uid.values()))


class Store:
    """key -> Bucket (the mapping Cache reads), with each object's keys and last event object kept by uid, so an
    update moves only the keys that changed and a vanished object can be reported with its last state."""

    def __init__(self) -> None:
        self.index: dict[Any, Bucket] = {}
        self.objects: dict[str, tuple[tuple[Any, ...], Any]] = {}  # uid -> (its keys, its last event object)

    def put(self, uid: str, keys: dict[Any, Any], obj: Any) -> None:
        old = self.objects.get(uid)
        if old is not None:
            for key in old[0]:
                if key not in keys:
                    self._drop(key, uid)
        index = self.index
        for key, value in keys.items():
            bucket = index.get(key)
            if bucket is None:
                bucket = index[key] = Bucket()
            bucket.by_uid[uid] = value
        self.objects[uid] = (tuple(keys), obj)

    def remove(self, uid: str) -> Any:
        old = self.objects.pop(uid, None)
        if old is None:
            return None
        for key in old[0]:
            self._drop(key, uid)
        return old[1]

    def _drop(self, key: Any, uid: str) -> None:
        bucket = self.index.get(key)
        if bucket is not None:
            bucket.by_uid.pop(uid, None)
            if not bucket.by_uid:
                del self.index[key]


# ---- the kinds -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KindSpec:
    """How one kind is listed, decoded, keyed and reacted to."""

    kind: str  # Corral's name for it (metrics, reconcile keys)
    index: str  # the Cache's index name (cache.INDEX)
    path: str  # the cluster-wide collection
    selector: str  # label selector ("" for none)
    event_decoder: msgspec.json.Decoder[Any]
    list_decoder: msgspec.json.Decoder[Any]
    keys: Callable[[Any], tuple[str, dict[Any, Any]]]  # event object -> (uid, {key: value})
    react: Callable[[Any, str, Any], None]  # (context, event type, event object)


def _claim_keys(o: Obj) -> tuple[str, dict[Any, Any]]:
    m = o.metadata
    return m.uid, claim_keys(m.namespace, m.name, o.spec, body_of(o, f"{GROUP}/{VERSION}", "SandboxClaim"))


def _sandbox_keys(o: Obj) -> tuple[str, dict[Any, Any]]:
    m = o.metadata
    return m.uid, sandbox_keys(m.namespace, m.name, m.labels or {}, body_of(o, f"{GROUP}/{VERSION}", "Sandbox"))


def _pod_keys(p: PodObj) -> tuple[str, dict[Any, Any]]:
    m = p.metadata
    return m.uid, {(m.namespace, m.labels[L_SANDBOX]): pod_info(p)}


def react_claim(context: Any, event: str, o: Obj) -> None:
    """A claim changed: reconcile it, wake the claims API calls waiting on it; a deleted claim on a Pool frees room."""
    ns, name = o.metadata.namespace, o.metadata.name
    context.request("SandboxClaim", ns, name)
    claims_api.claim_event(ns, name)
    if event == "DELETED":
        ref = o.spec.get("poolRef") or {}
        if ref.get("kind") == "Pool":
            context.request("Pool", ns, ref.get("name", ""))


def react_sandbox(context: Any, event: str, o: Obj) -> None:
    """A sandbox changed: reconcile it, its pool, and what holds it (a claim, or a batch)."""
    ns, name, labels = o.metadata.namespace, o.metadata.name, o.metadata.labels or {}
    if event == "DELETED":  # on every replica: a claim token noted for it goes, whoever holds its shard now
        context.tokens.take(ns, name)
    context.request("Sandbox", ns, name)
    pool = labels.get(L_POOL)
    if pool:
        context.request(labels.get(L_POOL_KIND, "WarmPool"), ns, pool)
    claim = labels.get(L_CLAIM)
    if claim:
        context.claims.adoption_seen(ns, name)  # the cache now shows the adoption
        batch = parse_claim_label(claim)
        if batch is not None:
            context.request("SandboxBatch", ns, batch[0])
        else:
            context.request("SandboxClaim", ns, claim)


def react_pod(context: Any, event: str, p: PodObj) -> None:
    context.request("Sandbox", p.metadata.namespace, p.metadata.labels[L_SANDBOX])


_CR = f"/apis/{GROUP}/{VERSION}"
KINDS = (
    KindSpec("SandboxClaim", "claims_idx", f"{_CR}/sandboxclaims", "", msgspec.json.Decoder(ObjEvent),
             msgspec.json.Decoder(ObjList), _claim_keys, react_claim),
    KindSpec("Sandbox", "sandboxes_idx", f"{_CR}/sandboxes", "", msgspec.json.Decoder(ObjEvent),
             msgspec.json.Decoder(ObjList), _sandbox_keys, react_sandbox),
    KindSpec("Pod", "pods_idx", "/api/v1/pods", f"{L_SANDBOX},{L_MANAGED_BY}={MANAGED_BY}",
             msgspec.json.Decoder(PodEvent), msgspec.json.Decoder(PodList), _pod_keys, react_pod),
)


# ---- the transport: the reconcilers' aiohttp session (FastHttp), or lightkube's httpx client --------------------

class Gone(Exception):
    """410: the resourceVersion is older than the server keeps."""


def _api_error(code: int, raw: bytes) -> ApiError:
    try:
        payload = msgspec.json.decode(raw) if raw else {}
    except msgspec.DecodeError:
        payload = {}
    if not isinstance(payload, dict) or payload.get("kind") != "Status":
        payload = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                   "message": raw.decode(errors="replace")[:500]}
    return ApiError(status=cast(Status, Status.from_dict(payload)))  # typed as its DictMixin base


class Transport:
    """GET a page, or open a stream of bytes, with the operator's credentials and counters."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    @contextlib.asynccontextmanager
    async def open(self, kind: str, verb: str, path: str, params: dict[str, str],
                   read_timeout: float | None) -> AsyncIterator[AsyncIterator[bytes]]:
        self.kube._count(verb, kind)  # noqa: SLF001 - the same counter as every other operator call
        fast = self.kube.fast
        if fast is None:
            async with self._httpx(path, params, read_timeout) as chunks:
                yield chunks
            return
        timeout = aiohttp.ClientTimeout(total=None if verb == "watch" else 60, sock_connect=30,
                                        sock_read=read_timeout)
        for attempt in (0, 1):
            headers = {"Accept": "application/json", **fast._auth(reread=attempt == 1)}  # noqa: SLF001
            async with fast._sess().get(fast.server + path, params=params, headers=headers,  # noqa: SLF001
                                        timeout=timeout) as resp:
                if resp.status == 401 and attempt == 0 and fast._token_file:  # noqa: SLF001 - rotated token
                    continue
                if resp.status == 410:
                    raise Gone()
                if resp.status >= 400:
                    raise _api_error(resp.status, await resp.read())
                yield resp.content.iter_any()
                return

    @contextlib.asynccontextmanager
    async def _httpx(self, path: str, params: dict[str, str],
                     read_timeout: float | None) -> AsyncIterator[AsyncIterator[bytes]]:
        import httpx2

        client = self.kube.client._client._client  # noqa: SLF001 - lightkube's authenticated httpx client
        async with client.stream("GET", path, params=params,
                                 timeout=httpx2.Timeout(30, read=read_timeout)) as resp:
            if resp.status_code == 410:
                raise Gone()
            if resp.status_code >= 400:
                raise _api_error(resp.status_code, await resp.aread())
            yield resp.aiter_bytes()


# ---- one kind's informer ---------------------------------------------------------------------------------------

class Informer:
    def __init__(self, spec: KindSpec, context: Any, transport: Transport) -> None:
        self.spec = spec
        self.context = context
        self.transport = transport
        self.store = Store()
        self.rv = ""
        self.synced = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.reconnects = 0  # streams re-opened after an error (not after the server's timeout)
        self.relists = 0  # listings after the first (410)
        self._events = metrics.EVENTS.labels(kind=spec.kind)

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"corral-informer-{self.spec.kind}")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    # -- listing --
    async def _list(self) -> None:
        spec = self.spec
        params = {"limit": str(LIST_PAGE)}
        if spec.selector:
            params["labelSelector"] = spec.selector
        items: list[Any] = []
        while True:
            async with self.transport.open(spec.kind, "list", spec.path, params, 60) as chunks:
                raw = b"".join([c async for c in chunks])
            page = spec.list_decoder.decode(raw)
            items.extend(page.items or ())
            if not page.metadata.continue_:
                rv = page.metadata.resourceVersion
                break
            params = {**params, "continue": page.metadata.continue_}
        self.apply_listing(items)
        self.rv = rv

    def apply_listing(self, items: list[Any]) -> None:
        """A fresh listing replaces the store: each listed object as an ADDED/MODIFIED event, and each object the
        store held that the listing lacks as a synthesized DELETED (it went while nobody watched)."""
        seen: set[str] = set()
        for obj in items:
            uid = obj.metadata.uid
            seen.add(uid)
            self._apply("MODIFIED" if uid in self.store.objects else "ADDED", obj)
        for uid in [u for u in self.store.objects if u not in seen]:
            gone = self.store.remove(uid)
            self._react("DELETED", gone)

    # -- events --
    def _apply(self, event: str, obj: Any) -> None:
        if event == "DELETED":
            self.store.remove(obj.metadata.uid)
        else:
            uid, keys = self.spec.keys(obj)
            self.store.put(uid, keys, obj)
        self._react(event, obj)

    def _react(self, event: str, obj: Any) -> None:
        self._events.inc()
        try:
            self.spec.react(self.context, event, obj)
        except Exception:  # noqa: BLE001 - one bad object must not stop the stream
            log.exception("%s event of %s/%s: reacting failed", event, obj.metadata.namespace, obj.metadata.name)

    async def _watch(self) -> int:
        """One watch request from self.rv until the server ends it; returns the events it delivered."""
        spec = self.spec
        params = {"watch": "1", "resourceVersion": self.rv, "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(WATCH_TIMEOUT)}
        if spec.selector:
            params["labelSelector"] = spec.selector
        decode = spec.event_decoder.decode
        n = 0
        async with self.transport.open(spec.kind, "watch", spec.path, params, WATCH_TIMEOUT + WATCH_GRACE) as chunks:
            buf = b""
            async for chunk in chunks:
                buf = buf + chunk if buf else chunk
                start = 0
                while (end := buf.find(b"\n", start)) >= 0:
                    line = buf[start:end]
                    start = end + 1
                    if not line.strip():
                        continue
                    ev = decode(line)
                    obj = ev.object
                    kind = ev.type
                    if kind == "ERROR":
                        if obj.code == 410:
                            raise Gone()
                        raise _api_error(obj.code or 500, msgspec.json.encode({"message": obj.message}))
                    rv = obj.metadata.resourceVersion
                    if rv:
                        self.rv = rv
                    if kind == "BOOKMARK":
                        continue
                    n += 1
                    self._apply(kind, obj)
                buf = buf[start:]
                await asyncio.sleep(0)  # let the other streams (a claim's) and the workers in between chunks
        return n

    async def _run(self) -> None:
        backoff = BACKOFF_MIN
        need_list = not self.rv  # (a test may start it from a version of its own)
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                    if not self.synced.is_set():
                        self.synced.set()
                        self.context.cache.mark_synced(self.spec.index)
                        log.info("%s: %d objects listed", self.spec.kind, len(self.store.objects))
                t0 = time.monotonic()
                delivered = await self._watch()
                if delivered or time.monotonic() - t0 > BACKOFF_MAX:
                    backoff = BACKOFF_MIN  # a healthy stream (the server's timeout ends it): re-open at once
                    continue
                # it ended early and empty: not a healthy stream, so not at once (no busy loop)
                raise ConnectionResetError("watch ended without events")
            except asyncio.CancelledError:
                raise
            except Gone:
                log.info("%s: resourceVersion %s is gone (410): listing again", self.spec.kind, self.rv)
                self.relists += 1
                need_list = True
                continue
            except Exception as exc:  # noqa: BLE001 - reconnect after a backoff
                self.reconnects += 1
                delay = backoff * (0.8 + 0.4 * random.random())
                log.warning("%s: watch failed (%s: %s); again in %.1fs", self.spec.kind, type(exc).__name__,
                            exc, delay)
                await asyncio.sleep(delay)
                backoff = min(BACKOFF_MAX, backoff * 2)


class Informers:
    """The three hot kinds' informers, started with the operator (handlers.startup) and stopped at cleanup."""

    def __init__(self, context: Any) -> None:
        transport = Transport(context.kube)
        cache: Cache = context.cache
        self.by_kind = {spec.kind: Informer(spec, context, transport) for spec in KINDS}
        for informer in self.by_kind.values():
            cache.attach(informer.spec.index, informer.store.index)

    def start(self) -> None:
        for informer in self.by_kind.values():
            informer.start()

    async def stop(self) -> None:
        await asyncio.gather(*(i.stop() for i in self.by_kind.values()))
