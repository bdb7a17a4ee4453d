"""execd tokens of the Docker runtime: derived, never stored (a module of its own, free of the runtime's metrics, so
tests and tools can derive a token in any process)."""

from __future__ import annotations

import hashlib
import hmac
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .store import ClaimRow


def execd_token(secret: bytes, sandbox: str, claim: ClaimRow | None = None) -> str:
    """A sandbox's execd token: HMAC(secret, docker/<sandbox>) while idle, and bound to the claim while claimed
    (its name and creation time, so a later claim of the same name gets another). The operator stores none."""
    what = f"docker/{sandbox}" if claim is None else f"docker/{sandbox}/claim/{claim.name}/{claim.created!r}"
    return hmac.new(secret, what.encode(), hashlib.sha256).hexdigest()
