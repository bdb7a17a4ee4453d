"""The typed stack configuration: every `corral:*` key of a stack, read once by __main__.py.

A misspelled or unknown key fails with its name (and the closest known key); a bad value fails with the path of the
field, e.g. `corral:warmPools[0].replicas`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from corral.api import Capacity
from corral.api.common import DNS_LABEL, MAX_REPLICAS, Model, Name

from .controller_values import OperatorValues

NAMESPACE = "corral"


class ConfigError(ValueError):
    """The stack configuration is wrong; the message names the key."""


class TemplateConfig(Model):
    name: Name = Field(description="Name of the SandboxTemplate.")
    catalogue: str = Field(description="Catalogue entry (templates/<catalogue>.yaml.j2).")
    params: dict[str, Any] = Field(default_factory=dict, description="Catalogue parameters.")


class WarmPoolConfig(Model):
    name: Name
    template: Name = Field(description="Name of a template in corral:templates.")
    replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    update_strategy: Literal["OnReplenish", "Recreate"] = "OnReplenish"


class PoolConfig(Model):
    name: Name
    template: Name
    capacity: Capacity = Field(default_factory=Capacity)
    recycle_strategy: Literal["Delete", "Restart", "Noop"] = "Delete"
    max_unavailable: int = Field(default=1, ge=1, le=MAX_REPLICAS)


class KubernetesConfig(Model):
    kubeconfig: str | None = Field(
        default=None, description="Path to a kubeconfig (default: $KUBECONFIG / ~/.kube/config).")
    context: str | None = Field(default=None, description="kubeconfig context (default: the current one).")
    namespace: str = Field(
        default="corral-sandboxes", pattern=DNS_LABEL, max_length=63, description="Sandbox namespace.")
    create_namespace: bool = Field(default=True, description="Create the sandbox namespace.")


class ControllerConfig(Model):
    """`corral:controller`: the operator on the cluster (ControllerDeployment)."""

    enabled: bool = Field(default=True, description="Install the operator, its CRDs and RBAC from this stack.")
    namespace: str = Field(default="corral-system", pattern=DNS_LABEL, max_length=63,
                           description="Namespace of the operator.")
    create_namespace: bool = Field(default=True, description="Create the operator's namespace.")
    install_crds: bool = Field(default=True, description="Install the CRDs as Pulumi resources.")
    values: OperatorValues = Field(default_factory=OperatorValues,
                                   description="Typed chart values (charts/corral/values.schema.json).")
    raw_values: dict[str, Any] = Field(default_factory=dict,
                                       description="Escape hatch: wire-form chart values merged over `values`.")


class DockerConfig(Model):
    host: str | None = Field(
        default=None, description="Docker Engine address (default: $DOCKER_HOST or the local socket).")
    api_port: int = Field(default=7780, ge=1024, le=65535, description="Claims API port, published on 127.0.0.1.")
    internal_networks: list[Name] = Field(
        default_factory=list, description="Templates whose sandboxes get an internal network (no route out).")
    operator_image: str | None = Field(
        default=None,
        description="Operator image (default: corral/operator:<key>, built by scripts/operator-image.sh).")
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Operator log level.")


class StackConfig(Model):
    mode: Literal["docker", "kubernetes"] = Field(default="docker", description="Where sandboxes run.")
    kubernetes: KubernetesConfig = Field(default_factory=KubernetesConfig)
    docker: DockerConfig = Field(default_factory=DockerConfig)
    controller: ControllerConfig = Field(default_factory=ControllerConfig)
    templates: list[TemplateConfig] = Field(default_factory=list)
    warm_pools: list[WarmPoolConfig] = Field(default_factory=list)
    pools: list[PoolConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> StackConfig:
        names = [t.name for t in self.templates]
        if dupes := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"corral:templates: duplicate name(s) {', '.join(dupes)}")
        pool_names = [p.name for p in self.warm_pools] + [p.name for p in self.pools]
        if dupes := sorted({n for n in pool_names if pool_names.count(n) > 1}):
            raise ValueError(f"corral:warmPools/pools: duplicate name(s) {', '.join(dupes)}")
        for i, t in enumerate(self.docker.internal_networks):
            if t not in names:
                raise ValueError(f"corral:docker.internalNetworks[{i}]: no template named {t!r} in corral:templates")
        by_key: tuple[tuple[str, Sequence[WarmPoolConfig | PoolConfig]], ...] = (
            ("warmPools", self.warm_pools), ("pools", self.pools))
        for key, items in by_key:
            for i, p in enumerate(items):
                if p.template not in names:
                    raise ValueError(
                        f"corral:{key}[{i}].template: no template named {p.template!r} in corral:templates "
                        f"(have: {', '.join(names) or 'none'})"
                    )
        return self


KNOWN_KEYS = {field.alias or name for name, field in StackConfig.model_fields.items()}


def _decode(value: Any) -> Any:
    """Values from the engine arrive as strings; structured ones are JSON."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _path(loc: tuple[Any, ...]) -> str:
    out = f"{NAMESPACE}:{loc[0]}" if loc else f"{NAMESPACE}"
    for part in loc[1:]:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def parse_stack_config(raw: Mapping[str, Any]) -> StackConfig:
    """Build the typed config from `{"corral:key": value}` (other namespaces, e.g. provider config, are ignored)."""
    values: dict[str, Any] = {}
    for full_key, value in raw.items():
        ns, _, key = full_key.partition(":")
        if ns != NAMESPACE:
            continue
        if key not in KNOWN_KEYS:
            close = difflib.get_close_matches(key, sorted(KNOWN_KEYS), n=1)
            hint = f" (did you mean {NAMESPACE}:{close[0]}?)" if close else ""
            raise ConfigError(
                f"{full_key}: unknown config key{hint}; known keys: {', '.join(sorted(KNOWN_KEYS))}"
            )
        values[key] = _decode(value)
    try:
        return StackConfig.model_validate(values)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            lines.append(msg if not err["loc"] else f"{_path(err['loc'])}: {msg}")
        raise ConfigError("invalid stack configuration:\n  " + "\n  ".join(lines)) from None


def from_pulumi() -> StackConfig:
    """Read the running stack's whole configuration (once, in __main__.py)."""
    from pulumi.runtime import config as runtime_config

    raw = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    return parse_stack_config(raw)
