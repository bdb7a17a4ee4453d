"""The Docker runtime's settings (main.py reads them from the environment)."""

from __future__ import annotations

from dataclasses import dataclass

from corral.operator.planning import MAX_BATCH

from . import engine


@dataclass
class Settings:
    stack: str
    execd_tar: str
    execd_key: str
    max_batch: int = MAX_BATCH          # slow-start cap of pool creates and deletes (CORRAL_MAX_BATCH)
    ready_timeout: float = 120.0        # container start -> execd healthy, at most
    max_cold_creates: int = 8           # concurrent cold starts for claims
    max_pool_creates: int = 4           # concurrent creates per pool batch (after slow start)
    threads: int = 48
    health_interval: float = engine.HEALTH_INTERVAL  # the engine's execd probe in each sandbox; 0: none
