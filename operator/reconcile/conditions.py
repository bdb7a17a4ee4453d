"""Status conditions: set one, keep lastTransitionTime unless the status flips, and compare statuses cheaply."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(conditions: list[dict[str, Any]] | None, type_: str, status: bool | str, reason: str,
                  message: str = "", generation: int | None = None) -> list[dict[str, Any]]:
    status_s = status if isinstance(status, str) else ("True" if status else "False")
    out = [dict(c) for c in conditions or [] if c.get("type") != type_]
    old = next((c for c in conditions or [] if c.get("type") == type_), None)
    cond = {"type": type_, "status": status_s, "reason": reason, "message": message,
            "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status_s
            and old.get("lastTransitionTime") else now_iso()}
    if generation is not None:
        cond["observedGeneration"] = generation
    out.append(cond)
    return sorted(out, key=lambda c: c["type"])


def condition(conditions: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def differs(current: dict[str, Any] | None, desired: dict[str, Any]) -> bool:
    """True if any desired key differs from current (ignoring condition timestamps)."""
    current = current or {}
    for key, value in desired.items():
        have = current.get(key)
        if key == "conditions":
            strip = lambda cs: sorted(  # noqa: E731
                [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in cs or []],
                key=lambda c: c.get("type", ""))
            if strip(have) != strip(value):
                return True
        elif have != value:
            return True
    return False
