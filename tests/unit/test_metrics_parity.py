"""The Kubernetes operator and the Docker runtime expose the same claim and pool metrics: same names, same labels.

Each runtime's entry module is imported in a process of its own (as in production, where each is its own process),
and the metrics it registers are read from its default registry."""

from __future__ import annotations

import json
import subprocess
import sys

DUMP = """
import json, sys, importlib
importlib.import_module(sys.argv[1])
from prometheus_client import REGISTRY
out = {}
for collector in list(REGISTRY._collector_to_names):
    if hasattr(collector, "_labelnames") and collector._name.startswith("corral_"):
        out[collector._name] = sorted(collector._labelnames)
print(json.dumps(out))
"""


def registry_of(module: str) -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", DUMP, module], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_docker_and_kubernetes_registries_share_names_and_labels():
    kube = registry_of("corral.operator.handlers")         # the kopf operator (python -m corral.operator)
    docker = registry_of("corral.operator.docker.main")     # the Docker runtime (python -m corral.operator.docker)
    shared = {"corral_claim_latency_seconds": ["launch_type", "pool"],
              "corral_claims": ["launch_type", "outcome", "pool"],        # exposed as corral_claims_total
              "corral_pool_sandboxes": ["namespace", "pool", "state"],
              "corral_batch_duration_seconds": ["phase", "pool"],
              "corral_batch_tasks": ["outcome", "pool"],                 # exposed as corral_batch_tasks_total
              "corral_batch_tasks_running": ["namespace", "pool"]}
    for name, labels in shared.items():
        assert kube.get(name) == labels, (name, kube.get(name))
        assert docker.get(name) == labels, (name, docker.get(name))
    both = set(kube) & set(docker)
    assert both == set(shared), f"a runtime-specific metric reuses a name: {sorted(both - set(shared))}"
    assert {n: kube[n] for n in both} == {n: docker[n] for n in both}
