"""Helpers of the cluster tier (imported by name, like tests/kube/kubeutil.py; never from a conftest): the kind
cluster and the dev stack as the tests drive them, kubectl and port-forwards, the host's kernel settings."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name
SCRIPTS = REPO / "scripts"
CLUSTER = "corral-test"          # never the user's own cluster ("corral" by default)
STACK = "dev"


def script(*args: str, timeout: float = 3600) -> str:
    """Run a scripts/ command; fail the test with its output (and the command to rerun) if it fails."""
    env = {**os.environ, "CORRAL_KIND_NAME": CLUSTER}
    proc = subprocess.run([str(SCRIPTS / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout,
                          env=env)
    if proc.returncode != 0:
        pytest.fail(f"`scripts/{' '.join(args)}` failed (exit {proc.returncode}); run it by hand to see why.\n"
                    f"--- stderr (tail) ---\n{proc.stderr[-4000:]}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""


# Kernel settings that change by themselves (counters, random pools, the kernel's own throttles) are not compared.
VOLATILE = re.compile(r"^(kernel/random/|kernel/ns_last_pid|kernel/pty/nr|fs/(file-nr|inode-nr|inode-state|"
                      r"dentry-state|aio-nr|quota/)|kernel/perf_event_max_sample_rate|net/netfilter/nf_conntrack_count|"
                      r"kernel/tainted|fs/binfmt_misc/|vm/stat_refresh|net/ipv[46]/(conf|neigh)/(?!all/|default/|lo/))")


def host_sysctls() -> dict[str, str]:
    """Every readable kernel setting of the host (this test process's namespaces), by path under /proc/sys."""
    out: dict[str, str] = {}
    for root, _, files in os.walk("/proc/sys"):
        for f in files:
            path = os.path.join(root, f)
            key = path.removeprefix("/proc/sys/")
            if VOLATILE.match(key):
                continue
            try:
                with open(path) as fh:
                    out[key] = fh.read().strip()
            except OSError:
                continue  # write-only or permission-guarded entries
    return out


@dataclass
class KindCluster:
    name: str
    kubeconfig: str
    sysctls_before: dict[str, str]

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": self.kubeconfig}

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None,
                ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["kubectl", "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True,
                              timeout=timeout, input=input, env=tool_env())
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr[-3000:]}")
        return proc

    def json(self, *args: str) -> dict:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def kill_container(self, pod: dict) -> None:
        """SIGKILL the pod's (first) container on the node, as the OOM killer does: no SIGTERM before it."""
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        proc = subprocess.run(["docker", "exec", f"{self.name}-control-plane", "crictl", "stop", "--timeout", "0",
                               cid], capture_output=True, text=True, timeout=60, env=tool_env())
        assert proc.returncode == 0, f"crictl stop {cid}: {proc.stderr[-2000:]}"

    @contextmanager
    def port_forward(self, namespace: str, target: str, port: int) -> Iterator[int]:
        """`kubectl port-forward` to 127.0.0.1:<a free port>; yields that port."""
        proc = subprocess.Popen(["kubectl", "--kubeconfig", self.kubeconfig, "-n", namespace, "port-forward",
                                 "--address", "127.0.0.1", target, f":{port}"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=tool_env())
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            m = re.search(r"127\.0\.0\.1:(\d+)", line)
            assert m, f"port-forward did not start: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
            yield int(m.group(1))
        finally:
            proc.terminate()
            proc.wait(timeout=10)


_TOOL_ENV: dict[str, str] | None = None


def tool_env() -> dict[str, str]:
    global _TOOL_ENV
    if _TOOL_ENV is None:
        out = subprocess.run(["bash", "-c", f'eval "$({SCRIPTS}/env.sh)" && env -0'], capture_output=True, check=True)
        _TOOL_ENV = dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    return _TOOL_ENV


@dataclass
class DevStack:
    project: Path
    env: dict[str, str]
    outputs: dict

    def pulumi(self, *args: str, check: bool = True, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(["pulumi", *args], cwd=self.project, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"pulumi {' '.join(args)} exited {proc.returncode}\n--- stdout ---\n"
                                 f"{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")
        return proc

    def configure(self, pairs: list[tuple[str, str]]) -> None:
        """`pulumi config set --path KEY VALUE` for each pair, as a user changes the stack."""
        for key, value in pairs:
            self.pulumi("config", "set", "--path", key, value, "--stack", STACK)

    def unset(self, *keys: str) -> None:
        """`pulumi config rm --path KEY` for each key (one not set is no error)."""
        for key in keys:
            self.pulumi("config", "rm", "--path", key, "--stack", STACK, check=False)

    def up(self) -> None:
        """`pulumi up`, then the stack's outputs read again."""
        self.pulumi("up", "--stack", STACK, "--yes", "--non-interactive", "--skip-preview")
        self.outputs = json.loads(self.pulumi("stack", "output", "--stack", STACK, "--json", "--show-secrets").stdout)


# What this machine's single 2-core node can hold next to the control plane: the dev stack's pools with small
# requests, and a Pool whose claims are all cold (no idle buffer). The values change; the stack file does not.
STACK_CONFIG = [
    ("corral:templates[0].params.cpu", "50m"),        # python
    ("corral:templates[0].params.memory", "256Mi"),
    ("corral:templates[2].params.cpu", "50m"),        # shell
    ("corral:templates[2].params.memory", "128Mi"),
    ("corral:warmPools[0].replicas", "3"),            # python: a WarmPool of 3
    ("corral:warmPools[1].replicas", "0"),            # node: its image is not loaded into this cluster
    ("corral:pools[0].capacity.bufferMin", "0"),
    ("corral:pools[0].capacity.bufferMax", "0"),
    ("corral:controller.values.resources.requests.cpu", "100m"),
]
