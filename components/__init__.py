"""corral.components: Corral's Pulumi components (type tokens corral:index:<Name>)."""

from .crds import CorralCRDs
from .docker_stack import DockerStack, DockerStackArgs
from .resources import Pool, PoolArgs, SandboxTemplate, SandboxTemplateArgs, WarmPool, WarmPoolArgs

__all__ = ["CorralCRDs", "DockerStack", "DockerStackArgs", "SandboxTemplate", "SandboxTemplateArgs", "WarmPool", "WarmPoolArgs", "Pool", "PoolArgs"]
