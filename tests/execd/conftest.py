"""execd tier fixtures: one real daemon process on loopback (as it runs in a sandbox), and clients for it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from corral.execd.local import free_port, start

TOKEN = "test-token-" + os.urandom(8).hex()
START_TIMEOUT = 60.0  # the machine is shared with long builds: generous, but bounded


@dataclass
class Daemon:
    proc: subprocess.Popen
    url: str
    port: int
    token: str
    workspace: Path
    scratch: Path  # a second allowed root
    outside: Path  # exists, but outside every allowed root

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=kw.pop("timeout", 60.0), **kw)


def start_daemon(env: dict[str, str], port: int, log: Path) -> subprocess.Popen:
    return start(env, port, log, timeout=START_TIMEOUT)


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("execd")
    workspace, scratch, outside = base / "workspace", base / "scratch", base / "outside"
    for d in (workspace, scratch, outside):
        d.mkdir()
    (outside / "secret.txt").write_text("not for you")
    port = free_port()
    env = {
        **os.environ,
        "CORRAL_EXECD_TOKEN": TOKEN,
        "CORRAL_EXECD_HOST": "127.0.0.1",
        "CORRAL_EXECD_PORT": str(port),
        "CORRAL_EXECD_WORKSPACE": str(workspace),
        "CORRAL_EXECD_ROOTS": f"{workspace},{scratch}",
        "CORRAL_EXECD_LOG_LEVEL": "warning",
    }
    proc = start_daemon(env, port, base / "execd.log")
    yield Daemon(proc, f"http://127.0.0.1:{port}", port, TOKEN, workspace, scratch, outside)
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=15)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with daemon.client() as c:
        yield c


@pytest.fixture
def ws_dir(daemon: Daemon, request: pytest.FixtureRequest) -> Path:
    """A fresh directory inside the workspace root for one test."""
    path = daemon.workspace / request.node.name.replace("[", "_").replace("]", "_").replace("/", "_")
    path.mkdir()
    return path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.execd)
