"""The injection helpers as pure builders (the Docker installer runs for real in tests/docker)."""

from __future__ import annotations

import pytest

from corral.execd import inject

pytestmark = pytest.mark.execd


def test_k8s_init_container_shapes():
    init, volume, mount, env = inject.k8s_init_container("corral/execd:1", token_secret="sbx-token")
    assert init["image"] == "corral/execd:1"
    assert init["command"] == ["/opt/corral/execd/execd", "install", "/corral/execd"]
    assert init["volumeMounts"] == [{"name": volume["name"], "mountPath": "/corral/execd"}]
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert volume == {"name": "corral-execd", "emptyDir": {"sizeLimit": "256Mi"}}
    assert mount == {"name": "corral-execd", "mountPath": "/corral/execd", "readOnly": True}
    by_name = {e["name"]: e for e in env}
    assert by_name["CORRAL_EXECD_PORT"]["value"] == "44772"
    assert by_name["CORRAL_EXECD_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "sbx-token", "key": "token"}


def test_k8s_without_secret_and_custom_paths():
    init, volume, mount, env = inject.k8s_init_container("img", port=9000, mount_path="/x", volume_name="v")
    assert "CORRAL_EXECD_TOKEN" not in {e["name"] for e in env}
    assert init["command"][-1] == "/x" and mount["mountPath"] == "/x" and volume["name"] == mount["name"] == "v"


def test_wrap_entrypoint_keeps_the_original_command():
    cmd = inject.wrap_entrypoint(["python", "-m", "http.server", "8000"])
    assert cmd[:2] == ["/bin/sh", "-c"] and cmd[-4:] == ["python", "-m", "http.server", "8000"]
    assert "/corral/execd/execd &" in cmd[2] and 'exec "$@"' in cmd[2]
