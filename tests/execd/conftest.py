"""execd tier fixtures: one real daemon process on loopback (as it runs in a sandbox), and clients for it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from execdutil import Daemon, launch, stop


@pytest.fixture(scope="session")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = launch(tmp_path_factory.mktemp("execd"))
    yield d
    stop(d)


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
