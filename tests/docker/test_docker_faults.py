"""docker tier, faults, with the operator image in a container (as DockerStack runs it) on a private Docker Engine
that this module starts (its own data root, socket, containerd and address pool, no iptables changes), so
restarting that engine disturbs nobody else's containers:

- the operator container killed during a 50-claim burst and started again: every claim converges, none double,
  none lost;
- dockerd restarted: the warm pool converges back to N ready (operator in a container, and as a host process that
  must notice the broken event stream and resync).
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import docker
import httpx
import pytest
from operator_harness import Operator, claim, desired_state, wait_ready

from corral.components.docker_stack import OperatorProvider
from corral.operator.docker import engine
from corral.operator.docker.image import ensure_image

pytestmark = pytest.mark.docker
ENGINE_START = 90.0


DOCKER0 = subprocess.run(["ip", "-o", "-4", "addr", "show", "docker0"], capture_output=True, text=True).stdout.split()


def guard_docker0() -> None:
    """If the main engine's docker0 existed and is gone, put it back (same address) and fail loudly."""
    if not DOCKER0 or subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0:
        return
    address = DOCKER0[DOCKER0.index("inet") + 1]
    for cmd in (["ip", "link", "add", "docker0", "type", "bridge"], ["ip", "addr", "add", address, "dev", "docker0"],
                ["ip", "link", "set", "docker0", "up"]):
        subprocess.run(cmd, capture_output=True)
    pytest.fail("the private dockerd deleted the host's docker0 (restored with the same address)", pytrace=False)


@dataclass
class PrivateEngine:
    """A second dockerd. Two flags would delete the host's docker0 (moby's removeDefaultBridgeInterface) and break the
    main engine: `--bridge=none` (at start) and `--default-address-pool` (when restarted with a stored default
    network). So it gets its own pre-made bridge and the default address pools (whose allocator skips subnets that
    already have a host route), and `guard_docker0` checks after every start that the host's docker0 survived."""

    dir: Path
    bridge: str = field(default_factory=lambda: f"cfd{secrets.token_hex(3)}")
    proc: subprocess.Popen | None = None

    def make_bridge(self) -> None:
        for cmd in (["ip", "link", "add", self.bridge, "type", "bridge"],
                    ["ip", "addr", "add", "10.214.0.1/24", "dev", self.bridge],
                    ["ip", "link", "set", self.bridge, "up"]):
            subprocess.run(cmd, check=True, capture_output=True)

    def remove_bridge(self) -> None:
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    @property
    def url(self) -> str:
        return f"unix://{self.dir}/d.sock"

    def start(self) -> None:
        log = open(self.dir / "dockerd.log", "ab")
        self.proc = subprocess.Popen(
            ["/usr/sbin/dockerd", "--data-root", f"{self.dir}/data", "--exec-root", f"{self.dir}/x",
             "--pidfile", f"{self.dir}/d.pid", "-H", self.url, f"--bridge={self.bridge}", "--iptables=false",
             "--ip-masq=false", "--cgroup-parent=/corral-fault"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + ENGINE_START
        while True:
            try:
                c = docker.DockerClient(base_url=self.url, timeout=10)
                c.ping()
                c.close()
                guard_docker0()
                return
            except Exception:  # noqa: BLE001 - not up yet
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"private dockerd did not start:\n{(self.dir / 'dockerd.log').read_text()[-3000:]}",
                                pytrace=False)
                time.sleep(0.3)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    def client(self) -> docker.DockerClient:
        return docker.DockerClient(base_url=self.url, timeout=120, max_pool_size=32)


@pytest.fixture(scope="module")
def private_engine(docker_client):
    """A second dockerd on a private socket, with corral/base and the operator image copied in."""
    if not Path("/usr/sbin/dockerd").exists():
        pytest.fail("no /usr/sbin/dockerd: run scripts/docker.sh engine", pytrace=False)
    operator_image = ensure_image()
    eng = PrivateEngine(Path(tempfile.mkdtemp(prefix="cfd-", dir="/tmp")))  # short: unix socket path limits
    eng.make_bridge()
    eng.start()
    client = eng.client()
    for ref in ("corral/base:bookworm", "corral/python:bookworm", operator_image):
        client.images.load(b"".join(docker_client.api.get_image(ref)))  # by name: the tag comes along
    eng.operator_image = operator_image  # type: ignore[attr-defined]
    yield eng
    try:
        for c in client.containers.list(all=True):
            c.remove(force=True)
        for n in client.networks.list():
            if n.name not in ("bridge", "host", "none"):
                n.remove()
    finally:
        client.close()
        eng.stop()
        eng.remove_bridge()
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(f"{eng.dir}/")), key=len, reverse=True):
            subprocess.run(["umount", mount], capture_output=True)  # e.g. x/netns/default, left by dockerd
        shutil.rmtree(eng.dir, ignore_errors=True)


@dataclass
class OperatorContainer:
    """The operator container exactly as DockerStack creates it (the component's provider code), on an engine."""

    engine: PrivateEngine
    op: Operator        # for its helpers (url, token, gauges, containers); its process is never started
    container_id: str = ""

    def start(self) -> None:
        pools_dir = self.op.workdir / "etc"
        pools_dir.mkdir(exist_ok=True)
        (pools_dir / "pools.json").write_text(self.op.desired.dump())
        props = {"name": f"corral-{self.op.stack}-operator", "image": self.engine.operator_image,  # type: ignore
                 "stack": self.op.stack, "api_port": self.op.port, "pools_dir": str(pools_dir),
                 "state_volume": f"corral-{self.op.stack}-state", "token": self.op.token, "host": self.engine.url,
                 "log_level": "info"}
        self.container_id = OperatorProvider().create(props).id

    def container(self):
        return self.op.client.containers.get(self.container_id)

    def wait_api(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.op.url + "/v1/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, self.container().logs(tail=40).decode()
            time.sleep(0.2)


@pytest.fixture
def in_private_engine(private_engine, tmp_path):
    made: list[Operator] = []
    client = private_engine.client()

    def make(warm: dict[str, int], *, process: bool = False) -> OperatorContainer | Operator:
        stack = f"f{secrets.token_hex(3)}"
        op = Operator(client=client, desired=desired_state(stack, warm=warm), workdir=tmp_path / stack,
                      env={"DOCKER_HOST": private_engine.url})
        op.workdir.mkdir()
        made.append(op)
        if process:
            return op.start()
        oc = OperatorContainer(private_engine, op)
        oc.start()
        return oc

    yield make
    for op in made:
        op.stop()
        try:
            op.client.containers.get(f"corral-{op.stack}-operator").remove(force=True)
        except docker.errors.NotFound:
            pass
        engine.sweep(op.client, op.stack)
        assert not op.client.containers.list(all=True, filters={"label": f"{engine.L_STACK}={op.stack}"})
    client.close()


async def test_operator_container_killed_during_a_50_claim_burst_converges(in_private_engine):
    oc = in_private_engine({"shell": 5})
    op = oc.op
    op.wait_idle("shell", 5)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=op.url, headers=op.headers, timeout=600, limits=limits) as client:
        retry_until = time.monotonic() + 600
        tasks = [asyncio.create_task(claim(client, f"k{i:02d}", "shell", retry_until=retry_until)) for i in range(50)]
        deadline = time.monotonic() + 120
        while sum(t.done() for t in tasks) < 8:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        oc.container().kill()  # SIGKILL the operator in the middle of the burst
        served = sum(t.done() and not t.exception() for t in tasks)
        c = oc.container()
        deadline = time.monotonic() + 30
        while c.status == "running" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            c.reload()
        if c.status != "running":  # a manual kill does not trigger the restart policy: start it, like systemd would
            c.start()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 600)
        deadline = time.monotonic() + 600
        final = [await wait_ready(client, r["name"], deadline) for r in results]
        assert Counter(f["phase"] for f in final) == {"Ready": 50}, \
            [(f["name"], f["phase"], f.get("message")) for f in final if f["phase"] != "Ready"]
        listed = (await client.get("/v1/claims")).json()["items"]
        assert sorted(x["name"] for x in listed) == [f"k{i:02d}" for i in range(50)]
        sandboxes = [f["sandbox"]["name"] for f in final]
        assert len(set(sandboxes)) == 50
        for f in final[::10]:
            r = await client.post(f"/v1/claims/{f['name']}/execd/v1/command", json={"command": "true"})
            assert r.status_code == 200, r.text
    print(f"\nserved before the kill: {served}/50")
    op.wait_idle("shell", 5)
    live = {x.name for x in op.containers(**{"corral.dev/pool": "shell"})}
    assert set(sandboxes) <= live and len(live) == 55, sorted(live - set(sandboxes))


@pytest.mark.parametrize("where", ["container", "process"])
def test_dockerd_restart_pool_converges_back(in_private_engine, private_engine, where):
    made = in_private_engine({"shell": 3}, process=where == "process")
    op = made if isinstance(made, Operator) else made.op
    op.wait_idle("shell", 3)
    with op.http() as http:
        held = http.post("/v1/claims", json={"pool": "shell", "name": "held"}).json()
        assert held["phase"] == "Ready"
    op.wait_idle("shell", 3)
    before = {c.name for c in op.containers(**{"corral.dev/pool": "shell"})}

    private_engine.stop()
    private_engine.start()  # no live-restore: every container stopped; the operator container restarts by policy
    if isinstance(made, OperatorContainer):
        made.wait_api()
    # Converged: exactly 3 running sandboxes of the pool, no dead ones left, and the operator counts 3 idle ready.
    # (Polled together: right after the restart the operator's gauges still show the old, dead sandboxes.)
    deadline = time.monotonic() + 300
    while True:
        running = {c.name for c in op.client.containers.list(
            filters={"label": [f"{engine.L_STACK}={op.stack}", "corral.dev/pool=shell"]})}
        everything = {c.name for c in op.containers(**{"corral.dev/pool": "shell"})}
        try:
            ready = op.gauge("shell", "ready")
            gauges = (ready, op.gauge("shell", "idle") - ready)
        except httpx.HTTPError:
            gauges = (-1, -1)
        if len(running) == 3 and everything == running and gauges == (3, 0) and not (running & before):
            break
        assert time.monotonic() < deadline, (running, everything, gauges, op.log()[-3000:])
        time.sleep(0.25)
    assert not (running & before)
    with op.http() as http:
        lost = http.get("/v1/claims/held").json()
        assert lost["phase"] == "Failed" and "sandbox container" in lost["message"], lost  # exited or gone
        fresh = http.post("/v1/claims", json={"pool": "shell"}).json()
        assert fresh["phase"] == "Ready" and fresh["launchType"] == "warm"
        assert http.post(f"/v1/claims/{fresh['name']}/execd/v1/command", json={"command": "true"}).status_code == 200
