"""Pure builders: Kubernetes manifests from Corral objects. No I/O, no Pulumi, no kopf: plain dicts in and out."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from corral.api import SandboxBlueprint
from corral.api.template import SandboxTemplateSpec
from corral.execd.inject import k8s_init_container, k8s_key_secret, wrap_entrypoint
from corral.execd.wire import HEALTH_PATH
from corral.execd.wire import PORT as EXECD_PORT

from .constants import (
    A_RETAINED_AT,
    A_RETAINED_FROM,
    A_RETAINED_POOL,
    API_VERSION,
    L_CLAIM,
    L_COMPONENT,
    L_HASH,
    L_MANAGED_BY,
    L_POOL,
    L_POOL_KIND,
    L_RETAINED,
    L_SANDBOX,
    L_TEMPLATE,
    MANAGED_BY,
    OPERATOR_APP_LABEL,
)

PRIVATE_V4 = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"]
PRIVATE_V6 = ["fc00::/7", "fe80::/10"]
SANDBOX_UID = 1000


BLUEPRINT_KEYS = ("podTemplate", "volumeClaimTemplates", "service", "execd")


def blueprint_hash(blueprint: SandboxBlueprint | dict[str, Any]) -> str:
    """Stable hash of a whole blueprint (pod template, volumes, service, execd), defaults applied; policy fields of a
    template don't count, so changing a policy never makes sandboxes stale."""
    data = blueprint.to_k8s() if isinstance(blueprint, SandboxBlueprint) else blueprint
    normalized = SandboxBlueprint.model_validate({k: v for k, v in data.items() if k in BLUEPRINT_KEYS}).to_k8s()
    return hashlib.sha256(json.dumps(normalized, sort_keys=True).encode()).hexdigest()[:16]


def owner_ref(obj: dict[str, Any], controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": obj.get("apiVersion", API_VERSION),
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def sandbox_labels(template: str, pool: str | None = None, pool_kind: str | None = None,
                   claim: str | None = None, bp_hash: str | None = None) -> dict[str, str]:
    labels = {L_MANAGED_BY: MANAGED_BY, L_TEMPLATE: template}
    if pool:
        labels[L_POOL] = pool
        labels[L_POOL_KIND] = pool_kind or "WarmPool"
    if claim:
        labels[L_CLAIM] = claim
    if bp_hash:
        labels[L_HASH] = bp_hash
    return labels


def retain_patch(claim: str, pool: str | None, at: str) -> dict[str, Any]:
    """The merge patch that detaches a sandbox from its ended claim (shutdownPolicy Retain): no owner (nothing
    garbage-collects it), no claim or pool labels (no pool counts it, no claim finds it), and marked retained, with
    the claim, its pool and the time it ended, so the claims API can list it and delete it."""
    annotations = {A_RETAINED_FROM: claim, A_RETAINED_AT: at}
    if pool:
        annotations[A_RETAINED_POOL] = pool
    return {"metadata": {"ownerReferences": [], "annotations": annotations,
                         "labels": {L_CLAIM: None, L_POOL: None, L_POOL_KIND: None, L_RETAINED: "true"}}}


def is_retained(body: dict[str, Any]) -> bool:
    """A Sandbox kept after its claim ended: marked by retain_patch, or (retained before the mark existed) one the
    operator made that has no owner, no pool and no claim, which only the Retain path leaves."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(L_RETAINED) == "true":
        return True
    return labels.get(L_MANAGED_BY) == MANAGED_BY and not meta.get("ownerReferences") \
        and not labels.get(L_POOL) and not labels.get(L_CLAIM)


def sandbox_manifest(
    *,
    name: str | None,
    generate_name: str | None = None,
    namespace: str,
    template_name: str,
    blueprint: dict[str, Any],
    labels: dict[str, str],
    owner: dict[str, Any] | None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Sandbox object carrying a copy of the template's blueprint."""
    meta: dict[str, Any] = {"namespace": namespace, "labels": labels}
    if name:
        meta["name"] = name
    else:
        meta["generateName"] = generate_name
    if owner:
        meta["ownerReferences"] = [owner]
    if annotations:
        meta["annotations"] = annotations
    spec = {k: copy.deepcopy(v) for k, v in blueprint.items() if k in BLUEPRINT_KEYS}
    spec["templateRef"] = {"name": template_name}
    return {"apiVersion": API_VERSION, "kind": "Sandbox", "metadata": meta, "spec": spec}


def _secure_container(container: dict[str, Any]) -> dict[str, Any]:
    sc = container.setdefault("securityContext", {})
    sc.setdefault("allowPrivilegeEscalation", False)
    caps = sc.setdefault("capabilities", {})
    caps.setdefault("drop", ["ALL"])
    return container


def pod_manifest(
    sandbox: dict[str, Any],
    *,
    execd_image: str,
    key_secret: str,
    extra_labels: dict[str, str] | None = None,
    extra_annotations: dict[str, str] | None = None,
    env: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The pod of a Sandbox: its pod template with execd injected and Corral's secure defaults applied.

    execd is copied by an init container into an emptyDir and started in the main container in front of the
    original command (corral.execd.inject), so commands run in the sandbox's own filesystem. Its health
    endpoint (corral.execd.wire.HEALTH_PATH, no token) is the readiness probe. execd's first (idle) token is derived
    by the init container from the namespace's key Secret `key_secret`, mounted into the init container alone, and
    the pod's identity, then handed over in a memory-backed file execd deletes once read: no token in the pod spec or
    any environment (inject.k8s_key_secret, corral.operator.tokens). Secure defaults (each overridable by the
    template): no service-account token, non-root (uid 1000), seccomp RuntimeDefault, no privilege escalation, all
    capabilities dropped.
    """
    meta = sandbox["metadata"]
    spec = sandbox["spec"]
    template = copy.deepcopy(spec["podTemplate"])
    pod_spec: dict[str, Any] = template["spec"]
    execd = spec.get("execd") or {}
    port = int(execd.get("port", EXECD_PORT))
    resources = execd.get("resources") or {}

    labels = {**template.get("metadata", {}).get("labels", {}), **(extra_labels or {})}
    for key in (L_TEMPLATE, L_POOL, L_POOL_KIND, L_CLAIM, L_HASH, L_MANAGED_BY):
        if key in meta.get("labels", {}):
            labels[key] = meta["labels"][key]
    labels[L_SANDBOX] = meta["name"]
    labels[L_COMPONENT] = "sandbox"
    annotations = {**template.get("metadata", {}).get("annotations", {}), **(extra_annotations or {})}

    pod_spec.setdefault("automountServiceAccountToken", False)
    pod_spec.setdefault("enableServiceLinks", False)
    psc = pod_spec.setdefault("securityContext", {})
    psc.setdefault("runAsNonRoot", True)
    psc.setdefault("runAsUser", SANDBOX_UID)
    psc.setdefault("runAsGroup", SANDBOX_UID)
    psc.setdefault("fsGroup", SANDBOX_UID)
    psc.setdefault("seccompProfile", {"type": "RuntimeDefault"})

    init, volume, mount, execd_env = k8s_init_container(execd_image, port=port, resources=resources or None)
    token_volumes, token_mount = k8s_key_secret(init, execd_env, key_secret)  # the key: the init container's alone
    volumes = pod_spec.setdefault("volumes", [])
    volumes.extend([volume, *token_volumes])
    for vct in spec.get("volumeClaimTemplates") or []:
        volumes.append({"name": vct["name"], "persistentVolumeClaim": {"claimName": f"{meta['name']}-{vct['name']}"}})
    pod_spec.setdefault("initContainers", []).insert(0, init)

    main = pod_spec["containers"][0]
    original = list(main.get("command") or []) + list(main.get("args") or [])
    main["command"] = wrap_entrypoint(original or ["sleep", "infinity"])
    main.pop("args", None)
    main.setdefault("volumeMounts", []).extend([mount, token_mount])
    for vct in spec.get("volumeClaimTemplates") or []:
        mounts = main["volumeMounts"]
        if not any(m.get("name") == vct["name"] for m in mounts):
            mounts.append({"name": vct["name"], "mountPath": f"/mnt/{vct['name']}"})
    injected = [*execd_env, {"name": "CORRAL_SANDBOX", "value": meta["name"]}]
    if env:
        names = {e["name"] for e in env}
        main["env"] = [e for e in main.get("env", []) if e["name"] not in names] + list(env)
    main["env"] = [*main.get("env", []), *injected]
    ports = main.setdefault("ports", [])
    if not any(p.get("containerPort") == port for p in ports):
        ports.append({"name": "execd", "containerPort": port, "protocol": "TCP"})
    main.setdefault("readinessProbe", {
        "httpGet": {"path": HEALTH_PATH, "port": port},
        "periodSeconds": 2, "failureThreshold": 3, "timeoutSeconds": 1,
    })
    for c in pod_spec["containers"]:
        _secure_container(c)

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_ref(sandbox)],
        },
        "spec": pod_spec,
    }


def pvc_manifests(sandbox: dict[str, Any]) -> list[dict[str, Any]]:
    meta = sandbox["metadata"]
    out = []
    for vct in sandbox["spec"].get("volumeClaimTemplates") or []:
        out.append({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": f"{meta['name']}-{vct['name']}",
                "namespace": meta["namespace"],
                "labels": {**(vct.get("metadata") or {}).get("labels", {}), L_SANDBOX: meta["name"]},
                "ownerReferences": [owner_ref(sandbox)],
            },
            "spec": copy.deepcopy(vct["spec"]),
        })
    return out


def service_manifest(sandbox: dict[str, Any]) -> dict[str, Any] | None:
    svc = sandbox["spec"].get("service")
    if not svc:
        return None
    meta = sandbox["metadata"]
    spec: dict[str, Any] = {
        "selector": {L_SANDBOX: meta["name"]},
        "ports": [{"name": p["name"], "port": p["port"], "targetPort": p.get("targetPort", p["port"]),
                   "protocol": p.get("protocol", "TCP")} for p in svc["ports"]],
    }
    if svc.get("headless", True):
        spec["clusterIP"] = "None"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": {L_SANDBOX: meta["name"]},
                         "ownerReferences": [owner_ref(sandbox)]},
            "spec": spec}


def network_policy_name(template: str) -> str:
    return f"corral-sbxt-{template}"[:253]


def network_policy(template: dict[str, Any], operator_namespace: str) -> dict[str, Any]:
    """The template's managed NetworkPolicy: the secure default, or the template's custom rules; either way the pod
    selector is forced to the template's sandboxes.

    Default: ingress only from the operator's pods (which also proxy for clients) to execd's port; egress to any
    address except the private, link-local and ULA ranges (so no cluster-internal or cloud metadata traffic); with
    `dns: Allowed` also to the cluster DNS (kube-system pods labelled k8s-app=kube-dns) on port 53.
    """
    meta = template["metadata"]
    spec = SandboxTemplateSpec.model_validate(template["spec"])
    selector = {"matchLabels": {L_TEMPLATE: meta["name"]}}
    if spec.network_policy is not None:
        ingress = copy.deepcopy(spec.network_policy.ingress)
        egress = copy.deepcopy(spec.network_policy.egress)
    else:
        ingress = [{
            "from": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": operator_namespace}},
                "podSelector": {"matchLabels": dict(OPERATOR_APP_LABEL)},
            }],
            "ports": [{"protocol": "TCP", "port": spec.execd.port}],
        }]
        egress = [{"to": [
            {"ipBlock": {"cidr": "0.0.0.0/0", "except": list(PRIVATE_V4)}},
            {"ipBlock": {"cidr": "::/0", "except": list(PRIVATE_V6)}},
        ]}]
        if spec.dns == "Allowed":
            egress.append({
                "to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                        "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
            })
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {L_MANAGED_BY: MANAGED_BY, L_TEMPLATE: meta["name"]},
            "ownerReferences": [owner_ref(template)],
        },
        "spec": {"podSelector": selector, "policyTypes": ["Ingress", "Egress"], "ingress": ingress, "egress": egress},
    }
