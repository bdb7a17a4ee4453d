"""The injection helpers as pure builders (the Docker installer runs for real in tests/docker)."""

from __future__ import annotations

import pytest

from corral.execd import inject

pytestmark = pytest.mark.execd


def test_k8s_init_container_shapes():
    init, volume, mount, env = inject.k8s_init_container("corral/execd:1", token_secret="sbx-token")
    assert init["image"] == "corral/execd:1"
    assert init["command"] == ["/opt/corral/execd/execd", "install", "/corral/execd", inject.TOKEN_FILE]
    assert init["volumeMounts"] == [{"name": volume["name"], "mountPath": "/corral/execd"},
                                    {"name": inject.TOKEN_VOLUME, "mountPath": inject.TOKEN_MOUNT}]
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert volume == {"name": "corral-execd", "emptyDir": {"sizeLimit": "256Mi"}}
    assert mount == {"name": "corral-execd", "mountPath": "/corral/execd", "readOnly": True}
    by_name = {e["name"]: e for e in env}
    assert by_name["CORRAL_EXECD_PORT"]["value"] == "44772"
    assert by_name["CORRAL_EXECD_TOKEN_FILE"]["value"] == inject.TOKEN_FILE
    assert "CORRAL_EXECD_TOKEN" not in by_name  # only the init container has it
    assert init["env"] == [{"name": "CORRAL_EXECD_TOKEN",
                            "valueFrom": {"secretKeyRef": {"name": "sbx-token", "key": "token"}}}]


def test_k8s_without_secret_and_custom_paths():
    init, volume, mount, env = inject.k8s_init_container("img", port=9000, mount_path="/x", volume_name="v")
    assert not {"CORRAL_EXECD_TOKEN", "CORRAL_EXECD_TOKEN_FILE"} & {e["name"] for e in env} and "env" not in init
    assert init["command"][-1] == "/x" and mount["mountPath"] == "/x" and volume["name"] == mount["name"] == "v"


def test_wrap_entrypoint_keeps_the_original_command():
    cmd = inject.wrap_entrypoint(["python", "-m", "http.server", "8000"])
    assert cmd[:2] == ["/bin/sh", "-c"] and cmd[-4:] == ["python", "-m", "http.server", "8000"]
    assert "/corral/execd/execd &" in cmd[2] and 'exec "$@"' in cmd[2]


def test_install_writes_the_token_file_for_the_uid_alone(tmp_path, monkeypatch):
    from corral.execd.server import take_token, write_token

    monkeypatch.setenv("CORRAL_EXECD_TOKEN", "from-the-init-container")
    write_token(str(tmp_path / "token"))
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o400
    env = {"CORRAL_EXECD_TOKEN_FILE": str(tmp_path / "token")}
    assert take_token(env) == "from-the-init-container"
    assert env == {} and not (tmp_path / "token").exists()
