"""Running execd as a local process (on loopback), e.g. to try an image-less sandbox, for the execd test tier and
its benchmark: `start(env, port, log)` returns the process once its health endpoint answers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from .wire import HEALTH_PATH


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(env: dict[str, str], port: int, log: Path, *, timeout: float = 60.0, **popen: Any) -> subprocess.Popen:
    """Start `python -m corral.execd` with `env` (CORRAL_EXECD_*), logging to `log`, in its own session; wait until
    it answers on 127.0.0.1:`port` (RuntimeError with the log's tail if it exits or stays silent). `popen` goes to
    Popen (e.g. `user`/`group`, to run it as a sandbox's unprivileged uid)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "corral.execd"], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True, **popen)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"execd exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{HEALTH_PATH}", timeout=1.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"execd did not answer within {timeout}s: {log.read_text()[-2000:]}")
