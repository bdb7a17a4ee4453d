"""The generated CRDs carry what the issue asks for, are structural, and match the committed YAML."""

import pytest

from corral.api.crd import CRD_DIR, all_crds, crd_files, load_committed, main

CRDS = {c["spec"]["names"]["kind"]: c for c in all_crds()}


def version(kind):
    return CRDS[kind]["spec"]["versions"][0]


def spec_schema(kind):
    return version(kind)["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_committed_crds_match_the_models():
    committed = {p.name: p.read_text() for p in CRD_DIR.glob("*.yaml")}
    assert committed == crd_files(), "CRDs drifted from the models: run `python -m corral.api.crd`"
    assert main(["--check"]) == 0


def test_drift_check_notices_a_change(tmp_path):
    for name, text in crd_files().items():
        (tmp_path / name).write_text(text)
    assert main(["--check", "--out", str(tmp_path)]) == 0
    victim = next(iter(tmp_path.glob("*warmpools*")))
    victim.write_text(victim.read_text().replace("maximum: 1000", "maximum: 5000"))
    assert main(["--check", "--out", str(tmp_path)]) == 1


@pytest.mark.parametrize("kind,short", [("SandboxTemplate", "sbxt"), ("Sandbox", "sbx"), ("WarmPool", "wp"),
                                        ("Pool", "pool"), ("SandboxClaim", "sbxc"),
                                        ("SandboxBatch", "sbxb")])
def test_names_status_subresource_and_printer_columns(kind, short):
    crd = CRDS[kind]
    assert crd["spec"]["group"] == "corral.dev"
    assert short in crd["spec"]["names"]["shortNames"]
    assert "corral" in crd["spec"]["names"]["categories"]
    v = version(kind)
    assert v["name"] == "v1alpha1" and v["served"] and v["storage"]
    assert v["subresources"]["status"] == {}
    cols = v["additionalPrinterColumns"]
    assert len(cols) >= 3 and cols[-1]["name"] == "Age"
    assert all(c["jsonPath"].startswith(".") for c in cols)


def test_only_warmpool_has_the_scale_subresource():
    scale = version("WarmPool")["subresources"]["scale"]
    assert scale == {"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas",
                     "labelSelectorPath": ".status.selector"}
    assert all("scale" not in version(k)["subresources"] for k in CRDS if k != "WarmPool")


def rules(node):
    return [r["rule"] for r in node.get("x-kubernetes-validations", [])]


def test_cel_rules():
    assert rules(spec_schema("WarmPool")["properties"]["templateRef"]) == ["self == oldSelf"]
    assert rules(spec_schema("Pool")["properties"]["templateRef"]) == ["self == oldSelf"]
    assert rules(spec_schema("SandboxClaim")["properties"]["poolRef"]) == ["self == oldSelf"]
    assert rules(spec_schema("Pool")["properties"]["capacity"]) == [
        "self.bufferMin <= self.bufferMax", "self.poolMin <= self.poolMax"]


def test_replicas_is_bounded():
    replicas = spec_schema("WarmPool")["properties"]["replicas"]
    assert replicas["type"] == "integer" and replicas["minimum"] == 0 and replicas["maximum"] == 1000


def walk(node, path="$"):
    yield path, node
    for k, v in node.get("properties", {}).items():
        yield from walk(v, f"{path}.{k}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_schemas_are_structural(kind):
    root = version(kind)["schema"]["openAPIV3Schema"]
    for path, node in walk(root):
        assert "type" in node, f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "title", "const"):
            assert banned not in node, f"{path} has {banned}"
        if "default" in node:
            assert node["default"] is not None, path


def test_pod_template_is_preserve_unknown_but_corral_fields_are_typed():
    pt = spec_schema("SandboxTemplate")["properties"]["podTemplate"]
    assert pt["properties"]["spec"]["x-kubernetes-preserve-unknown-fields"] is True
    assert "x-kubernetes-preserve-unknown-fields" not in pt
    for kind in CRDS:
        assert "x-kubernetes-preserve-unknown-fields" not in spec_schema(kind)


def test_committed_files_load():
    assert sorted(c["metadata"]["name"] for c in load_committed()) == sorted(
        c["metadata"]["name"] for c in all_crds())


def test_server_defaults_match_the_models_and_optional_objects_stay_absent():
    from corral.api import SandboxTemplateSpec

    props = spec_schema("SandboxTemplate")["properties"]
    assert "default" not in props["networkPolicy"]  # absent means "use the secure default policy"
    assert "default" not in props["service"]
    model_default = SandboxTemplateSpec.model_fields["execd"].default_factory().to_k8s()
    assert props["execd"]["default"] == model_default
    assert spec_schema("Pool")["properties"]["capacity"]["default"] == {
        "bufferMin": 0, "bufferMax": 1, "poolMin": 0, "poolMax": 10}
