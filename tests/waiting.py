"""Polling shared by the test tiers (imported by name: tests/ is on sys.path through its conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(predicate: Callable[[], Any], timeout: float = 60, interval: float = 0.25, what: str = "",
               dump: Callable[[], Any] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            extra = f"\nstate: {dump()}" if dump else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}; last: {last!r}{extra}")
        time.sleep(interval)
