"""`python -m corral.operator`'s command line: defaults, and distinct peering priorities for identical replicas."""

import importlib

main = importlib.import_module("corral.operator.__main__")


def test_defaults_all_namespaces_and_liveness():
    args = main.kopf_args(["--standalone"])
    assert args[:3] == ["run", "-m", "corral.operator.handlers"]
    assert "--all-namespaces" in args and any(a.startswith("--liveness=http://0.0.0.0:") for a in args)
    assert not any(a.startswith("--priority") for a in args)
    assert "--all-namespaces" not in main.kopf_args(["--namespace=sbx"])


def test_peered_replicas_get_distinct_priorities():
    """kopf pauses every operator when two live peers share a priority: replicas started with the same flags (a
    Deployment's) must not."""
    prios = set()
    for _ in range(50):
        (p,) = [a for a in main.kopf_args(["--peering=corral"]) if a.startswith("--priority=")]
        assert int(p.split("=")[1]) > 0
        prios.add(p)
    assert len(prios) == 50
    assert [a for a in main.kopf_args(["--peering=corral", "--priority=7"]) if a.startswith("--priority")] == [
        "--priority=7"]


def test_peer_identity_is_fixed_before_kopf_starts():
    """Corral reads kopf's peering object to know whether this replica is the active one, so it must know kopf's
    identity for itself: the pod's name under the chart, else a per-process one (two local replicas must differ)."""
    assert main.peer_identity({"POD_ID": "given"}) == "given"
    assert main.peer_identity({"CORRAL_POD_NAME": "corral-7d9-abcde"}) == "corral-7d9-abcde"
    assert main.peer_identity({}) != main.peer_identity({})
