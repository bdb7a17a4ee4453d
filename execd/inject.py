"""Putting execd into sandboxes whose images know nothing about it (as OpenSandbox does).

- Kubernetes: `k8s_init_container(image)` gives an initContainer that copies the bundle from the execd image into an
  emptyDir, the volume, the mount for the sandbox container and execd's env; `wrap_entrypoint` starts execd before the
  container's own entrypoint. Pure builders: plain dicts, no client, no cluster.
- Docker: `docker_install(container, tar)` puts the bundle into a container with put_archive, onto its rootfs
  (put_archive into a `--tmpfs` path is silently lost, so never there); `docker_start` starts it with exec.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from .bundle import INSTALL_DIR
from .settings import DEFAULT_PORT

VOLUME = "corral-execd"
MOUNT = "/corral/execd"  # where the sandbox container sees the bundle on Kubernetes
TOKEN_VOLUME = "corral-execd-token"
TOKEN_MOUNT = "/corral/execd-token"  # a memory-backed emptyDir holding the token file until execd deletes it
TOKEN_FILE = f"{TOKEN_MOUNT}/token"
KEY_VOLUME = "corral-execd-key"
KEY_MOUNT = "/corral/execd-key"  # the namespace's key Secret, mounted into the init container alone
EXECUTABLE = "execd"


def k8s_init_container(
    image: str,
    *,
    token_secret: str | None = None,
    token_key: str = "token",
    port: int = DEFAULT_PORT,
    workspace: str = "/workspace",
    mount_path: str = MOUNT,
    volume_name: str = VOLUME,
    image_pull_policy: str = "IfNotPresent",
    resources: dict[str, Any] | None = None,
    size_limit: str = "256Mi",
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(initContainer, volume, volumeMount for the sandbox container, env for the sandbox container).

    The execd image holds the bundle at /opt/corral/execd; the initContainer runs `execd install <mount>` (the bundle
    copies itself, so the image needs no shell). With a token (`token_secret[token_key]`), the initContainer alone
    gets it in its env and writes it to TOKEN_FILE (`k8s_token_volume`), which execd reads and deletes: the sandbox
    container's spec and environment never hold it. Without one, the caller must deliver the token itself.
    """
    init = {
        "name": "corral-execd-install",
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "command": [f"{INSTALL_DIR}/{EXECUTABLE}", "install", mount_path],
        "volumeMounts": [{"name": volume_name, "mountPath": mount_path}],
        "resources": resources or {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    volume = {"name": volume_name, "emptyDir": {"sizeLimit": size_limit}}
    mount = {"name": volume_name, "mountPath": mount_path, "readOnly": True}
    env: list[dict[str, Any]] = [
        {"name": "CORRAL_EXECD_PORT", "value": str(port)},
        {"name": "CORRAL_EXECD_WORKSPACE", "value": workspace},
    ]
    if token_secret:
        _token_to_file(init, env, {"valueFrom": {"secretKeyRef": {"name": token_secret, "key": token_key}}})
    return init, volume, mount, env


def _token_to_file(init: dict[str, Any], env: list[dict[str, Any]], value: dict[str, Any]) -> None:
    init["command"].append(TOKEN_FILE)
    init["env"] = [{"name": "CORRAL_EXECD_TOKEN", **value}]
    init["volumeMounts"].append({"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT})
    env.append({"name": "CORRAL_EXECD_TOKEN_FILE", "value": TOKEN_FILE})


def k8s_token_volume(init: dict[str, Any], env: list[dict[str, Any]], token: str | None = None
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(volume, volumeMount for the sandbox container) of the token file; with `token`, `init` is given it as a
    plain value (else k8s_init_container's `token_secret` did it). The volume is memory-backed and writable, so
    execd can delete the file once read."""
    if token is not None:
        _token_to_file(init, env, {"value": token})
    return ({"name": TOKEN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT})


def k8s_key_secret(init: dict[str, Any], env: list[dict[str, Any]], secret: str, key: str = "key"
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(volumes, volumeMount for the sandbox container) so that the init container derives execd's first token itself
    (server.bootstrap_token) from the key in Secret `secret` (mounted into the init container alone) and the pod's
    namespace, name and uid (downward API): no token in the pod spec, in any environment or in a file the sandbox
    container can read once execd has taken it."""
    init["command"].append(TOKEN_FILE)
    init["env"] = [{"name": "CORRAL_EXECD_KEY_FILE", "value": f"{KEY_MOUNT}/{key}"}] + [
        {"name": f"CORRAL_EXECD_POD_{part}", "valueFrom": {"fieldRef": {"fieldPath": f"metadata.{field}"}}}
        for part, field in (("NAMESPACE", "namespace"), ("NAME", "name"), ("UID", "uid"))]
    init["volumeMounts"].extend([{"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT},
                                 {"name": KEY_VOLUME, "mountPath": KEY_MOUNT, "readOnly": True}])
    env.append({"name": "CORRAL_EXECD_TOKEN_FILE", "value": TOKEN_FILE})
    volumes = [{"name": TOKEN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
               {"name": KEY_VOLUME, "secret": {"secretName": secret, "items": [{"key": key, "path": key}]}}]
    return volumes, {"name": TOKEN_VOLUME, "mountPath": TOKEN_MOUNT}


def wrap_entrypoint(entrypoint: list[str], *, mount_path: str = MOUNT) -> list[str]:
    """The sandbox container's command: start execd in the background, then exec the original entrypoint (which
    keeps PID 1 and its signals). execd supervises itself (a forked server, started again if it dies). Needs /bin/sh
    in the sandbox image, which every glibc base image has."""
    execd = shlex.quote(f"{mount_path}/{EXECUTABLE}")
    return ["/bin/sh", "-c", f'{execd} & exec "$@"', "corral-execd", *entrypoint]


def docker_install(container: Any, bundle_tar_path: str | Path) -> str:
    """Copy the bundle into a (running or created) container's rootfs; returns the executable's path in it."""
    with open(bundle_tar_path, "rb") as data:
        if not container.put_archive("/", data):
            raise RuntimeError(f"put_archive of {bundle_tar_path} into {container.name} failed")
    return f"{INSTALL_DIR}/{EXECUTABLE}"


def docker_start(
    container: Any, token: str, *, port: int = DEFAULT_PORT, env: dict[str, str] | None = None, user: str = ""
) -> None:
    """Start the installed execd inside the container (detached exec), listening on all of its interfaces."""
    environment = {"CORRAL_EXECD_TOKEN": token, "CORRAL_EXECD_PORT": str(port), **(env or {})}
    container.exec_run([f"{INSTALL_DIR}/{EXECUTABLE}"], environment=environment, detach=True, user=user)
