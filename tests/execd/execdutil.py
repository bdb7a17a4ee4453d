"""The execd tier's daemon launcher, importable by name from test modules (conftest.py is not: every tier has one)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import httpx

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


def launch(base: Path, scratch: Path | None = None, **settings: object) -> Daemon:
    """A daemon with a workspace, a second root (`scratch`, default under `base`) and an outside directory under
    `base`; `settings` become CORRAL_EXECD_<NAME> variables (e.g. `retained_output_bytes=4096`)."""
    workspace, outside = base / "workspace", base / "outside"
    scratch = scratch or base / "scratch"
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
        **{f"CORRAL_EXECD_{k.upper()}": str(v) for k, v in settings.items()},
    }
    proc = start_daemon(env, port, base / "execd.log")
    return Daemon(proc, f"http://127.0.0.1:{port}", port, TOKEN, workspace, scratch, outside)


def stop(d: Daemon) -> None:
    d.proc.terminate()
    try:
        d.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        d.proc.wait(timeout=15)
