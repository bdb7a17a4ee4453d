"""One domain core, two runtimes: the same claim and pool scenarios through the Kubernetes runtime's entry points
(reconcile.claims, reconcile.pools, the claims API's kube_backend) and the Docker runtime's (docker.claims,
docker.pools, the pools file), with the same outcome. Copies of the pre-core functions show the table catches the
drift it was written for (Docker's env policy, the Kubernetes claims API's Pool default)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from corral.api import SandboxClaimSpec, SandboxTemplateSpec, WarmPoolSpec
from corral.api.wire import ClaimRequest
from corral.components import catalogue
from corral.operator.claimsapi import kube_backend
from corral.operator.core import lifecycle
from corral.operator.docker import claims as docker_claims
from corral.operator.docker import desired as df
from corral.operator.docker import pools as docker_pools
from corral.operator.docker.store import SandboxRow
from corral.operator.planning import Plan, plan_warm_pool
from corral.operator.reconcile import claims as kube_claims
from corral.operator.reconcile import pools as kube_pools

TEMPLATE_ENV = {"GREETING": "hello"}


def template_spec(env_policy: str = "Disallowed", volume_policy: str = "Disallowed") -> dict:
    spec = catalogue.render("shell").to_k8s()
    spec["podTemplate"]["spec"]["containers"][0]["env"] = [{"name": k, "value": v} for k, v in TEMPLATE_ENV.items()]
    return {**spec, "envVarsInjectionPolicy": env_policy, "volumeClaimTemplatesPolicy": volume_policy}


# --- the two runtimes' admission entry points ----------------------------------------------------------------------
def kube_admission(env: dict[str, str], tspec: dict, volumes: int = 0) -> str | None:
    claim = SandboxClaimSpec.model_validate({
        "poolRef": {"name": "p"}, "env": [{"name": k, "value": v} for k, v in env.items()],
        "volumeClaimTemplates": [{"name": f"v{i}", "spec": {}} for i in range(volumes)]})
    refusal = kube_claims.admission(claim, SandboxTemplateSpec.model_validate(tspec))
    return refusal.reason if refusal else None


def docker_admission(env: dict[str, str], tspec: dict) -> str | None:
    tmpl = df.docker_template("shell", tspec, network="n")
    refusal = docker_claims.admission(ClaimRequest(pool="p", env=env), tmpl)
    return refusal.reason if refusal else None


ENV_CASES = [  # (policy, claim env, expected reason)
    ("Disallowed", {}, None),
    ("Disallowed", {"NEW": "1"}, "EnvVarsNotAllowed"),
    ("Allowed", {"NEW": "1"}, None),
    ("Allowed", {"GREETING": "bye"}, "EnvVarsNotAllowed"),           # a clash with the template's env
    ("Allowed", {"NEW": "1", "GREETING": "bye"}, "EnvVarsNotAllowed"),
    ("Overrides", {"GREETING": "bye"}, None),
    ("Overrides", {"NEW": "1"}, None),
]


@pytest.mark.parametrize(("policy", "env", "expected"), ENV_CASES)
def test_env_policy_is_the_same_in_both_runtimes(policy, env, expected):
    tspec = template_spec(env_policy=policy)
    assert kube_admission(env, tspec) == expected
    assert docker_admission(env, tspec) == expected


@pytest.mark.parametrize(("policy", "volumes", "expected"), [
    ("Disallowed", 0, None), ("Disallowed", 1, "VolumesNotAllowed"), ("Allowed", 2, None), ("Overrides", 1, None)])
def test_volume_policy(policy, volumes, expected):
    assert kube_admission({}, template_spec(volume_policy=policy), volumes) == expected
    # The Docker runtime's claims take no volumes: its API refuses the field at the edge (422), not later.
    with pytest.raises(ValueError, match="volumeClaimTemplates"):
        ClaimRequest.model_validate({"pool": "p", "volumeClaimTemplates": [{"name": "v", "spec": {}}]})


# --- desired size ---------------------------------------------------------------------------------------------------
POOL_CASES = [  # (flat DockerStack args of a Pool, allocated, desired)
    ({}, 3, 3),                                     # bufferMin defaults to 0 (the model's), not 1
    ({}, 0, 0),
    ({"buffer_min": 1, "buffer_max": 2}, 0, 1),
    ({"pool_min": 2}, 0, 2),                        # the floor
    ({"buffer_min": 2, "buffer_max": 2, "pool_max": 3}, 5, 3),  # the ceiling
    ({"buffer_min": 1, "buffer_max": 1, "pool_min": 1, "pool_max": 1}, 1, 1),
]


def _camel(flat: dict) -> dict:
    names = {"buffer_min": "bufferMin", "buffer_max": "bufferMax", "pool_min": "poolMin", "pool_max": "poolMax"}
    return {names[k]: v for k, v in flat.items()}


@pytest.mark.parametrize(("flat", "allocated", "expected"), POOL_CASES)
def test_pool_desired_size_is_the_same_in_both_runtimes(flat, allocated, expected):
    raw = {"templateRef": {"name": "t"}, **({"capacity": _camel(flat)} if flat else {})}  # the CR as written
    assert kube_backend.desired_size("Pool", raw, allocated) == expected
    assert docker_pools.desired_size(df.pool("p", "t", **flat), allocated) == expected


def test_warm_pool_desired_size():
    assert kube_backend.desired_size("WarmPool", {"templateRef": {"name": "t"}, "replicas": 4}, 9) == 4
    assert docker_pools.desired_size(df.warm_pool("w", "t", 4), 9) == 4
    assert kube_backend.desired_size("WarmPool", {"templateRef": {"name": "t"}}, 0) == 1  # the model's default


# --- readiness grace ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("grace", "age", "replaced"), [(None, 299, False), (None, 301, True), (60, 59, False),
                                                        (60, 61, True), (3600, 400, False)])
def test_readiness_grace_is_the_pools_in_both_runtimes(grace, age, replaced):
    now = time.time()
    tmpl = df.docker_template("shell", template_spec(), network="n")
    wp = df.warm_pool("wp", "shell", 1, readiness_grace_seconds=grace)
    row = SandboxRow(name="sb", template="shell", state="creating", created=now - age, pool="wp", pool_kind="WarmPool",
                     hash=tmpl.blueprint_hash())
    plan = docker_pools.plan_round(df.DesiredState(stack="s", templates=[tmpl], warm_pools=[wp]), "wp", [row],
                                   now).plan
    assert ([m.name for m in plan.delete] == ["sb"]) is replaced
    # Kubernetes: the reconciler validates the WarmPool and plans with the core's grace of that spec.
    spec = WarmPoolSpec.model_validate(wp.spec.to_k8s())
    kplan = plan_warm_pool(replicas=1, idle=[row.member()], current_hash=tmpl.blueprint_hash(), strategy="OnReplenish",
                           expected_creates=0, now=now, readiness_grace=lifecycle.readiness_grace(spec))
    assert [m.name for m in kplan.delete] == [m.name for m in plan.delete]


def test_a_docker_pool_takes_readiness_grace_as_a_pool_does():
    assert df.pool("p", "shell").spec.readiness_grace_seconds == 300  # the model's default
    assert df.pool("p", "shell", readiness_grace_seconds=45).spec.readiness_grace_seconds == 45


# --- slow start with the batch cap ----------------------------------------------------------------------------------
async def _kube_batches(n: int, cap: int) -> list[int]:
    sizes: list[int] = []
    in_batch = [0]

    async def make() -> None:
        in_batch[0] += 1
        await asyncio.sleep(0)
        if in_batch[0]:
            sizes.append(in_batch[0])
            in_batch[0] = 0

    await kube_pools.run_batches(n, make, cap)
    return sizes


async def _docker_batches(n: int, cap: int) -> list[int]:
    """Drive the Docker pool worker (PoolWorkers.work) until the pool is full; each plan round asks for what is
    missing, as plan_round would."""
    sizes: list[int] = []
    made = [0]
    done = asyncio.Event()

    class Runner:
        async def run(self, fn, *args, **kw):
            return fn(*args, **kw)

    class Workers(docker_pools.PoolWorkers):
        def plan(self, pool):
            if made[0] >= n:
                done.set()
            sizes.append(0)
            return Plan(create=n - made[0]), ("WarmPool", None)

        async def create_idle(self, pool, kind, tmpl):
            made[0] += 1
            sizes[-1] += 1

    w = Workers(SimpleNamespace(max_batch=cap, max_pool_creates=4), desired=lambda: None, store=None,
                runner=Runner(), sandboxes=None, wake=docker_pools.Wake())
    task = asyncio.create_task(w.work("p"))
    await asyncio.wait_for(done.wait(), 5)
    task.cancel()
    return [s for s in sizes if s]


@pytest.mark.parametrize(("n", "cap"), [(1, 32), (10, 32), (10, 3), (40, 4), (7, 1)])
def test_slow_start_with_the_batch_cap_is_the_same_in_both_runtimes(n, cap):
    loop = asyncio.new_event_loop()  # not asyncio.run: it unsets the current loop that Pulumi's mocked tests use
    try:
        kube = loop.run_until_complete(_kube_batches(n, cap))
        docker = loop.run_until_complete(_docker_batches(n, cap))
    finally:
        loop.close()
    assert kube == docker, (kube, docker)
    assert sum(kube) == n and max(kube) <= cap and kube[0] == 1


# --- TTL (the lease) ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ttl", [1, 60, 3600])
def test_a_claims_ttl_ends_at_the_same_time_in_both_runtimes(ttl, monkeypatch):
    t0 = 1_800_000_000.0  # a whole second: the resource model's shutdownTime has no fractions
    monkeypatch.setattr(kube_backend.time, "time", lambda: t0)
    manifest = kube_backend.KubeBackend(SimpleNamespace(), "ns")._manifest("c", "WarmPool",
                                                                           ClaimRequest(pool="p", ttl_seconds=ttl))
    kube_end = datetime.fromisoformat(manifest["spec"]["lifecycle"]["shutdownTime"].replace("Z", "+00:00")).timestamp()
    docker_end = lifecycle.lease_end(t0, ttl)  # docker Claims.create: expires_at
    for now in (t0 + ttl - 1, t0 + ttl, t0 + ttl + 1):
        assert lifecycle.due(kube_end, now) == lifecycle.due(docker_end, now) == (now >= t0 + ttl)
    assert kube_backend.KubeBackend(SimpleNamespace(), "ns")._manifest(
        "c", "WarmPool", ClaimRequest(pool="p"))["spec"]["lifecycle"].get("shutdownTime") is None
    assert lifecycle.lease_end(t0, None) is None


# --- the table would have caught the drift --------------------------------------------------------------------------
def _old_docker_admission(env: dict[str, str], tspec: dict) -> str | None:
    """docker/runtime.py before the core: only Disallowed was checked."""
    tmpl = df.docker_template("shell", tspec, network="n")
    return "EnvVarsNotAllowed" if env and tmpl.env_policy == "Disallowed" else None


def _old_kube_pool_desired(spec: dict, allocated: int) -> int:
    """claimsapi/kube_backend.py before the core: bufferMin defaulted to 1."""
    cap = spec.get("capacity") or {}
    return max(int(cap.get("poolMin", 0)), min(int(cap.get("poolMax", 10)), allocated + int(cap.get("bufferMin", 1))))


def test_the_table_fails_on_the_pre_core_code():
    env_drift = [(p, e) for p, e, _ in ENV_CASES
                 if kube_admission(e, template_spec(p)) != _old_docker_admission(e, template_spec(p))]
    assert ("Allowed", {"GREETING": "bye"}) in env_drift
    pool_drift = [(f, a) for f, a, _ in POOL_CASES
                  if _old_kube_pool_desired({"capacity": _camel(f)} if f else {}, a)
                  != docker_pools.desired_size(df.pool("p", "t", **f), a)]
    assert ({}, 3) in pool_drift
