"""The operator's Kubernetes API access, every call counted by verb and resource.

The counters are how the tests prove the operator is quiet when nothing changes (no writes, no periodic reads) and
how the benchmark counts API writes per claim.

The reconcilers' verbs (create, get, merge patch, delete) go over aiohttp (the HTTP stack kopf's watches already
use): measured on the 2-core test bed, a request through lightkube's httpx stack costs ~2 ms of operator CPU against
~0.4 ms through aiohttp, and at 64 concurrent requests the httpx pool (20 keep-alive connections) re-handshakes TLS.
On a claim burst the operator is CPU-bound, so this is claim latency. lightkube's client stays for everything else
(`Kube.client`: lists, and any kubeconfig auth the fast path does not do, such as exec plugins). Errors are
lightkube's `ApiError` either way.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any, cast

import aiohttp
import httpx2  # lightkube's HTTP client
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import Status
from lightkube.operators import exists
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod, Secret, Service
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.types import CascadeType, PatchType

from . import metrics
from .constants import FIELD_MANAGER, GROUP, VERSION

SandboxTemplateRes = create_namespaced_resource(GROUP, VERSION, "SandboxTemplate", "sandboxtemplates")
SandboxRes = create_namespaced_resource(GROUP, VERSION, "Sandbox", "sandboxes")
WarmPoolRes = create_namespaced_resource(GROUP, VERSION, "WarmPool", "warmpools")
PoolRes = create_namespaced_resource(GROUP, VERSION, "Pool", "pools")
SandboxClaimRes = create_namespaced_resource(GROUP, VERSION, "SandboxClaim", "sandboxclaims")
SandboxBatchRes = create_namespaced_resource(GROUP, VERSION, "SandboxBatch", "sandboxbatches")

# lightkube's typed models (Pod, ...) and its generic, dict-like resources (Corral's kinds): the lightkube path below
# takes both by duck typing (from_dict or the constructor, to_dict or dict(), .Status), which its overloads cannot say.
RESOURCES: dict[str, Any] = {
    "SandboxTemplate": SandboxTemplateRes, "Sandbox": SandboxRes, "WarmPool": WarmPoolRes, "Pool": PoolRes,
    "SandboxClaim": SandboxClaimRes, "SandboxBatch": SandboxBatchRes, "Pod": Pod,
    "PersistentVolumeClaim": PersistentVolumeClaim,
    "Service": Service, "NetworkPolicy": NetworkPolicy, "Secret": Secret,
    "Lease": Lease,  # sharded mode's shard and member leases (corral.operator.shards)
}
WRITE_VERBS = {"create", "patch", "delete", "update"}


def status_code(exc: BaseException) -> int | None:
    return exc.status.code if isinstance(exc, ApiError) and exc.status else None


def _path(kind: str, namespace: str, name: str | None = None, sub: str = "") -> str:
    info = RESOURCES[kind]._api_info
    group, version = info.resource.group, info.resource.version
    prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
    return f"{prefix}/namespaces/{namespace}/{info.plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


class FastHttp:
    """The reconcilers' verbs over one aiohttp session (pooled keep-alive connections), JSON in and out."""

    def __init__(self, server: str, ssl_context: ssl.SSLContext | bool, token: str | None = None,
                 token_file: str | None = None, basic: tuple[str, str] | None = None, limit: int = 128) -> None:
        self.server = server.rstrip("/")
        self._ssl = ssl_context
        self._token, self._token_file, self._basic = token, token_file, basic
        self._limit = limit
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, kubeconfig: KubeConfig) -> FastHttp | None:
        """None when the kubeconfig needs auth this path does not do (lightkube then serves every call)."""
        config = kubeconfig.get()
        if config is None:
            return None
        user, cluster = config.user, config.cluster
        if user is None or user.exec or user.auth_provider:
            return None
        ctx: ssl.SSLContext | bool = verify_cluster(cluster, user, config.abs_file)
        if cluster.insecure:
            ctx = False
        basic = (user.username, user.password) if user.username and user.password else None
        return cls(cluster.server, ctx, token=user.token, token_file=user.token_file, basic=basic)

    def _auth(self, reread: bool = False) -> dict[str, str]:
        if self._token_file and (reread or not self._token):
            self._token = Path(self._token_file).read_text().strip()  # rotated by the kubelet: re-read on 401
        if self._token:
            return {"Authorization": f"Bearer {self._token.strip()}"}
        if self._basic:
            return {"Authorization": aiohttp.BasicAuth(*self._basic).encode()}
        return {}

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self._limit, keepalive_timeout=60),
                timeout=aiohttp.ClientTimeout(total=30), json_serialize=json.dumps)
        return self._session

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
                      params: dict[str, str] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body)
        with metrics.API_LATENCY.labels(verb=method.lower()).time():
            return await self._request(method, path, data, content_type, params)

    async def _request(self, method: str, path: str, data: str | None, content_type: str,
                       params: dict[str, str] | None) -> dict[str, Any]:
        for attempt in (0, 1):
            headers = {"Accept": "application/json", **self._auth(reread=attempt == 1)}
            if data is not None:
                headers["Content-Type"] = content_type
            async with self._sess().request(method, self.server + path, data=data, headers=headers,
                                            params=params) as resp:
                raw = await resp.read()
                if resp.status == 401 and attempt == 0 and self._token_file:
                    continue
                try:
                    payload = json.loads(raw) if raw else {}
                except ValueError:
                    payload = {}
                if resp.status >= 400:
                    if payload.get("kind") != "Status":
                        payload = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": resp.status,
                                   "message": raw.decode(errors="replace")[:500] or resp.reason}
                    raise ApiError(status=cast(Status, Status.from_dict(payload)))  # typed as its DictMixin base
                return payload
        raise AssertionError("unreachable")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class Kube:
    """Thin counted wrapper: dicts in, dicts out."""

    def __init__(self, client: AsyncClient, fast: FastHttp | None = None) -> None:
        self.client = client
        self.fast = fast

    @classmethod
    def from_env(cls, kubeconfig: str | None = None) -> Kube:
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else None
        client = AsyncClient(config=config, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(30))
        try:
            fast = FastHttp.from_kubeconfig(config or KubeConfig.from_env())
        except Exception:  # noqa: BLE001 - anything unusual in the config: lightkube serves every call
            fast = None
        return cls(client, fast)

    async def close(self) -> None:
        await self.client.close()
        if self.fast is not None:
            await self.fast.close()

    @staticmethod
    def _count(verb: str, kind: str, sub: str = "") -> None:
        metrics.API_REQUESTS.labels(verb=verb, resource=kind + (f"/{sub}" if sub else "")).inc()

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = obj["kind"]
        self._count("create", kind)
        if self.fast is not None:
            return await self.fast.request("POST", _path(kind, obj["metadata"]["namespace"]), obj,
                                           params={"fieldManager": FIELD_MANAGER})
        res = RESOURCES[kind]
        # lightkube's overload for namespaced resources omits the namespace= its implementation takes
        created = await self.client.create(  # type: ignore[call-overload]
            res.from_dict(obj) if hasattr(res, "from_dict") else res(obj), namespace=obj["metadata"].get("namespace"))
        return created.to_dict() if hasattr(created, "to_dict") else dict(created)

    async def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        self._count("get", kind)
        if self.fast is not None:
            return await self.fast.request("GET", _path(kind, namespace, name))
        obj = await self.client.get(RESOURCES[kind], name, namespace=namespace)
        return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)

    async def list_all(self, kind: str,
                       labels: dict[str, str | None] | None = None) -> tuple[list[dict[str, Any]], int]:
        """Every object of a kind in every namespace (labels: value, or None for "has the label"), and the
        collection's resourceVersion as a number (0 if not numeric). For the rare moments the watch-fed indices
        need checking against the server (a replica resuming from a peering pause), never in a loop."""
        self._count("list", kind)
        selector = ",".join(k if v is None else f"{k}={v}" for k, v in (labels or {}).items())
        if self.fast is not None:
            ns_path = _path(kind, "-")
            path = ns_path.replace("/namespaces/-", "")
            body = await self.fast.request("GET", path, params={"labelSelector": selector} if selector else None)
            rv = (body.get("metadata") or {}).get("resourceVersion", "")
            return list(body.get("items") or []), int(rv) if str(rv).isdigit() else 0
        items = [o.to_dict() if hasattr(o, "to_dict") else dict(o) async for o in
                 self.client.list(RESOURCES[kind], namespace="*", labels={
                     k: exists() if v is None else v for k, v in (labels or {}).items()} or None)]
        rvs = [int(rv) for o in items if str(rv := o["metadata"].get("resourceVersion", "")).isdigit()]
        return items, max(rvs, default=0)  # no collection version here: the newest item's (conservative)

    async def patch(self, kind: str, name: str, namespace: str, patch: dict[str, Any], *,
                    status: bool = False) -> dict[str, Any]:
        """JSON merge patch. Put metadata.resourceVersion in the patch to make it conditional (409 on change)."""
        self._count("patch", kind, "status" if status else "")
        if self.fast is not None:
            return await self.fast.request("PATCH", _path(kind, namespace, name, "status" if status else ""), patch,
                                           content_type="application/merge-patch+json",
                                           params={"fieldManager": FIELD_MANAGER})
        res = RESOURCES[kind]
        obj = await self.client.patch(res.Status if status else res, name, patch, namespace=namespace,
                                      patch_type=PatchType.MERGE)
        return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)

    async def delete(self, kind: str, name: str, namespace: str, *, uid: str | None = None,
                     resource_version: str | None = None, foreground: bool = False) -> None:
        """Delete, optionally only if the object still has this uid/resourceVersion (409 otherwise)."""
        self._count("delete", kind)
        res = RESOURCES[kind]
        cascade = CascadeType.FOREGROUND if foreground else CascadeType.BACKGROUND
        if self.fast is not None:
            preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
            await self.fast.request("DELETE", _path(kind, namespace, name), {
                "kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": cascade.value,
                **({"preconditions": preconditions} if preconditions else {})})
            return
        if uid is None and resource_version is None:
            await self.client.delete(res, name, namespace=namespace, cascade=cascade)
            return
        # lightkube's delete takes no preconditions; send DeleteOptions through its own HTTP client.
        generic = self.client._client  # noqa: SLF001 - documented fallback, see above
        br = generic.prepare_request("delete", res=res, name=name, namespace=namespace)
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions,
                "propagationPolicy": cascade.value}
        req = generic._client.build_request(br.method, br.url, params=br.params, json=body, headers=br.headers)  # noqa: SLF001
        resp = await generic.send(req)
        generic.raise_for_status(resp)


async def ignore(codes: set[int], coro: Any) -> Any:
    """Await coro; swallow ApiErrors with one of these status codes (return None)."""
    try:
        return await coro
    except ApiError as exc:
        if status_code(exc) in codes:
            return None
        raise
