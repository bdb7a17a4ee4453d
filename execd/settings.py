"""execd's configuration: one typed class, read from the environment once at startup."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from . import wire

ENV_PREFIX = wire.ENV_PREFIX
DEFAULT_PORT = wire.PORT
MAX_RETAINED_OUTPUT = 64 << 20  # all background commands' logs together (per command: log_buffer_bytes)
SEARCH_BUDGET_SECONDS = 10.0


class Settings(BaseModel):
    """Everything execd can be told. `from_env()` is the only place that reads `CORRAL_EXECD_*`."""

    token: str = Field(min_length=1, description="Per-sandbox access token (CORRAL_EXECD_TOKEN or _TOKEN_FILE).")
    host: str = Field("0.0.0.0", description="Listen address (CORRAL_EXECD_HOST).")
    port: int = Field(DEFAULT_PORT, ge=0, le=65535, description="Listen port (CORRAL_EXECD_PORT); 0 picks one.")
    workspace: Path = Field(Path("/workspace"), description="Default cwd and relative-path base.")
    roots: list[Path] = Field(default_factory=list, description="Allowed roots for /files and /directories.")
    max_output_bytes: int = Field(16 << 20, ge=1024, description="Per stream cap of a run-to-completion command.")
    log_buffer_bytes: int = Field(8 << 20, ge=1024, description="Retained output of a background command.")
    pty_buffer_bytes: int = Field(1 << 20, ge=1024, description="PTY output kept for reattach replay.")
    kill_grace_seconds: float = Field(2.0, ge=0, description="SIGTERM to SIGKILL escalation on interrupt.")
    max_finished_commands: int = Field(256, ge=1, description="Finished background commands kept for status/logs.")
    retained_output_bytes: int = Field(
        MAX_RETAINED_OUTPUT, ge=1024,
        description="Background output retained across all commands; the oldest finished commands' goes first.",
    )
    search_budget_seconds: float = Field(SEARCH_BUDGET_SECONDS, gt=0, description="Time one files/search may walk.")
    log_level: str = Field("warning", description="uvicorn log level.")

    @field_validator("roots")
    @classmethod
    def _absolute_roots(cls, roots: list[Path]) -> list[Path]:
        for root in roots:
            if not root.is_absolute():
                raise ValueError(f"root {root} is not absolute")
        return roots

    def allowed_roots(self) -> list[str]:
        """The roots, defaulting to the workspace and /tmp, as real paths (symlinked roots resolved)."""
        roots = self.roots or [self.workspace, Path("/tmp")]
        return [os.path.realpath(r) for r in roots]

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        token = env.get(ENV_PREFIX + "TOKEN")
        token_file = env.get(ENV_PREFIX + "TOKEN_FILE")
        if not token and token_file:
            token = Path(token_file).read_text().strip()
        if token:
            values["token"] = token
        for key in cls.model_fields:
            if key in ("token", "roots"):
                continue
            if (raw := env.get(ENV_PREFIX + key.upper())) is not None:
                values[key] = raw
        if raw_roots := env.get(ENV_PREFIX + "ROOTS"):
            values["roots"] = [r for r in re.split(r"[,:]", raw_roots) if r]
        values.update(overrides)
        return cls.model_validate(values)
