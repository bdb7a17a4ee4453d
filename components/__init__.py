"""corral.components: Corral's Pulumi components (type tokens corral:index:<Name>), a public API under semantic
versioning (`__version__`, CHANGELOG.md). Other Pulumi languages use them through the component provider in
corral.components.provider."""

from ._version import __version__
from .controller import ControllerDeployment, ControllerDeploymentArgs
from .controller_values import OperatorValues
from .docker_stack import DockerStack, DockerStackArgs
from .resources import Pool, PoolArgs, SandboxTemplate, SandboxTemplateArgs, WarmPool, WarmPoolArgs

__all__ = ["__version__", "ControllerDeployment", "ControllerDeploymentArgs", "OperatorValues", "DockerStack",
           "DockerStackArgs", "SandboxTemplate", "SandboxTemplateArgs", "WarmPool", "WarmPoolArgs", "Pool", "PoolArgs"]
