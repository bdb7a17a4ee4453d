"""Typed views of the cached objects: the fields the Kubernetes reconcilers read, named once.

The cache (corral.operator.cache) holds the bodies kopf's index handlers stored, plain dicts. A view wraps one such
body and reads it on demand: nothing is copied or parsed when it is made (a claim burst runs the reconcilers
thousands of times a second, and a pydantic parse of every object on every pass would be most of the operator's CPU),
and a field nobody reads costs nothing. Where the reconcilers need a whole spec checked (a claim's, a pool's), they
still validate it with its `corral.api` model; the views cover the rest: metadata, labels and annotations Corral
owns, the status fields they branch on, and the few spec fields read before (or instead of) a validation.

Sandboxes in a pool are read as `corral.operator.planning.Member` and pods as `corral.operator.cache.PodInfo`: both
are built once per watch event by the index handlers, as frozen dataclasses, and are the views of those kinds.
Status is written through the `corral.api` status models (see `status_patch` and `checked`), so the field names
come from one place.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from corral.api.common import Model
from corral.api.pool import Capacity
from corral.execd import wire

from .constants import A_CLAIM_UID, A_LAUNCH, L_CLAIM, L_HASH, L_POOL, L_POOL_KIND
from .core import vocabulary as v


def timestamp(value: str | None) -> float:
    """An RFC 3339 time from an object (e.g. "2024-05-01T10:00:00Z") as epoch seconds; 0.0 when unset."""
    if not value:
        return 0.0
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


_ALIASES: dict[type[Model], dict[str, str]] = {}


def status_patch(model: type[Model], **fields: Any) -> dict[str, Any]:
    """A status (or a part of one), as the body of a merge patch, from a `corral.api` model's own (snake_case) field
    names: a name the model does not have raises. Values are given in their wire form (conditions as dicts, times as
    RFC 3339 strings, None to delete a field: a sandbox whose pod went loses its endpoint). Only the fields given are
    in the patch.

    This runs on every reconcile pass, most of which only compare the result with the cached status and write
    nothing, so it only maps names; `checked` runs the model's validation on what is actually written."""
    aliases = _ALIASES.get(model)
    if aliases is None:
        aliases = _ALIASES[model] = {name: f.alias or name for name, f in model.model_fields.items()}
    try:
        return {aliases[name]: value for name, value in fields.items()}
    except KeyError as exc:
        raise TypeError(f"{model.__name__} has no field {exc.args[0]!r}") from None


def checked(model: type[Model], patch: dict[str, Any]) -> dict[str, Any]:
    """`patch` (a status_patch of `model`), once the model accepts it: a value the CRD would refuse (a phase it does
    not know, say) fails here, with the field named, instead of as a 422 from the API server."""
    model.model_validate(patch)
    return patch


class ObjectView:
    """Any object in the cache: its identity, metadata and status, read from the body on each access."""

    __slots__ = ("body",)

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    @property
    def meta(self) -> dict[str, Any]:
        return self.body["metadata"]

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.body["metadata"]["namespace"]

    @property
    def key(self) -> tuple[str, str]:
        meta = self.body["metadata"]
        return meta["namespace"], meta["name"]

    @property
    def uid(self) -> str:
        return self.body["metadata"].get("uid", "")

    @property
    def generation(self) -> int | None:
        return self.body["metadata"].get("generation")

    @property
    def resource_version(self) -> str:
        return self.body["metadata"].get("resourceVersion", "")

    @property
    def labels(self) -> dict[str, str]:
        return self.body["metadata"].get("labels") or {}

    @property
    def annotations(self) -> dict[str, str]:
        return self.body["metadata"].get("annotations") or {}

    @property
    def deleting(self) -> bool:
        return bool(self.body["metadata"].get("deletionTimestamp"))

    @property
    def created(self) -> float:
        return timestamp(self.body["metadata"].get("creationTimestamp"))

    @property
    def spec(self) -> dict[str, Any]:
        return self.body.get("spec") or {}

    @property
    def status(self) -> dict[str, Any]:
        return self.body.get("status") or {}

    @property
    def conditions(self) -> list[dict[str, Any]]:
        return (self.body.get("status") or {}).get("conditions") or []

    @property
    def phase(self) -> str | None:
        return (self.body.get("status") or {}).get("phase")

    def condition(self, type_: str) -> dict[str, Any] | None:
        for c in (self.body.get("status") or {}).get("conditions") or ():
            if c.get("type") == type_:
                return c
        return None


class ClaimView(ObjectView):
    """A SandboxClaim."""

    __slots__ = ()

    @property
    def pool_kind(self) -> str:
        return (self.spec.get("poolRef") or {}).get("kind", "WarmPool")

    @property
    def pool_name(self) -> str:
        return (self.spec.get("poolRef") or {}).get("name", "")

    @property
    def launch_type(self) -> str | None:
        return self.status.get("launchType")

    @property
    def sandbox_name(self) -> str | None:
        """The sandbox its status names (written when it was bound)."""
        return (self.status.get("sandbox") or {}).get("name")

    @property
    def finished_at(self) -> float:
        return timestamp(self.status.get("finishedTime"))

    # The two below run for every claim of a pool on each of its reconciles: one read of the status each.
    @property
    def undecided(self) -> bool:
        """Not yet bound, failed or finished, and not being deleted."""
        body = self.body
        return ((body.get("status") or {}).get("phase") in (None, v.PENDING)
                and not body["metadata"].get("deletionTimestamp"))

    def waiting_for(self, reasons: tuple[str, ...]) -> bool:
        """Pending, with its Bound condition saying it waits for one of these reasons."""
        status = self.body.get("status") or {}
        if status.get("phase") != v.PENDING:
            return False
        bound = self.condition(v.BOUND)
        return bound is not None and bound.get("reason") in reasons


class SandboxView(ObjectView):
    """A Sandbox (a pool's members are also indexed as `Member`s; this is the whole object)."""

    __slots__ = ()

    @property
    def pool(self) -> str | None:
        return self.labels.get(L_POOL)

    @property
    def pool_kind(self) -> str:
        return self.labels.get(L_POOL_KIND, "WarmPool")

    @property
    def claim_label(self) -> str | None:
        """Its claim's name, or a SandboxBatch's per-index label (corral.operator.core.batches.claim_label)."""
        return self.labels.get(L_CLAIM)

    @property
    def claim_uid(self) -> str | None:
        return self.annotations.get(A_CLAIM_UID)

    @property
    def blueprint_hash(self) -> str | None:
        return self.labels.get(L_HASH)

    @property
    def launch_type(self) -> str | None:
        """Warm or Cold as its launch-type annotation says (None: not launched for a claim, or a value Corral never
        writes: the status model would refuse it)."""
        launch = self.annotations.get(A_LAUNCH)
        return launch if launch in (v.WARM, v.COLD) else None

    @property
    def shutdown_at(self) -> float:
        return timestamp(self.spec.get("shutdownTime"))

    @property
    def suspended(self) -> bool:
        return self.spec.get("operatingMode") == "Suspended"

    @property
    def execd_port(self) -> int:
        return int((self.spec.get("execd") or {}).get("port", wire.PORT))

    @property
    def had_pod(self) -> bool:
        """Whether a pod of it ever ran on a node (its status names one): a missing pod is then a loss to repair."""
        return bool(self.status.get("nodeName"))


class PoolView(ObjectView):
    """A WarmPool or a Pool (its kind is in the body, as the API server stores it)."""

    __slots__ = ()

    @property
    def kind(self) -> str:
        return self.body.get("kind") or "WarmPool"

    @property
    def template_name(self) -> str:
        return (self.spec.get("templateRef") or {}).get("name", "")

    @property
    def pool_max(self) -> int:
        """A Pool's capacity.poolMax (the model's default when unset), read without validating the whole spec."""
        return int((self.spec.get("capacity") or {}).get("poolMax", POOL_MAX_DEFAULT))


POOL_MAX_DEFAULT: int = Capacity.model_fields["pool_max"].default


class TemplateView(ObjectView):
    """A SandboxTemplate."""

    __slots__ = ()

    @property
    def blueprint_hash(self) -> str | None:
        return self.status.get("blueprintHash")
