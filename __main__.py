"""The Corral Pulumi program: read the typed stack config once, build the stack from components. Wiring only."""

from corral.components.config import from_pulumi
from corral.components.stack import build

build(from_pulumi())
