"""Tier fixtures: each brings up exactly what its tier needs, once per session, and tears down what it started.

A tier whose tool is missing fails with the command that builds it; nothing is skipped silently.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"


def run_script(*args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    """Run a scripts/ command; on failure, fail the test with its output and the command to rerun by hand."""
    proc = subprocess.run([str(SCRIPTS / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(
            f"`scripts/{' '.join(args)}` failed (exit {proc.returncode}); run it by hand to see why.\n"
            f"--- stderr (tail) ---\n{proc.stderr[-4000:]}",
            pytrace=False,
        )
    return proc


@pytest.fixture(scope="session")
def docker_client():
    """A client of a real Docker Engine with Corral's base images loaded (starts dockerd if none answers)."""
    import docker

    run_script("docker.sh", "all")
    client = docker.from_env()
    yield client
    client.close()
