"""kube tier: the operator as a real process against the local control plane."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from kubeutil import TOKEN_SECRET, idle_token
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

API_TOKEN = "corral-kube-api-tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class OperatorProcess:
    """`python -m corral.operator --standalone`, logging to a file; metrics scraped from its Prometheus port; its
    claims HTTP API on `api_url` (bearer `API_TOKEN`) serves the namespace `api_namespace` (created by the tests
    that use it)."""

    def __init__(self, kubeconfig: str, log_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.port = free_port()
        self.health_port = free_port()
        self.api_port = free_port()
        self.api_token = API_TOKEN
        self.api_namespace = f"api-{uuid.uuid4().hex[:8]}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.mode = ["--standalone"]  # or e.g. ["--peering=name"]
        self.env: dict[str, str] = {}  # extra environment

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.runs}.log"

    def start(self) -> None:
        self.runs += 1
        env = {**os.environ, "KUBECONFIG": self.kubeconfig, "CORRAL_TOKEN_SECRET": TOKEN_SECRET,
               "CORRAL_METRICS_PORT": str(self.port), "CORRAL_NAMESPACE": "corral-system",
               "CORRAL_EXECD_IMAGE": "corral/execd:test", "CORRAL_API_TOKEN": API_TOKEN,
               "CORRAL_API_HOST": "127.0.0.1", "CORRAL_API_PORT": str(self.api_port),
               "CORRAL_API_NAMESPACE": self.api_namespace, **self.env}
        args = [*self.mode, f"--liveness=http://127.0.0.1:{self.health_port}/healthz"]
        self.proc = subprocess.Popen([sys.executable, "-m", "corral.operator", *args], env=env,
                                     stdout=self.log_path.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=1)
                if httpx.get(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1).status_code == 200 \
                        and httpx.get(f"{self.api_url}/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"operator exited: {self.log_path.read_text()[-3000:]}")
            assert time.monotonic() < deadline, "operator metrics/health did not come up"
            time.sleep(0.2)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def metrics(self) -> dict[str, float]:
        """Every sample of the operator's /metrics as {'name{labels}': value}."""
        out: dict[str, float] = {}
        for line in httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def api_calls(self, verbs: set[str] | None = None) -> float:
        return sum(v for k, v in self.metrics().items()
                   if k.startswith("corral_api_requests_total")
                   and (verbs is None or any(f'verb="{verb}"' in k for verb in verbs)))

    def log(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log")))


@pytest.fixture(scope="session")
def operator(kube_cluster, corral_crds, tmp_path_factory):
    op = OperatorProcess(kube_cluster.kubeconfig, tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.stop()


@pytest.fixture
def ns(kube):
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


class PodExecd:
    """A real execd process standing in for the one inside a fake (kwok) pod: bound to the pod's loopback IP and
    port, with the idle token the pod's init container would derive. `token` is what `run` uses (set it to a
    claim's token once the claim has used execd)."""

    def __init__(self, endpoint: str, token: str, workdir: Path) -> None:
        host, _, port = endpoint.rpartition(":")
        self.url = f"http://{endpoint}"
        self.token = token
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "CORRAL_EXECD_HOST": host, "CORRAL_EXECD_PORT": port, "CORRAL_EXECD_TOKEN": token,
               "CORRAL_EXECD_WORKSPACE": str(workdir)}
        # its own session: kill() takes the supervisor and the server together, as a dead execd in a pod
        self.proc = subprocess.Popen([sys.executable, "-m", "corral.execd"], env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None, "execd exited"
            assert time.monotonic() < deadline, "execd did not answer"
            time.sleep(0.1)

    def run(self, command: str) -> dict:
        r = httpx.post(f"{self.url}/v1/command", json={"command": command}, timeout=30,
                       headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        return r.json()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL to execd's supervisor and its server (the whole session): execd is gone for good."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


@pytest.fixture
def pod_execd(tmp_path, kube):
    """start(sandbox) -> a live execd at that sandbox's endpoint (stopped after the test)."""
    from lightkube.resources.core_v1 import Pod

    started: list[PodExecd] = []

    def start(sandbox) -> PodExecd:
        meta = sandbox.metadata
        pod = kube.get(Pod, meta.name, namespace=meta.namespace)
        d = PodExecd((sandbox.status or {})["endpoint"], idle_token(meta.namespace, meta.name, pod.metadata.uid),
                     tmp_path / meta.name)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def http(operator, api_ns):
    """An HTTP client of the operator's claims API, with its token (`api_ns`: the test module's own namespace)."""
    with httpx.Client(base_url=operator.api_url, headers={"Authorization": f"Bearer {operator.api_token}"},
                      timeout=90) as client:
        yield client


@pytest.fixture
def uid():
    return uuid.uuid4().hex[:6]


@pytest.fixture(scope="session")
def api_ns(kube, operator):
    """The namespace the claims API serves (the operator's api_namespace): made once for every module that uses it
    (two modules each making and deleting it raced: "object is being deleted")."""
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Namespace

    name = operator.api_namespace
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)
