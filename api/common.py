"""Shared pieces of the resource model: the API group, base model config, metadata, conditions, references."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonDict

GROUP = "corral.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The most replicas one WarmPool (or one Pool's poolMax) may ask for. A single write cannot start a pod storm
# bigger than this; raise it by changing this constant and regenerating the CRDs.
MAX_REPLICAS = 1000

# Label and annotation keys Corral owns. Users may not set keys in these domains through a claim.
LABEL_PREFIX = GROUP + "/"
RESERVED_DOMAINS = ("corral.dev", "kubernetes.io", "k8s.io")

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

# Claim env: what a claim may put into a sandbox's environment. Names as Kubernetes accepts them (non-empty, no `=`,
# no NUL), values without NUL (execve cannot carry one), bounded in count and size. Names starting with execd's own
# prefix (corral.execd.wire.ENV_PREFIX; a unit test keeps the two equal) are refused: a cold claim's env would
# otherwise configure the sandbox's execd (its roots, its listen address, ...).
EXECD_ENV_PREFIX = "CORRAL_EXECD_"
MAX_ENV_VARS = 256
MAX_ENV_NAME = 256
MAX_ENV_VALUE = 32768
NO_NUL = r"^[^\x00]*$"


def env_var_problem(name: str, value: str) -> str | None:
    """Why one claim env variable is refused, or None. The same rules as EnvVar's schema (and the CRD's)."""
    if not re.fullmatch(ENV_NAME, name) or len(name) > MAX_ENV_NAME:
        return (f"env name {name[:64]!r} is not a valid name (letters, digits, '-', '.', '_', not starting with a "
                f"digit, at most {MAX_ENV_NAME} characters)")
    if name.upper().startswith(EXECD_ENV_PREFIX):
        return f"env name {name!r} is reserved: {EXECD_ENV_PREFIX}* configures the sandbox's execd"
    if "\x00" in value:
        return f"env {name}: the value contains a NUL character"
    if len(value) > MAX_ENV_VALUE:
        return f"env {name}: the value is longer than {MAX_ENV_VALUE} characters"
    return None

# Schema extras understood by the CRD generator (api/crd.py).
PRESERVE_UNKNOWN: JsonDict = {"x-kubernetes-preserve-unknown-fields": True}


def immutable(what: str) -> JsonDict:
    """Schema extra: a CEL rule that rejects any change of the field once set."""
    return {"x-kubernetes-validations": [{"rule": "self == oldSelf", "message": f"{what} is immutable"}]}


class Model(BaseModel):
    """Base of every Corral model: camelCase on the wire, snake_case in Python, unknown keys rejected."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
        use_enum_values=True,
    )

    def to_k8s(self) -> dict[str, Any]:
        """The wire form: camelCase keys, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


Name = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]


class ObjectMeta(Model):
    """The part of Kubernetes ObjectMeta that Corral reads and writes; the server's own fields pass through."""

    model_config = ConfigDict(extra="allow")

    name: Name | None = None
    generate_name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    resource_version: str | None = None
    uid: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    deletion_timestamp: datetime | None = None


class TemplateMetadata(Model):
    """Labels and annotations for objects created from a template (pods, PVCs)."""

    labels: dict[str, str] = Field(default_factory=dict, description="Labels added to each created object.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations added to each created object.")


class Condition(Model):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str = Field(description="Condition type, e.g. Ready, Bound, Failed.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(default=None, description="CamelCase machine-readable reason.")
    message: str | None = Field(default=None, description="Human-readable explanation.")
    last_transition_time: datetime | None = Field(default=None, description="When status last changed.")
    observed_generation: int | None = Field(default=None, description="The .metadata.generation acted on.")


class LocalRef(Model):
    """A reference to an object by name in the same namespace."""

    name: Name = Field(description="Name of the referenced object (same namespace).")


class CorralObject(Model):
    """Envelope shared by the five kinds. Subclasses fix `kind` and type `spec` and `status`."""

    api_version: Literal["corral.dev/v1alpha1"] = Field(
        default=cast(Literal["corral.dev/v1alpha1"], API_VERSION), alias="apiVersion")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
