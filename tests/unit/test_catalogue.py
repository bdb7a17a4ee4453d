"""The Jinja2 catalogue renders specs the models accept and refuses unknown names and parameters."""

import pytest

from corral.api import SandboxTemplateSpec
from corral.components import catalogue


def test_catalogue_has_at_least_three_templates():
    assert {"python", "node", "shell"} <= set(catalogue.names())


@pytest.mark.parametrize("name", catalogue.names())
def test_each_entry_renders_a_valid_spec(name):
    spec = catalogue.render(name)
    assert isinstance(spec, SandboxTemplateSpec)
    assert spec.pod_template.spec["containers"][0]["name"] == "sandbox"


def test_parameters_are_applied():
    spec = catalogue.render("python", {"image": "example.com/py:3", "memory": "2Gi"})
    c = spec.pod_template.spec["containers"][0]
    assert c["image"] == "example.com/py:3" and c["resources"]["limits"]["memory"] == "2Gi"


def test_unknown_parameter_and_name_are_named():
    with pytest.raises(catalogue.CatalogueError, match="memroy"):
        catalogue.render("python", {"memroy": "1Gi"})
    with pytest.raises(catalogue.CatalogueError, match="unknown catalogue template 'ruby'"):
        catalogue.render("ruby")


def test_strict_undefined(tmp_path, monkeypatch):
    (tmp_path / "broken.yaml.j2").write_text("podTemplate: {{ missing.attr }}\n")
    monkeypatch.setattr(catalogue, "TEMPLATES_DIR", tmp_path)
    catalogue._env.cache_clear()
    try:
        with pytest.raises(catalogue.CatalogueError, match="has no attribute .attr."):
            catalogue.render("broken", {"missing": {}})
    finally:
        catalogue._env.cache_clear()


@pytest.mark.parametrize("name", catalogue.names())
def test_the_working_directory_is_a_volume_the_sandbox_user_can_write(name):
    """On a real node a workingDir missing from the image is created by the runtime, owned by root: the sandbox user
    (uid 1000) could not write its own workspace. Each catalogue entry mounts a volume there (fsGroup makes it the
    sandbox's)."""
    pod = catalogue.render(name).to_k8s()["podTemplate"]["spec"]
    main = pod["containers"][0]
    mounts = {m["mountPath"]: m["name"] for m in main.get("volumeMounts", [])}
    assert main["workingDir"] in mounts
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    assert "emptyDir" in volumes[mounts[main["workingDir"]]]
