"""ControllerDeployment under pulumi.runtime.Mocks: namespace, CRDs, token Secret and the chart with typed values."""

import pulumi
import pytest
from pulumi_mocks import MOCKS as mocks
from pulumi_mocks import install

from corral.components import ControllerDeployment, ControllerDeploymentArgs, OperatorValues
from corral.components.controller import fullname
from corral.components.controller_values import ValuesError


@pytest.fixture(autouse=True)
def fresh_mocks():
    install()
    yield


def check(outputs, fn):
    return pulumi.Output.all(*outputs).apply(lambda values: fn(*values))


@pulumi.runtime.test
def test_controller_installs_namespace_crds_secret_and_chart():
    values = OperatorValues.parse({"resources": {"limits": {"memory": "1Gi"}}, "replicas": 2})
    cd = ControllerDeployment("corral", ControllerDeploymentArgs(namespace="corral-ops", values=values))

    def verify(ns, service, metrics, api, _chart, _token):
        (namespace,) = mocks.of_type("kubernetes:core/v1:Namespace")
        assert namespace.inputs["metadata"]["name"] == "corral-ops"
        crds = mocks.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
        assert sorted(c.inputs["metadata"]["name"] for c in crds) == [
            "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev", "pools.corral.dev", "sandboxbatches.corral.dev",
            "sandboxclaims.corral.dev", "sandboxes.corral.dev", "sandboxtemplates.corral.dev", "warmpools.corral.dev"]
        (secret,) = mocks.of_type("kubernetes:core/v1:Secret")
        assert secret.inputs["metadata"]["name"] == "corral-tokens"
        assert "stringData" in secret.inputs  # secret values (the mock does not resolve the generated tokens)
        tokens = {r.name for r in mocks.of_type("pulumi-python:dynamic:Resource")}
        assert tokens == {"corral-token-secret", "corral-api-token"}  # made once, kept in the stack's state
        (chart,) = mocks.of_type("kubernetes:helm.sh/v4:Chart")
        assert chart.inputs["skipCrds"] is True and chart.inputs["namespace"] == "corral-ops"
        v = chart.inputs["values"]
        assert v["resources"]["limits"]["memory"] == "1Gi" and v["replicas"] == 2
        assert v["secrets"]["existingSecret"] == "corral-tokens"
        assert "cpu" not in v["resources"]["limits"]  # unset optionals are left out, not null
        assert (ns, service) == ("corral-ops", "corral")
        assert metrics == "http://corral.corral-ops.svc:9090/metrics"
        assert api == "http://corral-api.corral-ops.svc:7780"  # the active replica's pod only

    return check([cd.namespace, cd.service_name, cd.metrics_endpoint, cd.api_endpoint, cd.chart.urn, cd.api_token],
                 verify)


@pulumi.runtime.test
def test_raw_values_override_typed_values():
    cd = ControllerDeployment("c", ControllerDeploymentArgs(
        create_namespace=False, install_crds=False, raw_values={"metrics": {"port": 9300}, "api": {"enabled": False}}))

    def verify(metrics, api, _chart):
        assert not mocks.of_type("kubernetes:core/v1:Namespace")
        assert not mocks.of_type("kubernetes:apiextensions.k8s.io/v1:CustomResourceDefinition")
        (chart,) = mocks.of_type("kubernetes:helm.sh/v4:Chart")
        assert chart.inputs["values"]["metrics"]["port"] == 9300
        assert metrics.endswith(":9300/metrics") and api == ""

    return check([cd.metrics_endpoint, cd.api_endpoint, cd.chart.urn], verify)


def test_bad_raw_values_fail_with_the_field_named():
    with pytest.raises(ValuesError, match=r"metrics\.port"):
        ControllerDeployment("c", ControllerDeploymentArgs(raw_values={"metrics": {"port": -1}}))
    with pytest.raises(ValuesError, match=r"replica: unknown key"):
        ControllerDeployment("c", ControllerDeploymentArgs(raw_values={"replica": 3}))


def test_fullname_follows_the_chart_helper():
    assert fullname("corral") == "corral"
    assert fullname("prod") == "prod-corral"
    assert fullname("my-corral-release") == "my-corral-release"
    assert fullname("x", "sbx") == "x-sbx"
