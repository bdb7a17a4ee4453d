"""The one error shape `{code, message}` and the exception handlers that produce it for every failure."""

from __future__ import annotations

import errno
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
    416: "range_not_satisfiable",
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


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    headers = {k: v for k, v in (exc.headers or {}).items() if exc.status_code != 405 or k.lower() != "allow"}
    if exc.status_code == 405:  # Starlette names the first matching route's methods only (POST for /v1/command)
        headers["Allow"] = allowed_methods(request)
    return error_response(exc.status_code, str(exc.detail), headers=headers or None)


def allowed_methods(request: Request) -> str:
    """Every method some route serves at the request's path: the Allow header of a 405."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in getattr(request.app, "routes", []):
        if getattr(route, "methods", None) and route.matches({**request.scope, "type": "http"})[0] != Match.NONE:
            methods |= set(route.methods)
    return ", ".join(sorted(methods))


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ValidationError)
    return error_response(400, _validation_message(exc))


async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error", exc_info=exc)
    return error_response(500, f"{type(exc).__name__}: {exc}")


# errno -> (status, code): every filesystem or process-start OSError is answered from this one table.
_ERRNO = {
    errno.ENOENT: (404, "not_found"),
    errno.ENOTDIR: (400, "not_a_directory"),
    errno.EISDIR: (400, "is_a_directory"),
    errno.EEXIST: (409, "exists"),
    errno.ENOTEMPTY: (409, "not_empty"),
    errno.EBUSY: (409, "busy"),
    errno.ETXTBSY: (409, "busy"),
    errno.EACCES: (403, "forbidden"),
    errno.EPERM: (403, "forbidden"),
    errno.EROFS: (403, "read_only"),
    errno.EXDEV: (400, "cross_device"),
    errno.ELOOP: (400, "symlink_in_path"),
    errno.ENAMETOOLONG: (400, "name_too_long"),
    errno.EINVAL: (400, "invalid_request"),
    errno.E2BIG: (400, "too_large"),
    errno.ENOEXEC: (400, "not_executable"),
    errno.EMLINK: (400, "too_many_links"),
    errno.EFBIG: (413, "too_large"),
    errno.ENOSPC: (507, "no_space"),
    errno.EDQUOT: (507, "no_space"),
    errno.EMFILE: (503, "busy"),
    errno.ENFILE: (503, "busy"),
    errno.ENOMEM: (503, "busy"),
    errno.EIO: (500, "io_error"),
}


def os_error(exc: OSError, path: str | None = None) -> ExecdError:
    """Map an OSError onto the error shape (missing -> 404, permission -> 403, a symlink met where none may be
    -> 400, ...). An errno the table does not know is the request's doing far more often than the daemon's: 400."""
    status, code = _ERRNO.get(exc.errno or 0, (400, "os_error"))
    name = errno.errorcode.get(exc.errno or 0, "error")
    what = exc.strerror or str(exc)
    return ExecdError(status, f"{what}: {path}" if path else f"{what} ({name})", code)


async def _os_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, OSError)
    err = os_error(exc)
    return error_response(err.status, err.message, err.code)


HANDLERS = {
    ExecdError: _execd_error,
    HTTPException: _http_error,
    ValidationError: _validation_error,
    OSError: _os_error,  # a filesystem error no handler caught: still a 4xx in the error shape, never a 500
    Exception: _unexpected,
}
