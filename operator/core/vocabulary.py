"""One vocabulary for claims and pools in both runtimes.

Two public forms of a claim's phase and launch type exist, and both are kept on purpose (changing either is a
breaking change of a public interface):

- the resource model (`corral.dev/v1alpha1` SandboxClaim status, the Docker runtime never writes it):
  phases Pending / Bound / Failed / Finished, launch types Warm / Cold;
- the claims HTTP API (the SDK and CLI, both modes; the Docker runtime stores claims in this form):
  phases Pending / Ready / Paused / Expired / Failed, launch types warm / cold.

`api_phase` and `api_launch_type` are the one mapping between them. Metrics use the API form for launch types
(`warm`, `cold`, `none` for a claim that never got a sandbox) and `REASONS` for outcomes, in both runtimes.
"""

from __future__ import annotations

from typing import Final, Literal

# --- claim phases ---------------------------------------------------------------------------------------------------
PENDING: Final = "Pending"
BOUND: Final = "Bound"          # resource model; the API says READY
FAILED: Final = "Failed"
FINISHED: Final = "Finished"    # resource model; the API says EXPIRED
READY: Final = "Ready"
PAUSED: Final = "Paused"        # API only (Docker: a frozen sandbox)
EXPIRED: Final = "Expired"

ResourcePhase = Literal["Pending", "Bound", "Failed", "Finished"]
ApiPhase = Literal["Pending", "Ready", "Paused", "Expired", "Failed"]
RESOURCE_PHASES: Final = (PENDING, BOUND, FAILED, FINISHED)
API_PHASES: Final = (PENDING, READY, PAUSED, EXPIRED, FAILED)
FINAL_RESOURCE_PHASES: Final = (FAILED, FINISHED)
FINAL_API_PHASES: Final = (EXPIRED, FAILED)
LIVE_API_PHASES: Final = (PENDING, READY, PAUSED)

_API_PHASE: dict[str, ApiPhase] = {PENDING: PENDING, BOUND: READY, FAILED: FAILED, FINISHED: EXPIRED}


def api_phase(resource_phase: str | None) -> ApiPhase:
    """The claims API's phase of a SandboxClaim phase (none yet: Pending)."""
    return _API_PHASE.get(resource_phase or PENDING, PENDING)


# --- launch types ---------------------------------------------------------------------------------------------------
WARM: Final = "Warm"            # resource model (SandboxClaim/Sandbox status, the launch-type annotation)
COLD: Final = "Cold"
ApiLaunchType = Literal["warm", "cold"]
API_WARM: Final = "warm"
API_COLD: Final = "cold"
NO_LAUNCH: Final = "none"       # metrics label of a claim that never got a sandbox


def api_launch_type(launch_type: str | None) -> ApiLaunchType | None:
    """The API form (`warm`/`cold`) of either form; None when not launched."""
    if not launch_type:
        return None
    lowered = launch_type.lower()
    if lowered not in (API_WARM, API_COLD):
        raise ValueError(f"unknown launch type {launch_type!r}")
    return lowered  # type: ignore[return-value]


def resource_launch_type(launch_type: str) -> str:
    """The resource-model form (`Warm`/`Cold`) of either form."""
    return WARM if api_launch_type(launch_type) == API_WARM else COLD


def launch_label(launch_type: str | None) -> str:
    """The `launch_type` label of a metric: warm, cold or none (also for a value that is neither: a metric must not
    stop a reconcile)."""
    lowered = (launch_type or "").lower()
    return lowered if lowered in (API_WARM, API_COLD) else NO_LAUNCH


# --- reasons: why a claim is bound, waits, fails or finishes (conditions, API messages, the outcome label) ---------
R_BOUND: Final = "Bound"
R_INVALID_SPEC: Final = "InvalidSpec"
R_INVALID_TEMPLATE: Final = "InvalidTemplate"
R_ENV_NOT_ALLOWED: Final = "EnvVarsNotAllowed"
R_VOLUMES_NOT_ALLOWED: Final = "VolumesNotAllowed"
R_ENV_INJECTION_FAILED: Final = "EnvInjectionFailed"
R_POOL_NOT_FOUND: Final = "PoolNotFound"
R_TEMPLATE_NOT_FOUND: Final = "TemplateNotFound"
R_POOL_EXHAUSTED: Final = "PoolExhausted"
R_TIMEOUT: Final = "Timeout"
R_START_FAILED: Final = "StartFailed"
R_SANDBOX_LOST: Final = "SandboxLost"
R_SHUTDOWN_TIME: Final = "ShutdownTime"
REASONS: Final = frozenset({
    R_BOUND, R_INVALID_SPEC, R_INVALID_TEMPLATE, R_ENV_NOT_ALLOWED, R_VOLUMES_NOT_ALLOWED, R_ENV_INJECTION_FAILED,
    R_POOL_NOT_FOUND, R_TEMPLATE_NOT_FOUND, R_POOL_EXHAUSTED, R_TIMEOUT, R_START_FAILED, R_SANDBOX_LOST,
    R_SHUTDOWN_TIME,
})
# The claim as written can never succeed: a 4xx for the caller, not a retry.
USER_ERRORS: Final = frozenset({R_INVALID_SPEC, R_INVALID_TEMPLATE, R_ENV_NOT_ALLOWED, R_VOLUMES_NOT_ALLOWED})

# --- pool gauge states (corral_pool_sandboxes{state}) -------------------------------------------------------------
S_DESIRED: Final = "desired"      # what the pool wants now (WarmPool: idle replicas; Pool: total, see pool_desired)
S_READY: Final = "ready"          # idle and ready: claimable warm right now
S_IDLE: Final = "idle"            # not bound to a claim: ready + still starting
S_ALLOCATED: Final = "allocated"  # bound to a claim (or being released/recycled)
POOL_STATES: Final = (S_DESIRED, S_READY, S_IDLE, S_ALLOCATED)

PoolKind = Literal["WarmPool", "Pool"]
