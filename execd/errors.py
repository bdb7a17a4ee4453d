"""The one error shape `{code, message}` and the exception handlers that produce it for every failure."""

from __future__ import annotations

import logging

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

log = logging.getLogger("corral.execd")

# Status -> code used when a failure carries no code of its own (HTTPException from routing, for example).
CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    500: "internal",
    502: "bad_gateway",
}


class Error(BaseModel):
    """Every non-2xx answer of execd has this body."""

    code: str
    message: str


class ExecdError(Exception):
    """Raise anywhere in a handler to answer `status` with `{code, message}`."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or CODES.get(status, "error")
        self.message = message


def error_response(status: int, message: str, code: str | None = None, headers: dict | None = None) -> JSONResponse:
    body = {"code": code or CODES.get(status, "error"), "message": message}
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_message(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(x) for x in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts)


async def _execd_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ExecdError)
    return error_response(exc.status, exc.message, exc.code)


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return error_response(exc.status_code, str(exc.detail), headers=exc.headers)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ValidationError)
    return error_response(400, _validation_message(exc))


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, f"{type(exc).__name__}: {exc}")


HANDLERS = {
    ExecdError: _execd_error,
    HTTPException: _http_error,
    ValidationError: _validation_error,
    Exception: _unexpected,
}


def os_error(exc: OSError, path: str) -> ExecdError:
    """Map a filesystem OSError onto the error shape (missing -> 404, permission -> 403, ...)."""
    import errno

    mapping = {
        errno.ENOENT: (404, "not_found"),
        errno.ENOTDIR: (400, "not_a_directory"),
        errno.EISDIR: (400, "is_a_directory"),
        errno.EEXIST: (409, "exists"),
        errno.ENOTEMPTY: (409, "not_empty"),
        errno.EACCES: (403, "forbidden"),
        errno.EPERM: (403, "forbidden"),
        errno.EXDEV: (400, "cross_device"),
        errno.ENOSPC: (507, "no_space"),
        errno.ELOOP: (400, "symlink_loop"),
    }
    status, code = mapping.get(exc.errno or 0, (500, "io_error"))
    return ExecdError(status, f"{exc.strerror or exc}: {path}", code)
