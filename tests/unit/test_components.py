"""Components under pulumi.runtime.Mocks: resource types, names, parents and inputs."""

import pulumi
import pytest
from pulumi_mocks import MOCKS as mocks
from pulumi_mocks import install

from corral.api import Capacity
from corral.components import Pool, PoolArgs, SandboxTemplate, SandboxTemplateArgs, WarmPool, WarmPoolArgs
from corral.components.catalogue import render


@pytest.fixture(autouse=True)
def fresh_mocks():
    install()
    yield


def check(outputs, fn):
    return pulumi.Output.all(*outputs).apply(lambda values: fn(*values))


@pulumi.runtime.test
def test_warm_pool_makes_one_warmpool_parented_to_the_component():
    tpl = SandboxTemplate("python", SandboxTemplateArgs(spec=render("python"), namespace="sbx"))
    wp = WarmPool("python-warm", WarmPoolArgs(template=tpl, replicas=7, namespace="sbx"))

    def verify(urn, tpl_urn, wp_name):
        crs = mocks.of_type("kubernetes:corral.dev/v1alpha1:WarmPool")
        assert len(crs) == 1
        cr = crs[0]
        assert cr.name == "python-warm-warmpool"
        assert cr.inputs["apiVersion"] == "corral.dev/v1alpha1" and cr.inputs["kind"] == "WarmPool"
        assert cr.inputs["spec"]["replicas"] == 7
        assert cr.inputs["spec"]["templateRef"] == {"name": "python"}
        assert cr.inputs["metadata"]["namespace"] == "sbx"
        assert "corral:index:WarmPool$kubernetes:corral.dev/v1alpha1:WarmPool::python-warm-warmpool" in urn
        assert "corral:index:SandboxTemplate$kubernetes:corral.dev/v1alpha1:SandboxTemplate" in tpl_urn
        assert wp_name == "python-warm"
        assert sorted(r.typ for r in mocks.resources if r.typ.startswith("corral:index:")) == [
            "corral:index:SandboxTemplate", "corral:index:WarmPool"]

    return check([wp.resource.urn, tpl.resource.urn, wp.name], verify)


@pulumi.runtime.test
def test_template_spec_is_the_validated_catalogue_spec():
    spec = render("shell", {"memory": "64Mi"})
    tpl = SandboxTemplate("shell", SandboxTemplateArgs(spec=spec, namespace="ns", resource_name="shell-v1"))

    def verify(name, ns):
        (cr,) = mocks.of_type("kubernetes:corral.dev/v1alpha1:SandboxTemplate")
        assert cr.inputs["spec"] == spec.to_k8s()
        assert cr.inputs["spec"]["podTemplate"]["spec"]["containers"][0]["resources"]["requests"]["memory"] == "64Mi"
        assert cr.inputs["metadata"]["name"] == "shell-v1"
        assert cr.inputs["metadata"]["labels"]["app.kubernetes.io/part-of"] == "corral"
        assert (name, ns) == ("shell-v1", "ns")

    return check([tpl.name, tpl.namespace], verify)


@pulumi.runtime.test
def test_pool_takes_a_template_name_and_capacity():
    pool = Pool("elastic", PoolArgs(template="existing-template", recycle_strategy="Restart",
                                    readiness_grace_seconds=45,
                                    capacity=Capacity(buffer_min=2, buffer_max=4, pool_min=1, pool_max=9)))

    def verify(urn):
        (cr,) = mocks.of_type("kubernetes:corral.dev/v1alpha1:Pool")
        assert cr.inputs["spec"]["templateRef"] == {"name": "existing-template"}
        assert cr.inputs["spec"]["capacity"] == {"bufferMin": 2, "bufferMax": 4, "poolMin": 1, "poolMax": 9}
        assert cr.inputs["spec"]["recycleStrategy"] == "Restart"
        assert cr.inputs["spec"]["readinessGraceSeconds"] == 45
        assert "corral:index:Pool$kubernetes:corral.dev/v1alpha1:Pool::elastic-pool" in urn
        assert not mocks.of_type("kubernetes:corral.dev/v1alpha1:SandboxTemplate")

    return check([pool.resource.urn], verify)


def test_bad_component_args_name_the_field():
    with pytest.raises(ValueError, match="replicas"):
        WarmPool("bad", WarmPoolArgs(template="t", replicas=-2))
    with pytest.raises(ValueError, match="type"):
        WarmPool("bad2", WarmPoolArgs(template="t", update_strategy="Sometimes"))
    with pytest.raises(ValueError, match="bufferMin"):
        Pool("bad3", PoolArgs(template="t", capacity={"bufferMin": 5, "bufferMax": 1}))
