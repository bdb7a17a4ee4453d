"""The operator chart against the real apiserver: it renders, lints and passes server-side dry-run with default
values; and the operator, running under the chart's ServiceAccount (a token from the TokenRequest API), does a whole
warm and cold claim flow while the server denies it what the chart does not grant."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml
from kubeutil import Sandbox, SandboxClaim, apply_crd, bound, claim, idle_ready, template, wait_until, warm_pool
from lightkube import ApiError, Client, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Secret

from corral.components.controller_values import APP_VERSION

pytestmark = pytest.mark.kube

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "corral"
OPERATOR_NS = "corral-system"
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}


def tools() -> dict[str, str]:
    out = subprocess.run(["bash", "-c", f'eval "$({REPO}/scripts/env.sh)" && command -v helm kubectl'],
                         capture_output=True, text=True, check=True).stdout.split()
    helm, kubectl = out
    return {"helm": helm, "kubectl": kubectl}


def run(*args: str, kubeconfig: str | None = None, stdin: str | None = None) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())} | ({"KUBECONFIG": kubeconfig} if kubeconfig else {})
    proc = subprocess.run(list(args), input=stdin, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, \
        f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def rendered(kube_cluster):
    t = tools()
    run(t["helm"], "lint", str(CHART), "--strict")
    text = run(t["helm"], "template", "corral", str(CHART), "--namespace", OPERATOR_NS, "--include-crds",
               "--set", "sandboxNamespaces={corral-rbac-sbx}")
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.fixture(scope="module")
def chart_installed(kube, kube_cluster, corral_crds, rendered):
    """The chart's CRDs (kopf's peering ones; Corral's come from corral_crds), its namespace and its RBAC, for real."""
    kubectl = tools()["kubectl"]
    made_ns = []
    for name in (OPERATOR_NS, "corral-rbac-sbx"):
        try:
            kube.create(Namespace(metadata=ObjectMeta(name=name)))
            made_ns.append(name)
        except ApiError as exc:
            assert exc.status.code == 409
    peering = [d for d in rendered if d["kind"] == "CustomResourceDefinition" and d["spec"]["group"] == "kopf.dev"]
    rbac = [d for d in rendered if d["kind"] in RBAC_KINDS]
    for crd in peering:  # kept until the session ends (corral_crds removes them): a CRD deleted and re-created
        apply_crd(kube, crd)  # mid-session leaves watches on it silent, which is what kopf peering runs on
    run(kubectl, "apply", "--server-side", "-f", "-", kubeconfig=kube_cluster.kubeconfig,
        stdin=yaml.safe_dump_all(rbac))
    yield rendered
    for d in rbac:
        run(kubectl, "delete", "--ignore-not-found", "-f", "-", kubeconfig=kube_cluster.kubeconfig,
            stdin=yaml.safe_dump(d))
    for name in made_ns:
        kube.delete(Namespace, name)


def test_default_chart_is_accepted_by_the_server_dry_run(kube_cluster, chart_installed):
    objs = [d for d in chart_installed if d["kind"] != "CustomResourceDefinition"]
    kinds = sorted(d["kind"] for d in objs)
    assert kinds == sorted(["ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding", "Deployment", "NetworkPolicy",
                            "NetworkPolicy", "Secret", "Service", "Service", "ServiceAccount"])
    out = run(tools()["kubectl"], "apply", "--dry-run=server", "--server-side", "-o", "json", "-f", "-",
              kubeconfig=kube_cluster.kubeconfig, stdin=yaml.safe_dump_all(objs))
    items = json.loads(out)
    items = items.get("items", [items])
    assert sorted(i["kind"] for i in items) == kinds
    (dep,) = [i for i in items if i["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["capabilities"] == {
        "drop": ["ALL"]}
    assert c["resources"]["limits"]["memory"] == "768Mi"
    assert "--peering=corral" in c["args"] and "--all-namespaces" in c["args"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["CORRAL_API_NAMESPACE"] == "corral-rbac-sbx"  # the claims API serves the sandbox namespace
    assert env["CORRAL_EXECD_IMAGE"] == c["image"]  # the operator image carries execd for the initContainer
    assert "CORRAL_POD_NAME" in env  # the replica labels its own pod when it is the active one
    (api,) = [i for i in items if i["kind"] == "Service" and i["metadata"]["name"].endswith("-api")]
    assert api["spec"]["selector"]["corral.dev/claims-api"] == "active"  # API traffic reaches the active replica only
    assert [p["name"] for p in api["spec"]["ports"]] == ["api"]


def sa_kubeconfig(kube_cluster, tmp_path: Path) -> str:
    """A kubeconfig for the chart's ServiceAccount: the admin's cluster entry and a TokenRequest token."""
    token = run(tools()["kubectl"], "create", "token", "corral", "-n", OPERATOR_NS, "--duration", "2h",
                kubeconfig=kube_cluster.kubeconfig).strip()
    admin = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    clusters = []
    for c in admin["clusters"]:  # self-contained (CA inlined): it is also mounted into a container
        cluster = dict(c["cluster"])
        if "certificate-authority" in cluster:
            ca = Path(cluster.pop("certificate-authority")).read_bytes()
            cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
        clusters.append({"name": c["name"], "cluster": cluster})
    cfg = {"apiVersion": "v1", "kind": "Config", "clusters": clusters,
           "users": [{"name": "corral-sa", "user": {"token": token}}],
           "contexts": [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": "corral-sa"}}],
           "current-context": "sa"}
    path = tmp_path / "sa.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_operator_under_the_charts_service_account(kube, kube_cluster, operator, chart_installed, ns, tmp_path):
    cfg = sa_kubeconfig(kube_cluster, tmp_path)
    sa = Client(config=KubeConfig.from_file(cfg), field_manager="corral-tests", timeout=30)

    # What the chart does not grant, the server denies: Secrets (here or anywhere), nodes, RBAC.
    kube.create(Secret(metadata=ObjectMeta(name="not-yours"), stringData={"k": "v"}), namespace=ns)
    for attempt in (lambda: sa.get(Secret, "not-yours", namespace=ns),
                    lambda: list(sa.list(Secret, namespace="kube-system")),
                    lambda: sa.delete(Node, "kwok-node-0"),
                    lambda: sa.create(Namespace(metadata=ObjectMeta(name="sa-made-this")))):
        with pytest.raises(ApiError) as denied:
            attempt()
        assert denied.value.status.code == 403, denied.value.status
    assert kube.get(Node, "kwok-node-0")  # still there

    # The whole flow under that identity: the session's (admin) operator steps aside for an SA-run one.
    operator.stop()
    sa_op = type(operator)(cfg, tmp_path)  # the same kind of operator process, under the SA identity
    try:
        sa_op.start()
        kube.create(template("py"), namespace=ns)
        kube.create(warm_pool("wp", "py", 1), namespace=ns)
        wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 1, 60, 0.25, "one ready warm sandbox", dump=sa_op.log)
        kube.create(claim("warm", "wp"), namespace=ns)
        kube.create(claim("cold", "wp"), namespace=ns)
        got = {n: wait_until(lambda n=n: bound(kube, ns, n), 60, 0.25, f"claim {n} Bound", dump=sa_op.log)
               for n in ("warm", "cold")}
        launches = sorted(s.get("launchType") for s in got.values())
        assert launches == ["Cold", "Warm"], got
        assert got["warm"]["sandbox"]["name"] != got["cold"]["sandbox"]["name"]
        # the template's NetworkPolicy was made under the same identity
        from lightkube.resources.networking_v1 import NetworkPolicy

        assert [p.metadata.name for p in kube.list(NetworkPolicy, namespace=ns)] == ["corral-sbxt-py"]
        # releasing a claim deletes its sandbox (shutdownPolicy Delete)
        kube.delete(SandboxClaim, "cold", namespace=ns)
        wait_until(lambda: all(s.metadata.name != got["cold"]["sandbox"]["name"]
                               for s in kube.list(Sandbox, namespace=ns)),
                   60, 0.25, "cold sandbox deleted", dump=sa_op.log)
        log = sa_op.log()
        assert "403" not in log and "Forbidden" not in log, log[-3000:]
    finally:
        sa_op.stop()
        operator.start()


def test_controller_image_runs_the_operator(kube, kube_cluster, operator, chart_installed, docker_client, ns,
                                            tmp_path):
    """The image scripts/controller-image.sh builds (PyInstaller bundle, non-root, read-only root) is a working
    operator: run on the host network against the local apiserver with the chart's ServiceAccount token, it serves
    its health endpoint and binds a warm claim; and it carries execd for the sandboxes' initContainer."""
    tag = run(str(REPO / "scripts/controller-image.sh")).strip().splitlines()[-1]
    image = docker_client.images.get(tag)
    assert image.attrs["Config"]["User"] == "65532:65532"
    assert f"corral/controller:{APP_VERSION}" in image.tags
    cfg = sa_kubeconfig(kube_cluster, tmp_path)
    (tmp_path / "sa.kubeconfig").chmod(0o644)  # readable by the image's user
    health, metrics = free_ports(2)
    operator.stop()
    container = docker_client.containers.run(
        tag, ["--standalone", f"--liveness=http://127.0.0.1:{health}/healthz"], detach=True,
        network_mode="host", read_only=True, tmpfs={"/tmp": "size=64m"}, cap_drop=["ALL"],
        security_opt=["no-new-privileges"], volumes={cfg: {"bind": "/etc/corral/kubeconfig", "mode": "ro"}},
        environment={"KUBECONFIG": "/etc/corral/kubeconfig", "CORRAL_METRICS_PORT": str(metrics),
                     "CORRAL_TOKEN_SECRET": "image-test", "CORRAL_NAMESPACE": OPERATOR_NS},
        labels={"corral.test": "controller-image"})
    try:
        def healthy():
            container.reload()
            assert container.status != "exited", container.logs().decode()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{health}/healthz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 60, 0.5, "the image's operator healthy")
        logs = lambda: container.logs().decode(errors="replace")  # noqa: E731
        kube.create(template("img"), namespace=ns)
        kube.create(warm_pool("wp", "img", 1), namespace=ns)
        wait_until(lambda: len(idle_ready(kube, ns, "wp")) == 1, 60, 0.25, "a ready warm sandbox", dump=logs)
        kube.create(claim("c", "wp"), namespace=ns)
        st = wait_until(lambda: bound(kube, ns, "c"), 60, 0.25, "claim Bound", dump=logs)
        assert st["launchType"] == "Warm"
        assert "corral_claim" in httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=5).text
        # what the sandboxes' initContainer does with this image: `execd install <dir>` copies a runnable bundle
        out = docker_client.containers.run(
            tag, ["-c", "/opt/corral/execd/execd install /tmp/e && test -x /tmp/e/execd && echo installed"],
            entrypoint=["/bin/sh"], remove=True, network_mode="none", tmpfs={"/tmp": "size=256m,exec"})
        assert out.decode().strip().endswith("installed")
    finally:
        container.remove(force=True)
        operator.start()


def free_ports(n: int) -> list[int]:
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_plain_helm_install_and_upgrade_keep_the_tokens(kube, kube_cluster, chart_installed):
    """Teams without Pulumi: `helm install` works against the real apiserver (Deployment rolled out on kwok's
    nodes), the chart makes its token Secret once and an upgrade keeps the tokens (lookup), uninstall removes it."""
    helm = tools()["helm"]
    ns = "corral-helm"
    args = ["--namespace", ns, "--set", "peering.name=corral-helm", "--wait", "--timeout", "180s"]
    run(helm, "install", "corral-helm", str(CHART), "--create-namespace", *args, kubeconfig=kube_cluster.kubeconfig)
    try:
        from lightkube.resources.apps_v1 import Deployment

        dep = kube.get(Deployment, "corral-helm", namespace=ns)
        assert dep.status.readyReplicas == 1
        token = kube.get(Secret, "corral-helm-tokens", namespace=ns).data
        assert set(token) == {"token-secret", "api-token"} and len(base64.b64decode(token["api-token"])) == 40
        run(helm, "upgrade", "corral-helm", str(CHART), *args, "--set", "workers=32",
            kubeconfig=kube_cluster.kubeconfig)
        assert kube.get(Secret, "corral-helm-tokens", namespace=ns).data == token
        env = {e.name: e.value for e in kube.get(Deployment, "corral-helm", namespace=ns)
               .spec.template.spec.containers[0].env}
        assert env["CORRAL_WORKERS"] == "32"
    finally:
        run(helm, "uninstall", "corral-helm", "--namespace", ns, "--wait", kubeconfig=kube_cluster.kubeconfig)
        kube.delete(Namespace, ns)
    with pytest.raises(ApiError) as gone:
        kube.get(Secret, "corral-helm-tokens", namespace=ns)
    assert gone.value.status.code == 404
