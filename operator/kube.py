"""The operator's Kubernetes API access: lightkube's async client, every call counted by verb and resource.

The counters are how the tests prove the operator is quiet when nothing changes (no writes, no periodic reads) and
how the benchmark counts API writes per claim.
"""

from __future__ import annotations

from typing import Any

from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import PersistentVolumeClaim, Pod, Service
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.types import CascadeType, PatchType

from . import metrics
from .constants import FIELD_MANAGER, GROUP, VERSION

SandboxTemplateRes = create_namespaced_resource(GROUP, VERSION, "SandboxTemplate", "sandboxtemplates")
SandboxRes = create_namespaced_resource(GROUP, VERSION, "Sandbox", "sandboxes")
WarmPoolRes = create_namespaced_resource(GROUP, VERSION, "WarmPool", "warmpools")
PoolRes = create_namespaced_resource(GROUP, VERSION, "Pool", "pools")
SandboxClaimRes = create_namespaced_resource(GROUP, VERSION, "SandboxClaim", "sandboxclaims")

RESOURCES = {
    "SandboxTemplate": SandboxTemplateRes, "Sandbox": SandboxRes, "WarmPool": WarmPoolRes, "Pool": PoolRes,
    "SandboxClaim": SandboxClaimRes, "Pod": Pod, "PersistentVolumeClaim": PersistentVolumeClaim,
    "Service": Service, "NetworkPolicy": NetworkPolicy,
}
WRITE_VERBS = {"create", "patch", "delete", "update"}


def status_code(exc: BaseException) -> int | None:
    return exc.status.code if isinstance(exc, ApiError) and exc.status else None


class Kube:
    """Thin counted wrapper: dicts in, dicts out."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    @classmethod
    def from_env(cls, kubeconfig: str | None = None) -> "Kube":
        config = KubeConfig.from_file(kubeconfig) if kubeconfig else None
        return cls(AsyncClient(config=config, field_manager=FIELD_MANAGER, timeout=30))

    async def close(self) -> None:
        await self.client.close()

    @staticmethod
    def _count(verb: str, kind: str, sub: str = "") -> None:
        metrics.API_REQUESTS.labels(verb=verb, resource=kind + (f"/{sub}" if sub else "")).inc()

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = obj["kind"]
        self._count("create", kind)
        res = RESOURCES[kind]
        created = await self.client.create(res.from_dict(obj) if hasattr(res, "from_dict") else res(obj),
                                           namespace=obj["metadata"].get("namespace"))
        return created.to_dict() if hasattr(created, "to_dict") else dict(created)

    async def get(self, kind: str, name: str, namespace: str) -> dict[str, Any]:
        self._count("get", kind)
        obj = await self.client.get(RESOURCES[kind], name, namespace=namespace)
        return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)

    async def patch(self, kind: str, name: str, namespace: str, patch: dict[str, Any], *,
                    status: bool = False) -> dict[str, Any]:
        """JSON merge patch. Put metadata.resourceVersion in the patch to make it conditional (409 on change)."""
        self._count("patch", kind, "status" if status else "")
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
