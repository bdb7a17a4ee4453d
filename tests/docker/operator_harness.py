"""Harness for the Docker runtime tests and bench: an operator process on a real engine with a pools file made from
the template catalogue and a throwaway stack name; claim helpers that retry like a client would."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest

from corral.api import Pool
from corral.components import catalogue
from corral.operator.docker import desired as df
from corral.operator.docker import engine
from corral.operator.docker.desired import DesiredState, docker_template

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def desired_state(stack: str, *, warm: dict[str, int] | None = None, pools: list[Pool] | None = None,
                  internal: tuple[str, ...] = ()) -> DesiredState:
    templates = [
        docker_template(name, catalogue.render(name).to_k8s(), network=f"corral-{stack}-{name}",
                        internal=name in internal)
        for name in ("python", "shell")
    ]
    return DesiredState(
        stack=stack, templates=templates,
        warm_pools=[df.warm_pool(name=n, template=n.split("-")[0], replicas=r) for n, r in (warm or {}).items()],
        pools=pools or [],
    )


def list_containers(client: Any, labels: list[str]) -> list[Any]:
    """Containers (all states) with these labels. The docker SDK lists, then inspects each: one removed in between
    (a pool's surplus, or a removal the sweep found already in progress) is a 404 for the inspect: list again."""
    for _ in range(10):
        try:
            return client.containers.list(all=True, filters={"label": labels})
        except docker.errors.NotFound:
            time.sleep(0.3)
    return client.containers.list(all=True, filters={"label": labels})


@dataclass
class Operator:
    """One operator of a throwaway stack, run as `python -m corral.operator.docker` (like the image does)."""

    client: Any
    desired: DesiredState
    workdir: Path
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)   # e.g. DOCKER_HOST of a private engine

    @property
    def stack(self) -> str:
        return self.desired.stack

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def http(self, timeout: float = 180.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    def start(self) -> Operator:
        pools = self.workdir / "pools.json"
        pools.write_text(self.desired.dump())
        env = {**os.environ, "CORRAL_POOLS_FILE": str(pools), "CORRAL_STATE_DIR": str(self.workdir / "state"),
               "CORRAL_API_TOKEN": self.token, "CORRAL_API_PORT": str(self.port), "CORRAL_STACK": self.stack,
               **self.env}
        log = open(self.workdir / "operator.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "corral.operator.docker"], env=env, stdout=log,
                                     stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if httpx.get(self.url + "/v1/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"operator did not start:\n{self.log()[-4000:]}", pytrace=False)
            time.sleep(0.1)

    def log(self) -> str:
        p = self.workdir / "operator.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def reload(self, desired: DesiredState) -> None:
        self.desired = desired
        (self.workdir / "pools.json").write_text(desired.dump())
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGHUP)

    def gauge(self, pool: str, state: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=10).text
        m = re.search(rf'corral_pool_sandboxes{{namespace="{re.escape(self.stack)}",pool="{re.escape(pool)}",'
                      rf'state="{state}"}} ([0-9.e+]+)', text)
        return float(m.group(1)) if m else 0.0

    def containers(self, **labels: str) -> list[Any]:
        return list_containers(self.client, [f"{engine.L_STACK}={self.stack}", f"{engine.L_ROLE}=sandbox",
                                             *(f"{k}={v}" for k, v in labels.items())])

    def wait_idle(self, pool: str, n: int, timeout: float = 300.0) -> None:
        """Until the pool has exactly n idle ready sandboxes and nothing starting (and n containers of the pool
        that no claim holds)."""
        deadline = time.monotonic() + timeout
        while True:
            ready = self.gauge(pool, "ready")
            starting = self.gauge(pool, "idle") - ready
            if ready == n and starting == 0:
                return
            assert time.monotonic() < deadline, f"pool {pool}: {ready} ready, {starting} starting, want {n}\n" \
                                                f"{self.log()[-3000:]}"
            time.sleep(0.2)

    def sweep(self) -> None:
        engine.sweep(self.client, self.stack)



async def claim(client: httpx.AsyncClient, name: str, pool: str, *, retry_until: float | None = None) -> dict:
    """POST a claim by name; with retry_until, retry connection failures (the operator is down) with the same
    name, which is idempotent."""
    import asyncio

    while True:
        try:
            r = await client.post("/v1/claims", json={"pool": pool, "name": name, "timeoutSeconds": 300})
            if r.status_code in (201, 202):
                return r.json()
            raise AssertionError(f"{name}: {r.status_code} {r.text}")
        except httpx.TransportError:
            if retry_until is None or time.monotonic() > retry_until:
                raise
            await asyncio.sleep(0.2)


async def wait_ready(client: httpx.AsyncClient, name: str, deadline: float) -> dict:
    import asyncio

    while True:
        c = (await client.get(f"/v1/claims/{name}")).json()
        if c["phase"] != "Pending":
            return c
        assert time.monotonic() < deadline, c
        await asyncio.sleep(0.2)
