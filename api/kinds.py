"""The six kinds: their names, printer columns and subresources, and parsing with errors that name the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .batch import SandboxBatch
from .claim import SandboxClaim
from .common import API_VERSION, GROUP, VERSION, CorralObject
from .pool import Pool
from .sandbox import Sandbox
from .template import SandboxTemplate
from .warmpool import WarmPool

AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


@dataclass(frozen=True)
class Kind:
    model: type[CorralObject]
    kind: str
    plural: str
    short_names: tuple[str, ...]
    columns: tuple[dict[str, str], ...]
    scale: dict[str, str] | None = None
    categories: tuple[str, ...] = field(default=("corral",))

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


KINDS: tuple[Kind, ...] = (
    Kind(SandboxTemplate, "SandboxTemplate", "sandboxtemplates", ("sbxt",), (
        {"name": "Hash", "type": "string", "jsonPath": ".status.blueprintHash"},
        {"name": "NetworkPolicy", "type": "string", "jsonPath": ".spec.networkPolicyManagement"},
        AGE,
    )),
    Kind(Sandbox, "Sandbox", "sandboxes", ("sbx",), (
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Launch", "type": "string", "jsonPath": ".status.launchType"},
        {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
        {"name": "Claim", "type": "string", "jsonPath": ".status.claimRef.name"},
        AGE,
    )),
    Kind(WarmPool, "WarmPool", "warmpools", ("wp",), (
        {"name": "Template", "type": "string", "jsonPath": ".spec.templateRef.name"},
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
        {"name": "Updated", "type": "integer", "jsonPath": ".status.updatedReplicas"},
        AGE,
    ), scale={
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }),
    Kind(Pool, "Pool", "pools", ("pool",), (
        {"name": "Template", "type": "string", "jsonPath": ".spec.templateRef.name"},
        {"name": "Total", "type": "integer", "jsonPath": ".status.total"},
        {"name": "Allocated", "type": "integer", "jsonPath": ".status.allocated"},
        {"name": "Available", "type": "integer", "jsonPath": ".status.available"},
        AGE,
    )),
    Kind(SandboxClaim, "SandboxClaim", "sandboxclaims", ("sbxc",), (
        {"name": "Pool", "type": "string", "jsonPath": ".spec.poolRef.name"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Sandbox", "type": "string", "jsonPath": ".status.sandbox.name"},
        {"name": "Launch", "type": "string", "jsonPath": ".status.launchType"},
        AGE,
    )),
    Kind(SandboxBatch, "SandboxBatch", "sandboxbatches", ("sbxb",), (
        {"name": "Pool", "type": "string", "jsonPath": ".spec.poolRef.name"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Bound", "type": "integer", "jsonPath": ".status.bound"},
        {"name": "Running", "type": "integer", "jsonPath": ".status.running"},
        {"name": "Succeeded", "type": "integer", "jsonPath": ".status.succeeded"},
        {"name": "Failed", "type": "integer", "jsonPath": ".status.failed"},
        AGE,
    )),
)

BY_KIND = {k.kind: k for k in KINDS}


class CorralValidationError(ValueError):
    """An object failed validation. `errors` lists (field path, message); str() names every bad field."""

    def __init__(self, kind: str, errors: list[tuple[str, str]]):
        self.kind = kind
        self.errors = errors
        lines = "\n".join(f"  {path}: {msg}" for path, msg in errors)
        super().__init__(f"invalid {kind}:\n{lines}")


def error_paths(exc: ValidationError) -> list[tuple[str, str]]:
    """(dotted field path, message) for each error, with camelCase names as the user wrote them."""
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"].removeprefix("Value error, ")
        out.append((path, msg))
    return out


def parse(obj: dict[str, Any]) -> CorralObject:
    """Parse a Corral object (a dict as Kubernetes serves it); raises CorralValidationError naming bad fields."""
    if obj.get("apiVersion") not in (None, API_VERSION):
        raise CorralValidationError(str(obj.get("kind")), [("apiVersion", f"must be {API_VERSION}")])
    kind = BY_KIND.get(str(obj.get("kind")))
    if kind is None:
        raise CorralValidationError(str(obj.get("kind")), [("kind", f"must be one of {', '.join(BY_KIND)}")])
    return validate(kind.model, obj)


M = TypeVar("M", bound=BaseModel)


def validate(model: type[M], data: Any) -> M:
    """model.model_validate(data), raising CorralValidationError (a ValueError) naming every bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise CorralValidationError(model.__name__, error_paths(exc)) from None


__all__ = ["API_VERSION", "GROUP", "VERSION", "KINDS", "BY_KIND", "Kind", "CorralValidationError", "parse", "validate"]
