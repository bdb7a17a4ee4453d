"""Helpers for kube-tier tests: Corral's resources for lightkube, object builders and polling."""

from __future__ import annotations

from typing import Any

from lightkube.generic_resource import create_namespaced_resource
from waiting import wait_until  # noqa: F401  (kube tests import it from here)

SandboxTemplate = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxTemplate", "sandboxtemplates")
Sandbox = create_namespaced_resource("corral.dev", "v1alpha1", "Sandbox", "sandboxes")
WarmPool = create_namespaced_resource("corral.dev", "v1alpha1", "WarmPool", "warmpools")
Pool = create_namespaced_resource("corral.dev", "v1alpha1", "Pool", "pools")
SandboxClaim = create_namespaced_resource("corral.dev", "v1alpha1", "SandboxClaim", "sandboxclaims")

TOKEN_SECRET = "corral-kube-tests"  # the operator's CORRAL_TOKEN_SECRET in this tier


def idle_token(ns: str, pod: str, pod_uid: str) -> str:
    """The token a sandbox pod's execd starts with (what its init container derives from the namespace key)."""
    from corral.operator.tokens import idle_token as derive

    return derive(TOKEN_SECRET.encode(), ns, pod, pod_uid)


def claim_token(kube, ns: str, sandbox: str, claim: str) -> str:
    """The token of claim `claim` on sandbox `sandbox`, as the operator derives it (from both uids)."""
    from corral.operator.tokens import claim_token as derive

    return derive(TOKEN_SECRET.encode(), ns, sandbox, kube.get(Sandbox, sandbox, namespace=ns).metadata.uid,
                  kube.get(SandboxClaim, claim, namespace=ns).metadata.uid)


POD_SPEC = {"containers": [{"name": "sandbox", "image": "corral/python:bookworm", "command": ["sleep", "infinity"]}]}


def template(name: str, *, env_policy: str = "Disallowed", memory: str = "128Mi", **spec: Any):
    pod = {"containers": [{**POD_SPEC["containers"][0],
                           "resources": {"limits": {"memory": memory}}}]}
    return SandboxTemplate.from_dict({"metadata": {"name": name}, "spec": {
        "podTemplate": {"spec": pod}, "envVarsInjectionPolicy": env_policy, **spec}})


def warm_pool(name: str, tpl: str, replicas: int, **spec: Any):
    return WarmPool.from_dict({"metadata": {"name": name},
                               "spec": {"replicas": replicas, "templateRef": {"name": tpl}, **spec}})


def pool(name: str, tpl: str, **spec: Any):
    return Pool.from_dict({"metadata": {"name": name}, "spec": {"templateRef": {"name": tpl}, **spec}})


def claim(name: str, pool_name: str, kind: str = "WarmPool", **spec: Any):
    return SandboxClaim.from_dict({"metadata": {"name": name},
                                   "spec": {"poolRef": {"kind": kind, "name": pool_name}, **spec}})


def status(obj: Any) -> dict[str, Any]:
    return dict(obj.get("status") or {}) if isinstance(obj, dict) else dict(obj.status or {})


def idle_ready(kube, ns: str, pool_name: str) -> list[Any]:
    out = []
    for s in kube.list(Sandbox, namespace=ns, labels={"corral.dev/pool": pool_name}):
        labels = s.metadata.labels or {}
        st = status(s)
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
        if "corral.dev/claim" not in labels and ready and not s.metadata.deletionTimestamp:
            out.append(s)
    return out


def claim_status(kube, ns: str, name: str) -> dict[str, Any] | None:
    """The claim's status, or None once it is gone."""
    from lightkube import ApiError

    try:
        return status(kube.get(SandboxClaim, name, namespace=ns))
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise


def bound(kube, ns: str, name: str) -> dict[str, Any] | None:
    st = claim_status(kube, ns, name)
    return st if st and st.get("phase") == "Bound" else None


def apply_crd(kube, crd: dict[str, Any]) -> bool:
    """Apply a CRD and wait until it is Established; one still being deleted (by an earlier test) is waited out
    first, or the new objects would vanish with it. True if the CRD did not exist before."""
    from lightkube import ApiError
    from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

    name = crd["metadata"]["name"]

    def current():
        try:
            return kube.get(CustomResourceDefinition, name)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise

    wait_until(lambda: (c := current()) is None or not c.metadata.deletionTimestamp, 120, 0.25,
               f"CRD {name} finished deleting")
    existed = current() is not None
    kube.apply(CustomResourceDefinition.from_dict(crd), force=True)
    kube.wait(CustomResourceDefinition, name, for_conditions=["Established"])
    return not existed



def get_or_none(kube, res, ns: str, name: str):
    """The object, or None once it is gone (404)."""
    from lightkube import ApiError

    try:
        return kube.get(res, name, namespace=ns)
    except ApiError as exc:
        if exc.status.code == 404:
            return None
        raise


def sandbox_or_none(kube, ns: str, name: str):
    """The Sandbox, or None once it is gone."""
    return get_or_none(kube, Sandbox, ns, name)
