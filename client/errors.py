"""Typed exceptions. Every error the server sends is `{code, message}` with a 4xx/5xx status; the client raises the
matching subclass of `CorralError` carrying both, so `except NotFound as e: print(e.message)` shows the server's words.

    CorralError
    ├── InvalidRequest       400 (the API's `invalid`, execd's `invalid_request`, ...)
    ├── Unauthorized         401 (missing or wrong token)
    ├── Forbidden            403 (execd's path policy)
    ├── NotFound             404 (claim, pool, file, command, terminal)
    ├── Conflict             409 (pool at poolMax, destination exists, ...)
    │   └── NotReady         409 from the claims API: the claim is Pending/Paused/Expired/Failed, not Ready
    ├── ClaimFailed          the claim ended Failed or Expired instead of becoming Ready (or did not in time)
    ├── Unavailable          502/503/504 (the sandbox is gone or its execd does not answer)
    ├── ServerError          any other 5xx
    └── TransportError       no answer at all (connection refused, timeout), after the retries
"""

from __future__ import annotations

import json
import re
from typing import Any


class CorralError(Exception):
    """Base of every error the client raises; `status`, `code` and `message` are the server's when it answered."""

    status: int | None = None
    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None, method: str = "",
                 path: str = ""):
        super().__init__(message)
        self.message = message
        self.code = code or type(self).code
        self.status = status if status is not None else type(self).status
        self.method, self.path = method, path

    def __str__(self) -> str:
        where = f" ({self.method} {self.path})" if self.method else ""
        status = f"{self.status} " if self.status else ""
        return f"[{status}{self.code}] {self.message}{where}"


class InvalidRequest(CorralError):
    status, code = 400, "invalid"


class Unauthorized(CorralError):
    status, code = 401, "unauthorized"


class Forbidden(CorralError):
    status, code = 403, "forbidden"


class NotFound(CorralError):
    status, code = 404, "not_found"


class Conflict(CorralError):
    status, code = 409, "conflict"


class NotReady(Conflict):
    """The claim exists but is not Ready (Pending, Paused, Expired or Failed): its sandbox cannot be used now."""


class ClaimFailed(CorralError):
    code = "claim_failed"

    def __init__(self, message: str, *, claim: Any = None, **kw: Any):
        super().__init__(message, **kw)
        self.claim = claim


class Unavailable(CorralError):
    status, code = 503, "unavailable"


class ServerError(CorralError):
    status, code = 500, "internal"


class TransportError(CorralError):
    code = "transport"


BY_STATUS: dict[int, type[CorralError]] = {
    400: InvalidRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 413: InvalidRequest,
    422: InvalidRequest, 502: Unavailable, 503: Unavailable, 504: Unavailable,
}
# The claims API answers 409 "claim x is Paused, not Ready" when a claim's sandbox cannot be reached or changed
# (a backend may also use the code `not_ready`).
_NOT_READY = re.compile(r"\bis (Pending|Paused|Expired|Failed), not\b")


def error_from(status: int, body: bytes, *, method: str = "", path: str = "") -> CorralError:
    """The exception for an HTTP error answer (the `{code, message}` body, or the raw text if it is not one)."""
    code, message = None, body.decode(errors="replace").strip() or f"HTTP {status}"
    try:
        data = json.loads(body)
        if isinstance(data, dict) and "message" in data:
            code, message = data.get("code"), str(data["message"])
    except ValueError:
        pass
    cls = BY_STATUS.get(status) or (ServerError if status >= 500 else CorralError)
    if cls is Conflict and (code == "not_ready" or (code == "conflict" and _NOT_READY.search(message))):
        cls = NotReady
    elif code == "claim_failed":  # the operator gave the claim a Failed condition (any status): say so by type
        cls = ClaimFailed
    return cls(message, code=code, status=status, method=method, path=path)
