"""SandboxTemplate: blueprint hash in status, and the per-template NetworkPolicy."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from corral.api import CorralValidationError, SandboxTemplateSpec, validate
from corral.api.template import SandboxTemplateStatus

from ..builders import blueprint_hash, network_policy, network_policy_name
from ..context import Context
from ..kube import status_code
from ..views import ObjectView, TemplateView, checked, status_patch
from .conditions import differs, set_condition

log = logging.getLogger("corral.operator.template")
SPEC_HASH = "corral.dev/spec-hash"


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(o.get("uid") == uid for o in ObjectView(obj).meta.get("ownerReferences") or [])


async def reconcile_template(ctx: Context, ns: str, name: str) -> None:
    body = ctx.cache.template(ns, name)
    if body is None:
        ctx.templates.template_gone(ns, name)
        return  # the NetworkPolicy goes with it (owner reference)
    template = TemplateView(body)
    if template.deleting:
        return
    gen, conditions = template.generation, template.conditions
    try:
        spec = validate(SandboxTemplateSpec, template.spec)
    except CorralValidationError as exc:
        desired = status_patch(SandboxTemplateStatus, observed_generation=gen,
                               conditions=set_condition(conditions, "Ready", False, "InvalidSpec", str(exc), gen))
        if differs(template.status, desired):
            await _write(ctx, ns, name, desired)
        return

    np_name, np_message = await _network_policy(ctx, template, spec)
    bp_hash = blueprint_hash(spec)
    ok = np_message is None
    desired = status_patch(
        SandboxTemplateStatus, blueprint_hash=bp_hash, observed_generation=gen, network_policy=np_name,
        conditions=set_condition(conditions, "Ready", ok, "Reconciled" if ok else "NetworkPolicyConflict",
                                 np_message or "", gen))
    if differs(template.status, desired):
        await _write(ctx, ns, name, desired)
    if template.blueprint_hash != bp_hash:
        for kind, pool in ctx.cache.pools_using_template(ns, name):
            ctx.request(kind, ns, pool)


async def _write(ctx: Context, ns: str, name: str, status: dict[str, Any]) -> None:
    await ctx.kube.patch("SandboxTemplate", name, ns, {"status": checked(SandboxTemplateStatus, status)}, status=True)


async def _network_policy(ctx: Context, template: TemplateView,
                          spec: SandboxTemplateSpec) -> tuple[str | None, str | None]:
    """Converge the template's NetworkPolicy; returns (name it manages or None, problem message or None).

    Only a NetworkPolicy owned by this template (owner reference with its uid) is ever changed or deleted; a foreign
    one with the same name is left alone and reported.
    """
    ns, name = template.namespace, network_policy_name(template.name)
    try:
        current = await ctx.kube.get("NetworkPolicy", name, ns)
    except Exception as exc:  # noqa: BLE001
        if status_code(exc) != 404:
            raise
        current = None
    if current is not None and not owned_by(current, template.uid):
        return None, f"NetworkPolicy {name} exists and is not Corral's; it is left untouched"
    if spec.network_policy_management == "Unmanaged":
        if current is not None:
            await ctx.kube.delete("NetworkPolicy", name, ns, uid=current["metadata"]["uid"])
        return None, None
    desired = network_policy(template.body, ctx.settings.namespace)
    # The server normalises specs (defaults), so compare a hash of what we asked for, kept in an annotation.
    digest = hashlib.sha256(json.dumps(desired["spec"], sort_keys=True).encode()).hexdigest()[:16]
    desired["metadata"]["annotations"] = {SPEC_HASH: digest}
    if current is None:
        await ctx.kube.create(desired)
    elif (current["metadata"].get("annotations") or {}).get(SPEC_HASH) != digest:
        await ctx.kube.patch("NetworkPolicy", name, ns,
                             {"metadata": {"labels": desired["metadata"]["labels"],
                                           "annotations": desired["metadata"]["annotations"],
                                           "resourceVersion": current["metadata"]["resourceVersion"]},
                              "spec": desired["spec"]})
    return name, None
