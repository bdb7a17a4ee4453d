"""One bound on the background output execd retains, across all commands (not only per command).

Each background command keeps at most `log_buffer_bytes` of output, and up to `max_finished_commands` finished ones
are kept for status and logs: 256 x 8 MiB would be 2 GiB in a sandbox of 512 MiB. `Retention` keeps the sum under
`limit`: when a chunk takes it over, the output of the finished commands goes first, the one that finished longest
ago first, then the oldest chunks of the running commands, the largest log first. Every command that lost output
this way says so in its logs answer (`truncated`, `dropped`, `dropped_bytes`).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("corral.execd")


class Retention:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.commands: dict[str, Any] = {}  # id -> runner.Command (background ones), in start order

    def track(self, cmd: Any) -> None:
        self.commands[cmd.id] = cmd

    def forget(self, cmd: Any) -> None:
        """The command is no longer retained at all: its log stops counting."""
        if self.commands.pop(cmd.id, None) is not None:
            self.total -= cmd.log_size

    def grew(self, n: int) -> None:
        self.total += n
        if self.total > self.limit:
            self._evict()

    def shrank(self, n: int) -> None:
        self.total -= n

    def _evict(self) -> None:
        finished = sorted((c for c in self.commands.values() if not c.running and c.log), key=lambda c: c.finished)
        for cmd in finished:
            if self.total <= self.limit:
                return
            log.warning("execd: retained output over %d bytes: dropping finished command %s's %d bytes",
                        self.limit, cmd.id, cmd.log_size)
            cmd.drop_oldest(len(cmd.log))
        running = sorted((c for c in self.commands.values() if c.running and c.log), key=lambda c: -c.log_size)
        for cmd in running:
            while self.total > self.limit and cmd.log:
                cmd.drop_oldest(1)
            if self.total <= self.limit:
                return
