"""The execd tier's daemon launcher, importable by name from test modules (conftest.py is not: every tier has one)."""

from __future__ import annotations

import ctypes
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


def start_daemon(env: dict[str, str], port: int, log: Path, **popen: object) -> subprocess.Popen:
    return start(env, port, log, timeout=START_TIMEOUT, **popen)


def drop_capabilities() -> None:
    """Popen's preexec_fn: an empty capability bounding set (and no_new_privs), so the exec'd daemon has no
    capabilities even as root, as in a sandbox; its ptrace and /proc checks then work as for any other uid."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP (EINVAL past the last capability: harmless)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS


def launch(base: Path, scratch: Path | None = None, *, token_file: bool = False, unprivileged: bool = False,
           **settings: object) -> Daemon:
    """A daemon with a workspace, a second root (`scratch`, default under `base`) and an outside directory under
    `base`; `settings` become CORRAL_EXECD_<NAME> variables (e.g. `retained_output_bytes=4096`). With `token_file`
    the token comes as the operators deliver it: in `base/token` (CORRAL_EXECD_TOKEN_FILE), never in an environment.
    With `unprivileged` the daemon and its commands run without any capability (drop_capabilities)."""
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
    if token_file:
        (base / "token").write_text(TOKEN)
        del env["CORRAL_EXECD_TOKEN"]
        env["CORRAL_EXECD_TOKEN_FILE"] = str(base / "token")
    popen = {"preexec_fn": drop_capabilities} if unprivileged else {}
    proc = start_daemon(env, port, base / "execd.log", **popen)
    return Daemon(proc, f"http://127.0.0.1:{port}", port, TOKEN, workspace, scratch, outside)


def stop(d: Daemon) -> None:
    d.proc.terminate()
    try:
        d.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        d.proc.kill()
        d.proc.wait(timeout=15)
