"""Template: the managed default NetworkPolicy, Unmanaged removal, and foreign policies left alone."""

import pytest
from kubeutil import SandboxTemplate, get_or_none, status, template, wait_until
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.types import PatchType

pytestmark = pytest.mark.kube


def get_np(kube, ns, name):
    return get_or_none(kube, NetworkPolicy, ns, name)


def test_managed_default_policy_then_unmanaged(kube, operator, ns):
    kube.create(template("py"), namespace=ns)
    np = wait_until(lambda: get_np(kube, ns, "corral-sbxt-py"), 30, what="managed NetworkPolicy")
    spec = np.spec
    assert spec.podSelector.matchLabels == {"corral.dev/template": "py"}
    assert sorted(spec.policyTypes) == ["Egress", "Ingress"]
    blocks = [peer.ipBlock for rule in spec.egress for peer in (rule.to or []) if peer.ipBlock]
    assert {(b.cidr, tuple(b.except_)) for b in blocks} == {
        ("0.0.0.0/0", ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16")),
        ("::/0", ("fc00::/7", "fe80::/10")),
    }
    (ingress,) = spec.ingress
    assert ingress.from_[0].podSelector.matchLabels == {"app.kubernetes.io/name": "corral-operator"}
    assert ingress.from_[0].namespaceSelector.matchLabels == {"kubernetes.io/metadata.name": "corral-system"}
    assert [(p.protocol, p.port) for p in ingress.ports] == [("TCP", 44772)]
    tpl = wait_until(lambda: status(kube.get(SandboxTemplate, "py", namespace=ns)).get("blueprintHash"), 30)
    assert len(tpl) == 16

    kube.patch(SandboxTemplate, "py", {"spec": {"networkPolicyManagement": "Unmanaged"}}, namespace=ns,
               patch_type=PatchType.MERGE)
    wait_until(lambda: get_np(kube, ns, "corral-sbxt-py") is None, 30, what="NetworkPolicy removed")


def test_foreign_policies_are_never_touched(kube, operator, ns):
    labels = {"app.kubernetes.io/managed-by": "corral-operator", "corral.dev/template": "py"}
    foreign_same_name = NetworkPolicy.from_dict({"metadata": {"name": "corral-sbxt-py", "labels": labels},
                                                 "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})
    foreign_same_labels = NetworkPolicy.from_dict({"metadata": {"name": "team-policy", "labels": labels},
                                                   "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})
    kube.create(foreign_same_name, namespace=ns)
    kube.create(foreign_same_labels, namespace=ns)
    before = {n: get_np(kube, ns, n).metadata.resourceVersion for n in ("corral-sbxt-py", "team-policy")}
    kube.create(template("py"), namespace=ns)
    cond = wait_until(lambda: [c for c in status(kube.get(SandboxTemplate, "py", namespace=ns)).get("conditions") or []
                               if c.get("reason") == "NetworkPolicyConflict"], 30, what="conflict condition")
    assert "not Corral's" in cond[0]["message"]
    kube.patch(SandboxTemplate, "py", {"spec": {"networkPolicyManagement": "Unmanaged"}}, namespace=ns,
               patch_type=PatchType.MERGE)
    wait_until(lambda: status(kube.get(SandboxTemplate, "py", namespace=ns)).get("observedGeneration") == 2, 30)
    after = {n: get_np(kube, ns, n).metadata.resourceVersion for n in ("corral-sbxt-py", "team-policy")}
    assert before == after
