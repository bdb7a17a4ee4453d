"""The pools file: the Docker runtime's desired state, written by the DockerStack component, read by the operator.

Plain data only (pydantic, no corral.api import), so the operator image does not carry the Kubernetes model. The
component converts each SandboxTemplate spec with `docker_template()`; the operator validates the file with
`DesiredState`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_EXECD_PORT = 44772
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


class WarmPoolSpec(_M):
    name: str
    template: str
    replicas: int = Field(ge=0, le=1000)
    update_strategy: Literal["OnReplenish", "Recreate"] = "OnReplenish"


class PoolSpec(_M):
    name: str
    template: str
    buffer_min: int = Field(default=0, ge=0)
    buffer_max: int = Field(default=1, ge=0)
    pool_min: int = Field(default=0, ge=0)
    pool_max: int = Field(default=10, ge=0, le=1000)
    recycle_strategy: Literal["Delete", "Restart", "Noop"] = "Delete"
    max_unavailable: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> "PoolSpec":
        if self.buffer_min > self.buffer_max or self.pool_min > self.pool_max:
            raise ValueError(f"pool {self.name}: bufferMin <= bufferMax and poolMin <= poolMax are required")
        return self


class DesiredState(_M):
    """The whole pools file."""

    version: Literal[1] = 1
    stack: str = Field(description="Stack name; every Docker object carries corral.dev/stack=<stack>.")
    templates: list[DockerTemplate] = Field(default_factory=list)
    warm_pools: list[WarmPoolSpec] = Field(default_factory=list)
    pools: list[PoolSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _refs(self) -> "DesiredState":
        names = {t.name for t in self.templates}
        seen: set[str] = set()
        for p in [*self.warm_pools, *self.pools]:
            if p.template not in names:
                raise ValueError(f"pool {p.name}: unknown template {p.template!r}")
            if p.name in seen:
                raise ValueError(f"pool name {p.name!r} is used twice")
            seen.add(p.name)
        return self

    def template(self, name: str) -> DockerTemplate:
        return next(t for t in self.templates if t.name == name)

    def pool(self, name: str) -> tuple[str, WarmPoolSpec | PoolSpec] | None:
        for p in self.warm_pools:
            if p.name == name:
                return "WarmPool", p
        for q in self.pools:
            if q.name == name:
                return "Pool", q
        return None

    def dump(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


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
