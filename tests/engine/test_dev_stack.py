"""engine tier: the real Pulumi CLI previews and applies the dev stack on the local cluster - CRDs, the operator
chart (RBAC, Deployment, NetworkPolicies) and the pools; a second preview shows no changes; one changed chart value is
exactly one change in `pulumi preview --diff`; destroy leaves nothing behind."""

import json
from pathlib import Path

import pytest
from engineutil import wait_namespace_gone
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Secret, ServiceAccount
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name

pytestmark = pytest.mark.engine

CORRAL_CRDS = {"sandboxtemplates.corral.dev", "sandboxes.corral.dev", "warmpools.corral.dev", "pools.corral.dev",
               "sandboxclaims.corral.dev", "sandboxbatches.corral.dev", "clusterkopfpeerings.kopf.dev",
               "kopfpeerings.kopf.dev"}


def test_dev_stack_up_is_stable_and_destroy_cleans_up(pulumi_cli, kube_cluster, kube, project):
    env = {"KUBECONFIG": kube_cluster.kubeconfig}
    run = lambda *a, **kw: pulumi_cli.run(*a, cwd=project, env=env, **kw)  # noqa: E731
    leftovers = CORRAL_CRDS & {c.metadata.name for c in kube.list(CustomResourceDefinition)}
    assert not leftovers, f"Corral CRDs already on the cluster (left by another run?): {leftovers}"
    run("stack", "init", "dev", "--non-interactive")
    try:
        preview = run("preview", "--stack", "dev", "--non-interactive", "--json")
        steps = json.loads(preview.stdout)["steps"]
        created = {s["urn"].split("::")[-2].split("$")[-1] for s in steps if s["op"] == "create"}
        assert {"kubernetes:corral.dev/v1alpha1:WarmPool", "kubernetes:corral.dev/v1alpha1:Pool",
                "kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition"} <= created

        run("up", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview")
        crds = {c.metadata.name for c in kube.list(CustomResourceDefinition)}
        assert CORRAL_CRDS <= crds
        out = json.loads(run("stack", "output", "--stack", "dev", "--json").stdout)
        assert out["namespace"] == "corral-sandboxes"
        assert sorted(out["warmPools"]) == ["node", "python"]
        assert out["controllerNamespace"] == "corral-system" and out["controllerService"] == "corral"
        assert out["apiEndpoint"] == "http://corral-api.corral-system.svc:7780"

        # The chart's objects, as the API server has them.
        dep = kube.get(Deployment, "corral", namespace="corral-system")
        (container,) = dep.spec.template.spec.containers
        assert container.resources.limits["memory"] == "768Mi"
        assert dep.spec.template.spec.serviceAccountName == "corral"
        assert kube.get(ServiceAccount, "corral", namespace="corral-system")
        assert kube.get(Secret, "corral-tokens", namespace="corral-system")
        rules = kube.get(ClusterRole, "corral").rules
        # Secrets: create only (each sandbox namespace's execd key, made once); never read, listed or changed.
        assert [sorted(r.verbs) for r in rules if "secrets" in (r.resources or [])] == [["create"]]
        assert kube.get(ClusterRoleBinding, "corral").subjects[0].name == "corral"
        assert [p.metadata.name for p in kube.list(NetworkPolicy, namespace="corral-system")] == ["corral"]
        assert "corral-default-deny" in [p.metadata.name
                                         for p in kube.list(NetworkPolicy, namespace="corral-sandboxes")]

        # Nothing drifts: a second preview proposes no change.
        run("preview", "--stack", "dev", "--non-interactive", "--expect-no-changes", "--diff")

        # One value changed -> exactly one resource changes, in exactly that field.
        run("config", "set", "--path", "corral:controller.values.resources.limits.memory", "1Gi", "--stack", "dev")
        diff = json.loads(run("preview", "--stack", "dev", "--non-interactive", "--diff", "--json").stdout)
        changed = [s for s in diff["steps"] if s["op"] != "same"]
        assert [(s["op"], s["urn"].split("::")[-2].split("$")[-1], s["urn"].split("::")[-1]) for s in changed] == [
            ("update", "kubernetes:apps/v1:Deployment", "corral-chart:corral-system/corral")], changed
        assert set(changed[0].get("detailedDiff") or {}) == {
            "spec.template.spec.containers[0].resources.limits.memory"}, changed[0]
        text = run("preview", "--stack", "dev", "--non-interactive", "--diff").stdout
        assert "768Mi" in text and "1Gi" in text and "1 to update" in text, text[-3000:]

        run("destroy", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview")
        crds = {c.metadata.name for c in kube.list(CustomResourceDefinition)}
        assert not (CORRAL_CRDS & crds), crds
        wait_namespace_gone(kube, "corral-sandboxes", 60)
    finally:
        run("destroy", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview", check=False)
        run("stack", "rm", "dev", "--yes", "--force", "--non-interactive", check=False)
