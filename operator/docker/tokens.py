"""execd tokens of the Docker runtime: derived, never stored (a module of its own, free of the runtime's metrics, so
tests and tools can derive a token in any process)."""

from __future__ import annotations

import hashlib
import hmac
from typing import Protocol


class Holder(Protocol):
    """What holds a sandbox: a claim (store.ClaimRow), or one index of a batch (store.IndexHolder)."""

    @property
    def name(self) -> str: ...

    @property
    def created(self) -> float: ...


def execd_token(secret: bytes, sandbox: str, claim: Holder | None = None) -> str:
    """A sandbox's execd token: HMAC(secret, docker/<sandbox>) while idle, and bound to its holder while held (a
    claim's name and creation time, so a later claim of the same name gets another; a batch index's claim label
    `<batch>_<index>` and its batch's creation time). The operator stores none."""
    what = f"docker/{sandbox}" if claim is None else f"docker/{sandbox}/claim/{claim.name}/{claim.created!r}"
    return hmac.new(secret, what.encode(), hashlib.sha256).hexdigest()
