"""TemplateSpecs: a SandboxTemplate's validated spec and blueprint hash, worked out once per spec generation.

Every claim and every pool reconcile needs both; validating and hashing the template each time was ~10% of the
operator's CPU in a claim burst. Keyed by (ns, template) and checked against the template's (uid, generation), so
an edited or re-created template is validated again. An invalid spec raises CorralValidationError and is not kept
(the template reports it in its status). Gone with the template (`template_gone`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral.api import SandboxTemplateSpec, validate

from ..builders import blueprint_hash


@dataclass
class TemplateSpecs:
    _specs: dict[tuple[str, str], tuple[str, Any, SandboxTemplateSpec, str]] = field(default_factory=dict)

    def spec(self, template: dict[str, Any]) -> tuple[SandboxTemplateSpec, str]:
        meta = template["metadata"]
        key, version = (meta["namespace"], meta["name"]), (meta.get("uid", ""), meta.get("generation"))
        hit = self._specs.get(key)
        if hit is not None and hit[:2] == version:
            return hit[2], hit[3]
        spec = validate(SandboxTemplateSpec, template["spec"])
        bp_hash = blueprint_hash(spec)
        self._specs[key] = (*version, spec, bp_hash)
        return spec, bp_hash

    def template_gone(self, ns: str, name: str) -> None:
        self._specs.pop((ns, name), None)

    def __len__(self) -> int:
        return len(self._specs)
