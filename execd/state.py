"""What the routers share: settings, the path policy, metrics, injected env and the live commands and PTYs."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .metrics import Metrics
from .paths import Target, confine, locate
from .retention import Retention
from .settings import Settings

if TYPE_CHECKING:
    from starlette.requests import HTTPConnection


@dataclass
class State:
    settings: Settings
    metrics: Metrics
    roots: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # PUT /v1/env: merged into every later command and PTY
    commands: dict[str, Any] = field(default_factory=dict)
    ptys: dict[str, Any] = field(default_factory=dict)
    retention: Retention = field(init=False)
    token: bytes = b""  # the one AuthMiddleware compares with; PUT /v1/token replaces it
    on_token: Callable[[str], None] | None = None  # tells the supervisor (server.py), so a restart keeps it

    def __post_init__(self) -> None:
        self.roots = self.settings.allowed_roots()
        self.retention = Retention(self.settings.retained_output_bytes)
        self.token = self.settings.token.encode()

    def rotate_token(self, token: str) -> None:
        self.token = token.encode()
        if self.on_token is not None:
            self.on_token(token)

    @property
    def workspace(self) -> str:
        return os.path.realpath(self.settings.workspace)

    def path(self, raw: str, *, follow: bool = True) -> str:
        return confine(raw, self.roots, self.workspace, follow=follow)

    def target(self, raw: str, *, follow: bool = True) -> Target:
        """The confined entry, to be opened relative to directory fds (paths.Target): what every file op uses."""
        return locate(raw, self.roots, self.workspace, follow=follow)


def get_state(conn: HTTPConnection) -> State:
    return conn.app.state.execd
