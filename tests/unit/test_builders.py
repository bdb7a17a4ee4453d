"""The operator's pure manifest builders: pods with execd and secure defaults, the managed NetworkPolicy."""

import json

from corral.components.catalogue import render
from corral.operator.builders import blueprint_hash, network_policy, pod_manifest

TEMPLATE = {
    "apiVersion": "corral.dev/v1alpha1", "kind": "SandboxTemplate",
    "metadata": {"name": "python", "namespace": "sbx", "uid": "t-uid"},
    "spec": render("python").to_k8s(),
}


def sandbox(**spec):
    return {"apiVersion": "corral.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s1", "namespace": "sbx", "uid": "s-uid", "labels": {"corral.dev/template": "python"}},
            "spec": {**TEMPLATE["spec"], **spec}}


def test_pod_has_execd_and_secure_defaults():
    pod = pod_manifest(sandbox(), execd_image="corral/execd:1", key_secret="corral-execd-key-x")
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    main = spec["containers"][0]
    assert main["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["command"][:2] == ["/bin/sh", "-c"] and main["command"][-2:] == ["sleep", "infinity"]
    # what execd serves without a token
    assert main["readinessProbe"]["httpGet"] == {"path": "/v1/health", "port": 44772}
    assert spec["initContainers"][0]["image"] == "corral/execd:1"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "s-uid"
    assert pod["metadata"]["labels"]["corral.dev/sandbox"] == "s1"


def test_no_token_and_no_key_in_the_pod_spec_and_the_key_only_in_the_init_container():
    """Anyone who may read pods reads their spec, and sandbox code reads its container's environment: the pod spec
    holds neither a token nor the key; the init container derives execd's first token from the key Secret (mounted
    into it alone) and the pod's identity (downward API), and hands it over in a memory-backed file execd deletes."""
    pod = pod_manifest(sandbox(), execd_image="corral/execd:1", key_secret="corral-execd-key-abc")
    spec = pod["spec"]
    main, init = spec["containers"][0], spec["initContainers"][0]
    assert "CORRAL_EXECD_TOKEN\"" not in json.dumps(pod)  # no token variable anywhere, with or without a value
    token_file = next(e["value"] for e in main["env"] if e["name"] == "CORRAL_EXECD_TOKEN_FILE")
    env = {e["name"]: e for e in init["env"]}
    assert env["CORRAL_EXECD_POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["CORRAL_EXECD_POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["CORRAL_EXECD_POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert all("value" not in e or e["name"] == "CORRAL_EXECD_KEY_FILE" for e in init["env"])
    assert init["command"][-1] == token_file
    key_volume = next(v for v in spec["volumes"] if "secret" in v)
    assert key_volume["secret"]["secretName"] == "corral-execd-key-abc"
    key_mount = next(m for m in init["volumeMounts"] if m["name"] == key_volume["name"])
    assert env["CORRAL_EXECD_KEY_FILE"]["value"].startswith(key_mount["mountPath"] + "/")
    for c in spec["containers"]:  # the key reaches no sandbox container
        assert all(m["name"] != key_volume["name"] for m in c.get("volumeMounts", []))
    mount = next(m for m in main["volumeMounts"] if token_file.startswith(m["mountPath"] + "/"))
    assert not mount.get("readOnly")  # execd deletes the file
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
    assert any(m["name"] == mount["name"] for m in init["volumeMounts"])


def test_template_values_win_over_defaults():
    s = sandbox()
    s["spec"]["podTemplate"]["spec"]["securityContext"] = {"runAsUser": 0, "runAsNonRoot": False}
    pod = pod_manifest(s, execd_image="x", key_secret="k")
    assert pod["spec"]["securityContext"]["runAsUser"] == 0


def test_default_network_policy_has_exactly_the_listed_exceptions():
    np = network_policy(TEMPLATE, operator_namespace="corral-system")
    spec = np["spec"]
    assert spec["podSelector"] == {"matchLabels": {"corral.dev/template": "python"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    v4, v6 = spec["egress"][0]["to"]
    assert v4["ipBlock"] == {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                               "169.254.0.0/16"]}
    assert v6["ipBlock"] == {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]}
    (ingress,) = spec["ingress"]
    assert ingress["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "corral-system"}}
    assert ingress["ports"] == [{"protocol": "TCP", "port": 44772}]
    assert spec["egress"][1]["ports"] == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]


def test_dns_toggle_and_custom_policy():
    t = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "dns": "Disallowed"}}
    assert len(network_policy(t, "corral-system")["spec"]["egress"]) == 1
    custom = {"ingress": [{"from": [{"podSelector": {}}]}], "egress": []}
    t = {**TEMPLATE, "spec": {**TEMPLATE["spec"], "networkPolicy": custom}}
    spec = network_policy(t, "corral-system")["spec"]
    assert spec["ingress"] == custom["ingress"] and spec["egress"] == []
    assert spec["podSelector"] == {"matchLabels": {"corral.dev/template": "python"}}  # forced


def test_blueprint_hash_ignores_policy_but_not_the_pod():
    base = blueprint_hash(TEMPLATE["spec"])
    assert blueprint_hash({**TEMPLATE["spec"], "envVarsInjectionPolicy": "Overrides"}) == base
    changed = render("python", {"memory": "1Gi"}).to_k8s()
    assert blueprint_hash(changed) != base


