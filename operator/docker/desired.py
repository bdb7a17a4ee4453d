"""The pools file: the Docker runtime's desired state, written by the DockerStack component, read by the operator.

Templates in their Docker form (`DockerTemplate`: what one sandbox container looks like, converted from a
SandboxTemplate spec by `docker_template()`); warm pools and pools as the resource model's own `WarmPool` and `Pool`
objects (corral.api, which the operator image bundles), so every rule of the core reads the same fields in both
runtimes (readinessGraceSeconds, capacity and its defaults, update and recycle strategies). `warm_pool()` and
`pool()` build them from the DockerStack's flat arguments. The operator validates the file with `DesiredState`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.api import Pool, WarmPool
from corral.execd import wire
from corral.operator.core.vocabulary import PoolKind

DEFAULT_EXECD_PORT = wire.PORT
DEFAULT_USER = "1000:1000"      # non-root; numeric, so it works in images without a passwd entry
DEFAULT_PIDS = 512
DEFAULT_CPUS = 1.0              # a CPU limit always applies (requests only weigh shares)
DEFAULT_MEMORY = 512 * 2**20
DEFAULT_DISK = 10 * 2**30        # writable-layer bound, where the storage driver allows one (engine.py)
WORKDIR = "/workspace"


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class DockerTemplate(_M):
    """What one sandbox container of a template looks like on Docker."""

    name: str
    image: str
    command: list[str] | None = Field(default=None, description="Entrypoint override (k8s `command`).")
    args: list[str] | None = Field(default=None, description="Arguments (k8s `args`).")
    workdir: str = WORKDIR
    env: dict[str, str] = Field(default_factory=dict)
    user: str = DEFAULT_USER
    memory_bytes: int = DEFAULT_MEMORY
    nano_cpus: int = int(DEFAULT_CPUS * 1e9)
    cpu_shares: int | None = None
    pids_limit: int = DEFAULT_PIDS
    disk_bytes: int | None = Field(default=None, description=(
        "Bound of the container's writable layer (k8s `ephemeral-storage` limit; DEFAULT_DISK when unset), "
        "applied only where the storage driver supports it."))
    network: str = Field(description="Docker network of this template's sandboxes.")
    internal: bool = Field(default=False, description="The network has no route out (docker --internal).")
    execd_port: int = DEFAULT_EXECD_PORT
    env_policy: Literal["Disallowed", "Allowed", "Overrides"] = "Disallowed"
    labels: dict[str, str] = Field(default_factory=dict)

    def blueprint_hash(self) -> str:
        """Hash of everything that shapes the container (not the claim policy)."""
        data = self.model_dump(exclude={"name", "env_policy"})
        if data["disk_bytes"] is None:  # hashes of templates without a disk limit stay what they were
            del data["disk_bytes"]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def _given(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def warm_pool(name: str, template: str, replicas: int,
              update_strategy: Literal["OnReplenish", "Recreate"] | None = None,
              readiness_grace_seconds: int | None = None) -> WarmPool:
    """A WarmPool of the pools file from the DockerStack's flat arguments; what is not given takes the resource
    model's default (no defaults of our own)."""
    spec = {"templateRef": {"name": template},
            **_given(replicas=replicas, readinessGraceSeconds=readiness_grace_seconds)}
    if update_strategy is not None:
        spec["updateStrategy"] = {"type": update_strategy}
    return WarmPool.model_validate({"metadata": {"name": name}, "spec": spec})


def pool(name: str, template: str, buffer_min: int | None = None, buffer_max: int | None = None,
         pool_min: int | None = None, pool_max: int | None = None,
         recycle_strategy: Literal["Delete", "Restart", "Noop"] | None = None,
         max_unavailable: int | None = None, readiness_grace_seconds: int | None = None) -> Pool:
    """A Pool of the pools file from the DockerStack's flat arguments; what is not given takes the resource model's
    default (a Pool's bufferMin is 0 unless set)."""
    return Pool.model_validate({"metadata": {"name": name}, "spec": {
        "templateRef": {"name": template}, **_given(recycleStrategy=recycle_strategy, maxUnavailable=max_unavailable,
                                                           readinessGraceSeconds=readiness_grace_seconds),
        "capacity": _given(bufferMin=buffer_min, bufferMax=buffer_max, poolMin=pool_min, poolMax=pool_max)}})


def name_of(p: WarmPool | Pool) -> str:
    return p.metadata.name or ""


def template_of(p: WarmPool | Pool) -> str:
    return p.spec.template_ref.name


class DesiredState(_M):
    """The whole pools file."""

    version: Literal[2] = Field(default=2, description=(
        "2: pools are corral.api WarmPool/Pool objects (1 had flat pool entries; DockerStack rewrites the file)."))
    stack: str = Field(description="Stack name; every Docker object carries corral.dev/stack=<stack>.")
    templates: list[DockerTemplate] = Field(default_factory=list)
    warm_pools: list[WarmPool] = Field(default_factory=list)
    pools: list[Pool] = Field(default_factory=list)

    @model_validator(mode="after")
    def _refs(self) -> DesiredState:
        names = {t.name for t in self.templates}
        seen: set[str] = set()
        for p in self.all_pools():
            if not p.metadata.name:
                raise ValueError(f"a {p.kind} of the pools file has no metadata.name")
            if template_of(p) not in names:
                raise ValueError(f"pool {name_of(p)}: unknown template {template_of(p)!r}")
            if name_of(p) in seen:
                raise ValueError(f"pool name {name_of(p)!r} is used twice")
            seen.add(name_of(p))
        return self

    def template(self, name: str) -> DockerTemplate:
        return next(t for t in self.templates if t.name == name)

    def all_pools(self) -> list[WarmPool | Pool]:
        """The WarmPools, then the Pools."""
        return [*self.warm_pools, *self.pools]

    def pool(self, name: str) -> tuple[PoolKind, WarmPool | Pool] | None:
        """The pool of that name, with its kind."""
        for p in self.all_pools():
            if name_of(p) == name:
                return p.kind, p
        return None

    def dump(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True, exclude_none=True), indent=2,
                          sort_keys=True) + "\n"


def load(path: str | Path) -> DesiredState:
    return DesiredState.model_validate_json(Path(path).read_text())


_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def memory_bytes(q: str) -> int:
    """A Kubernetes memory quantity (`512Mi`, `1G`, `1048576`) in bytes."""
    m = _QUANTITY.match(str(q).strip())
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"bad memory quantity {q!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def cpus(q: str | int | float) -> float:
    """A Kubernetes CPU quantity (`250m`, `1`, `0.5`) in CPUs."""
    s = str(q).strip()
    return int(s[:-1]) / 1000 if s.endswith("m") else float(s)


def docker_template(name: str, spec: dict[str, Any], *, network: str, internal: bool = False,
                    labels: dict[str, str] | None = None) -> DockerTemplate:
    """The Docker form of a SandboxTemplate spec (its wire form, camelCase): the first container of the pod template
    becomes the sandbox container; its limits become Docker limits (defaults otherwise); runAsUser is honoured."""
    pod = spec["podTemplate"]
    c = pod["spec"]["containers"][0]
    res = c.get("resources") or {}
    limits, requests = res.get("limits") or {}, res.get("requests") or {}
    mem = limits.get("memory") or requests.get("memory")
    disk = limits.get("ephemeral-storage")
    ctx = {**(pod["spec"].get("securityContext") or {}), **(c.get("securityContext") or {})}
    user = DEFAULT_USER
    if "runAsUser" in ctx:
        user = f"{ctx['runAsUser']}:{ctx.get('runAsGroup', ctx['runAsUser'])}"
    env = {e["name"]: str(e.get("value", "")) for e in c.get("env") or [] if "valueFrom" not in e}
    return DockerTemplate(
        name=name,
        image=c["image"],
        command=c.get("command"),
        args=c.get("args"),
        workdir=c.get("workingDir") or WORKDIR,
        env=env,
        user=user,
        memory_bytes=memory_bytes(mem) if mem else DEFAULT_MEMORY,
        nano_cpus=int(cpus(limits["cpu"]) * 1e9) if "cpu" in limits else int(DEFAULT_CPUS * 1e9),
        cpu_shares=max(2, int(cpus(requests["cpu"]) * 1024)) if "cpu" in requests else None,
        disk_bytes=memory_bytes(disk) if disk else None,
        network=network,
        internal=internal,
        execd_port=(spec.get("execd") or {}).get("port", DEFAULT_EXECD_PORT),
        env_policy=spec.get("envVarsInjectionPolicy", "Disallowed"),
        labels={**(pod.get("metadata") or {}).get("labels", {}), **(labels or {})},
    )
