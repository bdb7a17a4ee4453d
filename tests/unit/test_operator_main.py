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
