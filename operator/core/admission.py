"""Claim admission: may a claim's env and volumes be applied to its template? The same answer in both runtimes.

A template's `envVarsInjectionPolicy` and `volumeClaimTemplatesPolicy` (api/template.py):
- Disallowed: a claim that sets any refuses;
- Allowed: a claim may add, never replace (env: a name the template's containers set is refused);
- Overrides: a claim may add and replace.
The Docker runtime has no volume claims (its API takes none), so only the env half applies there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .vocabulary import R_ENV_NOT_ALLOWED, R_VOLUMES_NOT_ALLOWED


@dataclass(frozen=True)
class Refusal:
    """Why a claim can never be served as written: a reason from `vocabulary.REASONS` and a message for humans."""

    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


def template_env_names(pod_spec: dict[str, Any]) -> set[str]:
    """Env names a template's pod spec sets (any container, plain values and valueFrom alike)."""
    return {e.get("name") for c in pod_spec.get("containers") or [] for e in c.get("env") or [] if e.get("name")}


def admit_env(env: Iterable[str], template_env: Iterable[str], policy: str) -> Refusal | None:
    """`env`: the names the claim sets; `template_env`: the names the template sets."""
    names = set(env)
    if not names:
        return None
    if policy == "Disallowed":
        return Refusal(R_ENV_NOT_ALLOWED, "the claim sets env but the template's envVarsInjectionPolicy is Disallowed")
    if policy == "Allowed":
        clash = sorted(names & set(template_env))
        if clash:
            return Refusal(R_ENV_NOT_ALLOWED, f"env {', '.join(clash)} would override the template's values; "
                                              "that needs envVarsInjectionPolicy: Overrides")
    elif policy != "Overrides":
        return Refusal(R_ENV_NOT_ALLOWED, f"unknown envVarsInjectionPolicy {policy!r}")
    return None


def admit_volumes(volumes: int, policy: str) -> Refusal | None:
    """`volumes`: how many volumeClaimTemplates the claim adds (Allowed appends them, Overrides replaces the
    template's)."""
    if volumes and policy not in ("Allowed", "Overrides"):
        return Refusal(R_VOLUMES_NOT_ALLOWED, "the claim adds volumeClaimTemplates but the template's "
                                              f"volumeClaimTemplatesPolicy is {policy}")
    return None


def admit_claim(*, env: Iterable[str], template_env: Iterable[str], env_policy: str, volumes: int = 0,
                volume_policy: str = "Disallowed") -> Refusal | None:
    """The first reason the claim is refused, or None: env first, then volumes."""
    return admit_env(env, template_env, env_policy) or admit_volumes(volumes, volume_policy)
