"""docker tier: a container of the locally built python image serves HTTP on a port published on 127.0.0.1 only."""

import time
import uuid

import httpx
import pytest

pytestmark = pytest.mark.docker


def test_python_image_serves_on_a_loopback_port(docker_client):
    name = f"corral-test-{uuid.uuid4().hex[:8]}"
    container = docker_client.containers.run(
        "corral/python:bookworm",
        ["python3", "-m", "http.server", "8000", "--directory", "/etc"],
        name=name, detach=True, init=True, ports={"8000/tcp": ("127.0.0.1", None)},
        labels={"dev.corral.test": "testbed"},
    )
    try:
        container.reload()
        bindings = container.attrs["NetworkSettings"]["Ports"]["8000/tcp"]
        assert bindings and all(b["HostIp"] == "127.0.0.1" for b in bindings), bindings
        url = f"http://127.0.0.1:{bindings[0]['HostPort']}/os-release"
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(url, timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, container.logs().decode()[-2000:]
                time.sleep(0.2)
        assert r.status_code == 200 and "Debian" in r.text
        version = container.exec_run(["python3", "--version"]).output.decode()
        assert version.startswith("Python 3.11")
    finally:
        container.remove(force=True)


def test_base_image_has_no_python(docker_client):
    out = docker_client.containers.run("corral/base:bookworm", ["sh", "-c", "command -v python3 || echo none"],
                                       remove=True)
    assert out.decode().strip() == "none"
