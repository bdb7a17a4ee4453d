"""The operator chart's typed values, its generated files, and the RBAC and NetworkPolicies from the pure builders."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from corral.components import chart
from corral.components.config import ConfigError, parse_stack_config
from corral.components.controller_values import OperatorValues, ValuesError
from corral.execd.settings import DEFAULT_PORT as EXECD_PORT
from corral.operator.constants import OPERATOR_APP_LABEL

CHART = Path(chart.CHART_DIR)


def test_generated_chart_files_have_not_drifted():
    assert chart.main(["--check"]) == 0, "run `python -m corral.components.chart` and commit the result"


def test_check_notices_a_drifted_file(tmp_path):
    chart.main(["--out", str(tmp_path)])
    assert chart.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "values.schema.json").write_text("{}")
    assert chart.main(["--check", "--out", str(tmp_path)]) == 1


def test_chart_crds_are_corrals_and_kopfs_peering():
    names = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert names == ["clusterkopfpeerings.kopf.dev.yaml", "kopfpeerings.kopf.dev.yaml", "pools.corral.dev.yaml",
                     "sandboxbatches.corral.dev.yaml", "sandboxclaims.corral.dev.yaml", "sandboxes.corral.dev.yaml",
                     "sandboxtemplates.corral.dev.yaml", "warmpools.corral.dev.yaml"]


# --- values: typed model and the generated JSON schema agree, and bad values name the field -----------------------

@pytest.fixture(scope="module")
def schema():
    return json.loads((CHART / "values.schema.json").read_text())


def test_default_values_file_is_valid_under_the_schema(schema):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)
    assert OperatorValues.parse({k: v for k, v in values.items() if k != "rbac"}) == OperatorValues()


@pytest.mark.parametrize("raw, field", [
    ({"replicas": -1}, "replicas"),
    ({"replicas": "two"}, "replicas"),
    ({"resources": {"limits": {"memory": 512}}}, "resources.limits.memory"),
    ({"metrics": {"port": 80}}, "metrics.port"),
    ({"imagee": {"tag": "x"}}, "imagee"),
    ({"image": {"pullPolicy": "Sometimes"}}, "image.pullPolicy"),
])
def test_bad_values_name_the_field_in_model_and_schema(schema, raw, field):
    with pytest.raises(ValuesError) as err:
        OperatorValues.parse(raw)
    assert f"{field}:" in str(err.value)
    with pytest.raises(jsonschema.ValidationError) as bad:
        jsonschema.validate(OperatorValues().to_values() | raw, schema)
    where = ".".join(str(p) for p in bad.value.absolute_path)
    assert where == field or (where == "" and field.split(".")[-1] in bad.value.message), (where, bad.value.message)


def test_unknown_key_is_refused_with_its_name():
    with pytest.raises(ValuesError, match=r"peering\.leader: unknown key"):
        OperatorValues.parse({"peering": {"leader": True}})


def test_several_replicas_need_peering():
    with pytest.raises(ValuesError, match="replicas > 1 needs peering.enabled"):
        OperatorValues.parse({"replicas": 2, "peering": {"enabled": False}})
    assert OperatorValues.parse({"replicas": 2}).replicas == 2


def test_stack_config_names_the_bad_controller_value():
    with pytest.raises(ConfigError, match=r"corral:controller\.values\.replicas"):
        parse_stack_config({"corral:mode": "kubernetes", "corral:controller": {"values": {"replicas": -3}}})


def test_default_resources_are_sized_for_a_thousand_sandboxes():
    """bench/claims_k8s measured ~127 MiB RSS at 1,000 sandboxes; the limit must leave burst headroom (>= 4x)."""
    res = OperatorValues().resources
    mib = {"Mi": 1, "Gi": 1024}
    limit = int(res.limits.memory[:-2]) * mib[res.limits.memory[-2:]]
    request = int(res.requests.memory[:-2]) * mib[res.requests.memory[-2:]]
    assert request >= 256 and limit >= 4 * 127
    assert res.limits.cpu is None  # no CPU throttling of the claim path


# --- RBAC ------------------------------------------------------------------------------------------------------------

def grants(rules, group, resource, verb):
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_rbac_grants_what_the_operator_does():
    rules = chart.cluster_rules()
    for kind in chart.CORRAL_KINDS:
        for verb in ("get", "list", "watch", "patch"):
            assert grants(rules, "corral.dev", kind, verb), (kind, verb)
        assert grants(rules, "corral.dev", f"{kind}/status", "patch")
    for verb in ("create", "delete", "patch", "watch"):
        assert grants(rules, "", "pods", verb)
    assert grants(rules, "corral.dev", "sandboxes", "create") and grants(rules, "corral.dev", "sandboxclaims", "create")
    assert grants(rules, "networking.k8s.io", "networkpolicies", "delete")
    assert grants(rules, "kopf.dev", "clusterkopfpeerings", "patch")


def test_rbac_is_least_privilege():
    rules = chart.cluster_rules()
    for r in rules:
        assert "*" not in r["verbs"] and "*" not in r["resources"] and "*" not in r["apiGroups"], r
        assert "escalate" not in r["verbs"] and "bind" not in r["verbs"] and "impersonate" not in r["verbs"]
    # Secrets: create only (the execd key of each sandbox namespace); never read, listed, changed or deleted
    assert grants(rules, "", "secrets", "create")
    assert not any(grants(rules, "", "secrets", v) for v in ("get", "list", "watch", "patch", "update", "delete"))
    for group, resource in [("", "configmaps"), ("", "nodes"), ("", "serviceaccounts"),
                            ("rbac.authorization.k8s.io", "clusterroles"), ("apps", "deployments"),
                            ("", "pods/exec"), ("", "namespaces")]:
        assert not any(grants(rules, group, resource, v) for v in ("get", "list", "create", "delete", "patch")), \
            resource
    # nothing writable on CRDs: the operator never installs or changes its own schema
    assert not any(grants(rules, "apiextensions.k8s.io", "customresourcedefinitions", v)
                   for v in ("create", "patch", "update", "delete"))


def test_every_rule_says_who_needs_it_in_the_chart():
    text = (CHART / "templates/rbac.yaml").read_text()
    for rule in chart.CLUSTER_RULES:
        assert len(rule.why) > 20
        assert f"# {rule.why}" in text


def test_rbac_binds_the_service_account():
    role, binding = chart.rbac("corral", "corral-system", "corral", {"a": "b"})
    assert role["kind"] == "ClusterRole" and binding["roleRef"]["name"] == "corral"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "corral", "namespace": "corral-system"}]


# --- NetworkPolicies -------------------------------------------------------------------------------------------------

def test_operator_policy_admits_only_its_ports_and_reaches_only_api_dns_and_execd():
    values = OperatorValues.parse({"networkPolicy": {"scrapeNamespaces": ["monitoring"]}})
    pol = chart.operator_network_policy("corral", "corral-system", {}, values, EXECD_PORT)
    spec = pol["spec"]
    assert spec["podSelector"] == {"matchLabels": OPERATOR_APP_LABEL}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    ports = [[p["port"] for p in rule["ports"]] for rule in spec["ingress"]]
    assert ports == [[9090], [7780], [8080]]
    assert spec["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    egress_ports = sorted(p["port"] for rule in spec["egress"] for p in rule["ports"])
    assert egress_ports == sorted([443, 6443, EXECD_PORT, 53, 53])
    execd_rule = next(r for r in spec["egress"] if r["ports"][0]["port"] == EXECD_PORT)
    assert execd_rule["to"][0]["podSelector"] == {"matchLabels": {"app.kubernetes.io/managed-by": "corral-operator"}}


def test_operator_policy_without_api_or_dns():
    values = OperatorValues.parse({"api": {"enabled": False}, "networkPolicy": {"dns": False}})
    spec = chart.operator_network_policy("corral", "corral-system", {}, values, EXECD_PORT)["spec"]
    assert [[p["port"] for p in r["ports"]] for r in spec["ingress"]] == [[9090], [8080]]
    assert 53 not in [p["port"] for r in spec["egress"] for p in r["ports"]]



def test_sharded_replicas_admit_each_other_on_the_api_port_whatever_api_namespaces_says():
    """Sharded, a replica forwards a request for another replica's shard to that replica's pod IP: the policy admits
    the release's operator pods to each other's claims API port, ingress and egress (a CNI enforcing egress alone,
    e.g. Calico, drops it otherwise; kube-router drops it once apiNamespaces leaves the release namespace out)."""
    values = OperatorValues.parse({"sharding": {"enabled": True}, "replicas": 2,
                                   "networkPolicy": {"apiNamespaces": ["agents"]}})
    spec = chart.operator_network_policy("rel-corral", "corral-system", {}, values, EXECD_PORT, release="rel")["spec"]
    peers = [{"podSelector": {"matchLabels": {**OPERATOR_APP_LABEL, "app.kubernetes.io/instance": "rel"}}}]
    api = [{"protocol": "TCP", "port": 7780}]
    assert [[p["port"] for p in r["ports"]] for r in spec["ingress"]] == [[9090], [7780], [7780], [8080]]
    assert spec["ingress"][1]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "agents"}}}]
    assert spec["ingress"][2] == {"from": peers, "ports": api}
    assert {"to": peers, "ports": api} in spec["egress"]
    # not without sharding (one active replica forwards nothing), nor without the API
    for raw in ({"networkPolicy": {"apiNamespaces": ["agents"]}}, {"sharding": {"enabled": True}, "api": {
            "enabled": False}}):
        spec = chart.operator_network_policy("c", "ns", {}, OperatorValues.parse(raw), EXECD_PORT)["spec"]
        assert not [r for r in [*spec["ingress"], *spec["egress"]] for x in (r.get("from"), r.get("to"))
                    if x and "podSelector" in x[0] and "namespaceSelector" not in x[0]], spec


def test_the_peer_rules_select_the_charts_own_pods_and_render_only_when_sharded():
    helpers = (CHART / "templates/_helpers.tpl").read_text()
    selector = helpers.split('define "corral.selectorLabels"')[1].split("{{- end")[0]
    labels = dict(ln.strip().split(": ", 1) for ln in selector.splitlines() if ": " in ln)
    assert labels == chart.operator_selector("{{ .Release.Name }}")  # the Deployment's pods, this release's only
    template = (CHART / "templates/networkpolicies.yaml").read_text()
    assert template.count("{{- if and .Values.sharding.enabled .Values.api.enabled }}") == 2
    assert template.count("app.kubernetes.io/instance: {{ $.Release.Name }}") == 2
    assert "&id" not in template and "*id" not in template  # no YAML anchors from shared dicts

def test_sandbox_namespace_is_default_deny_except_operator_to_execd():
    pol = chart.sandbox_namespace_policy("sbx", "corral-system", {}, EXECD_PORT)
    spec = pol["spec"]
    assert pol["metadata"]["namespace"] == "sbx"
    assert spec["podSelector"] == {} and spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["egress"] == []
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": EXECD_PORT}]
    (peer,) = rule["from"]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "corral-system"}}
    assert peer["podSelector"] == {"matchLabels": OPERATOR_APP_LABEL}


def test_chart_pods_carry_the_label_sandbox_policies_admit():
    helpers = (CHART / "templates/_helpers.tpl").read_text()
    (key, value), = OPERATOR_APP_LABEL.items()
    assert f"{key}: {value}" in helpers.split('define "corral.selectorLabels"')[1].split("end")[0]


def test_chart_version_is_the_distributions():
    from corral.components import __version__
    from corral.components.controller_values import APP_VERSION, CHART_VERSION

    assert CHART_VERSION == APP_VERSION == __version__
    assert yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"] == __version__
