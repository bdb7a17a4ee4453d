"""The execd bundle in a real container of an image without Python: installed by put_archive, serving a command."""

from __future__ import annotations

import os
import time

import httpx
import pytest

from corral.execd import bundle, inject

pytestmark = pytest.mark.docker
IMAGE = "corral/base:bookworm"  # debootstrap minbase: no python3
WAIT = 120.0  # container start + bundle start on a loaded machine; bounded


@pytest.fixture(scope="module")
def bundle_tar():
    return bundle.ensure_bundle()


@pytest.fixture
def container(docker_client):
    c = docker_client.containers.run(
        IMAGE, ["sleep", "infinity"], detach=True, init=True, labels={"dev.corral.test": "execd-bundle"},
        ports={f"{inject.DEFAULT_PORT}/tcp": ("127.0.0.1", None)},
    )
    yield c
    c.remove(force=True)


def published_port(container) -> int:
    container.reload()
    return int(container.attrs["NetworkSettings"]["Ports"][f"{inject.DEFAULT_PORT}/tcp"][0]["HostPort"])


def test_image_has_no_python(docker_client):
    out = docker_client.containers.run(IMAGE, ["sh", "-c", "command -v python3 python || echo none"], remove=True)
    assert out.strip() == b"none"


def test_bundle_serves_a_command_in_an_image_without_python(container, bundle_tar):
    token = os.urandom(16).hex()
    t0 = time.monotonic()
    path = inject.docker_install(container, bundle_tar)
    assert path == "/opt/corral/execd/execd"
    inject.docker_start(container, token)
    url = f"http://127.0.0.1:{published_port(container)}"
    deadline = time.monotonic() + WAIT
    while True:
        try:
            if httpx.get(url + "/v1/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, container.exec_run(["sh", "-c", "ls -la /opt/corral/execd"]).output
        time.sleep(0.05)
    print(f"\nput_archive + start -> first /v1/health answer: {time.monotonic() - t0:.2f} s")
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.post(url + "/v1/command", json={"command": "true"}, timeout=30).status_code == 401
    r = httpx.post(
        url + "/v1/command", headers=headers, timeout=60,
        json={"command": "echo hello from $(cat /etc/debian_version); command -v python3 || echo no-python"},
    )
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["exit_code"] == 0
    assert out["stdout"].startswith("hello from 12") and out["stdout"].endswith("no-python\n")
    up = httpx.post(url + "/v1/files/upload", params={"path": "/tmp/x.bin"}, headers=headers,
                    content=b"\x00\xff" * 1000)
    assert up.status_code == 200
    down = httpx.get(url + "/v1/files/download", params={"path": "/tmp/x.bin"}, headers=headers)
    assert down.content == b"\x00\xff" * 1000
