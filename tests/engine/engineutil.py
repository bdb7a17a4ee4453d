"""Helpers shared by the engine tests (imported by name, like tests/kube/kubeutil.py; never from a conftest)."""

from __future__ import annotations

import time

from lightkube import ApiError
from lightkube.resources.core_v1 import Namespace


def gone(kube, res, name: str, namespace: str | None = None) -> bool:
    """Whether the object is gone (404; any other error fails the test)."""
    try:
        kube.get(res, name, namespace=namespace) if namespace else kube.get(res, name)
    except ApiError as exc:
        assert exc.status.code == 404, exc
        return True
    return False


def wait_namespace_gone(kube, name: str, timeout: float) -> None:
    """Wait until the namespace is deleted; fail naming it if it outlives `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not gone(kube, Namespace, name):
        assert time.monotonic() < deadline, f"namespace {name} still exists"
        time.sleep(0.5)
