"""corral.api: the resource model, the one source of truth for every Corral kind (group corral.dev/v1alpha1)."""

from .batch import BatchLifecycle, BatchTask, SandboxBatch, SandboxBatchSpec, SandboxBatchStatus
from .claim import Lifecycle, PoolRef, SandboxClaim, SandboxClaimSpec, SandboxClaimStatus
from .common import API_VERSION, GROUP, MAX_REPLICAS, VERSION, Condition, LocalRef, ObjectMeta
from .kinds import BY_KIND, KINDS, CorralValidationError, parse, validate
from .pool import Capacity, Pool, PoolSpec, PoolStatus
from .sandbox import Sandbox, SandboxSpec, SandboxStatus
from .template import ExecdSpec, PodTemplate, SandboxBlueprint, SandboxTemplate, SandboxTemplateSpec
from .warmpool import UpdateStrategy, WarmPool, WarmPoolSpec, WarmPoolStatus

__all__ = [
    "API_VERSION", "GROUP", "VERSION", "MAX_REPLICAS", "KINDS", "BY_KIND", "CorralValidationError", "parse", "validate",
    "Condition", "LocalRef", "ObjectMeta", "SandboxTemplate", "SandboxTemplateSpec", "SandboxBlueprint", "PodTemplate",
    "ExecdSpec", "Sandbox", "SandboxSpec", "SandboxStatus", "WarmPool", "WarmPoolSpec", "WarmPoolStatus",
    "UpdateStrategy", "Pool", "PoolSpec", "PoolStatus", "Capacity", "SandboxClaim", "SandboxClaimSpec",
    "SandboxClaimStatus", "PoolRef", "Lifecycle", "SandboxBatch", "SandboxBatchSpec", "SandboxBatchStatus", "BatchTask",
    "BatchLifecycle",
]
