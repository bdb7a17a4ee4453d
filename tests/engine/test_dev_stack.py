"""engine tier: the real Pulumi CLI previews and applies the dev stack on the local cluster; a second preview shows
no changes; destroy leaves nothing behind."""

import json
from pathlib import Path
import time

import pytest
from lightkube import ApiError
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Namespace

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name

pytestmark = pytest.mark.engine

CORRAL_CRDS = {"sandboxtemplates.corral.dev", "sandboxes.corral.dev", "warmpools.corral.dev", "pools.corral.dev",
               "sandboxclaims.corral.dev"}


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

        # Nothing drifts: a second preview proposes no change.
        run("preview", "--stack", "dev", "--non-interactive", "--expect-no-changes", "--diff")

        run("destroy", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview")
        crds = {c.metadata.name for c in kube.list(CustomResourceDefinition)}
        assert not (CORRAL_CRDS & crds), crds
        deadline = time.monotonic() + 60
        while True:
            try:
                kube.get(Namespace, "corral-sandboxes")
            except ApiError as exc:
                assert exc.status.code == 404
                break
            assert time.monotonic() < deadline, "namespace corral-sandboxes still exists"
            time.sleep(0.5)
    finally:
        run("destroy", "--stack", "dev", "--yes", "--non-interactive", "--skip-preview", check=False)
        run("stack", "rm", "dev", "--yes", "--force", "--non-interactive", check=False)
