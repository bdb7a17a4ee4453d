"""Harness for the SDK/CLI tests: a local stack's operator *container*, created exactly as DockerStack creates it (the
component's OperatorProvider) on the real engine, with the local stack's pools (warm `python`, Pool `shell`) plus a
`shell-noop` Pool whose release recycles the sandbox in place (for the soak); and /proc readers that count a
process tree's file descriptors and TCP connections."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from operator_harness import REPO, Operator, desired_state, free_port

from corral.components.docker_stack import OperatorProvider
from corral.operator.docker import desired as df
from corral.operator.docker import engine
from corral.operator.docker.image import ensure_image

CORRAL = str(Path(sys.executable).with_name("corral"))


@dataclass
class LocalStack:
    op: Operator
    container_id: str

    @property
    def url(self) -> str:
        return self.op.url

    @property
    def token(self) -> str:
        return self.op.token

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a user of this stack has: the API address and token, no config file."""
        return {**os.environ, "CORRAL_API_URL": self.url, "CORRAL_API_TOKEN": self.token,
                "CORRAL_CONFIG": str(self.op.workdir / "no-such-config.toml"), **extra}

    def container(self) -> Any:
        return self.op.client.containers.get(self.container_id)

    def operator_pids(self) -> list[int]:
        """The operator container's processes as host pids (docker-init and the operator under it)."""
        root = int(self.container().attrs["State"]["Pid"])
        return [root, *descendants(root)]

    def corral(self, *args: str, timeout: float = 300, **kw: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CORRAL, *args], env=self.env(), capture_output=True, text=True, timeout=timeout, **kw)


def start_stack(docker_client: Any, workdir: Path) -> LocalStack:
    image = ensure_image()
    stack = f"c{secrets.token_hex(3)}"
    pools = [df.pool(name="shell", template="shell", buffer_min=1, buffer_max=2, pool_max=10),
             df.pool(name="shell-noop", template="shell", buffer_min=1, buffer_max=2, pool_max=4,
                      recycle_strategy="Noop")]
    op = Operator(client=docker_client, desired=desired_state(stack, warm={"python": 2}, pools=pools),
                  workdir=workdir / stack, port=free_port())
    op.workdir.mkdir(parents=True)
    pools_dir = op.workdir / "etc"
    pools_dir.mkdir()
    (pools_dir / "pools.json").write_text(op.desired.dump())
    props = {"name": f"corral-{stack}-operator", "image": image, "stack": stack, "api_port": op.port,
             "pools_dir": str(pools_dir), "state_volume": f"corral-{stack}-state", "token": op.token, "host": None,
             "log_level": "info"}
    created = OperatorProvider().create(props)  # waits until the API answers
    return LocalStack(op=op, container_id=created.id)


def stop_stack(s: LocalStack) -> None:
    client = s.op.client
    try:
        c = client.containers.get(s.container_id)
        c.stop(timeout=10)
        c.remove(force=True)
    except Exception:  # noqa: BLE001 - already gone
        pass
    engine.sweep(client, s.op.stack)
    try:
        client.volumes.get(f"corral-{s.op.stack}-state").remove(force=True)
    except Exception:  # noqa: BLE001
        pass
    left = client.containers.list(all=True, filters={"label": f"{engine.L_STACK}={s.op.stack}"})
    assert not left, f"containers of stack {s.op.stack} left behind: {[c.name for c in left]}"


@pytest.fixture(scope="module")
def local_stack(docker_client, tmp_path_factory) -> Iterator[LocalStack]:
    s = start_stack(docker_client, tmp_path_factory.mktemp("client-stack"))
    s.op.wait_idle("python", 2)
    s.op.wait_idle("shell", 1)
    s.op.wait_idle("shell-noop", 1)
    yield s
    stop_stack(s)


# --- /proc ----------------------------------------------------------------------------------------------------------
def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _tcp_table(pid: int) -> dict[int, tuple[str, int, int]]:
    """socket inode -> (state, local port, remote port) in the network namespace of pid."""
    table = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            table[int(f[9])] = (f[3], int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16))
    return table


@dataclass(frozen=True)
class Usage:
    fds: int          # open file descriptors of the process tree
    tcp: int          # its established TCP connections
    sockets: int      # all its sockets (TCP, unix, ...)
    conns: frozenset[tuple[int, int]] = frozenset()   # (local port, remote port) of those connections

    def __str__(self) -> str:
        return f"{self.fds} fds, {self.tcp} TCP connections, {self.sockets} sockets"


def usage(pids: list[int]) -> Usage:
    fds = tcp = sockets = 0
    conns = set()
    table = _tcp_table(pids[0])
    for pid in pids:
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            fds += 1
            if m := re.fullmatch(r"socket:\[(\d+)\]", target):
                sockets += 1
                state, lport, rport = table.get(int(m.group(1)), ("", 0, 0))
                if state == "01":  # ESTABLISHED
                    tcp += 1
                    conns.add((lport, rport))
    return Usage(fds, tcp, sockets, frozenset(conns))


def readme_section(title: str = "## SDK and CLI") -> str:
    text = (REPO / "README.md").read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start:end if end != -1 else len(text)]


def code_blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", section, flags=re.S | re.M)


def tmux() -> str:
    path = shutil.which("tmux")
    if not path:
        pytest.fail("tmux is missing: run scripts/setup.sh (it installs tmux) or apt-get install tmux", pytrace=False)
    return path
