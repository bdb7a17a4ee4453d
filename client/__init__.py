"""corral.client: the Python SDK and the `corral` CLI.

    from corral.client import Client

    with Client() as client:                                  # CORRAL_API_URL/TOKEN or ~/.config/corral/config.toml
        with client.claim(pool="python", ttl=600) as sbx:     # released on exit
            print(sbx.commands.run("python3 -c 'print(6*7)'").stdout)

`AsyncClient` is the asyncio twin. Errors are the typed exceptions of `corral.client.errors`.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._ops import Retry
    from .aio import AsyncBatchHandle, AsyncClient, AsyncSandbox
    from .errors import (
        ClaimFailed,
        Conflict,
        CorralError,
        Forbidden,
        InvalidRequest,
        NotFound,
        NotReady,
        ServerError,
        TransportError,
        Unauthorized,
        Unavailable,
    )
    from .models import (
        Batch,
        BatchEvent,
        BatchTaskResult,
        Claim,
        CommandResult,
        CommandStatus,
        Exit,
        FileInfo,
        Output,
        PoolStatus,
        RetainedSandbox,
        SearchResult,
        Snapshot,
    )
    from .sync import BatchHandle, Client, Sandbox
    from .terminal import AsyncTerminal, Terminal

__all__ = [
    "Client", "Sandbox", "AsyncClient", "AsyncSandbox", "BatchHandle", "AsyncBatchHandle", "Terminal", "AsyncTerminal",
    "Retry",
    "CorralError", "InvalidRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "NotReady", "ClaimFailed",
    "Unavailable", "ServerError", "TransportError",
    "Claim", "PoolStatus", "Snapshot", "RetainedSandbox", "CommandResult", "CommandStatus", "Output", "Exit",
    "FileInfo",
    "SearchResult", "Batch", "BatchTaskResult", "BatchEvent",
]

# Each name is imported from its module on first use (PEP 562), so `corral --help` and `corral.client.errors` do not
# pay for httpx, pydantic and the models.
_HOME = {
    "Retry": "_ops", "AsyncClient": "aio", "AsyncSandbox": "aio", "Client": "sync", "Sandbox": "sync",
    "BatchHandle": "sync", "AsyncBatchHandle": "aio",
    "Terminal": "terminal", "AsyncTerminal": "terminal",
    **dict.fromkeys(["CorralError", "InvalidRequest", "Unauthorized", "Forbidden", "NotFound", "Conflict", "NotReady",
                     "ClaimFailed", "Unavailable", "ServerError", "TransportError"], "errors"),
    **dict.fromkeys(["Claim", "PoolStatus", "Snapshot", "RetainedSandbox", "CommandResult", "CommandStatus", "Output",
                     "Exit", "FileInfo", "SearchResult", "Batch", "BatchTaskResult", "BatchEvent"], "models"),
}


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
