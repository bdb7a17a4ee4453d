"""corral.components: Corral's Pulumi components (type tokens corral:index:<Name>)."""

from .crds import CorralCRDs
from .resources import Pool, PoolArgs, SandboxTemplate, SandboxTemplateArgs, WarmPool, WarmPoolArgs

__all__ = ["CorralCRDs", "SandboxTemplate", "SandboxTemplateArgs", "WarmPool", "WarmPoolArgs", "Pool", "PoolArgs"]
