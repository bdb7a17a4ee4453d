"""Field types for request models that start processes: refuse at the edge what the OS would choke on.

A NUL byte, a lone surrogate (JSON allows `"\\ud800"`, which no filesystem or exec call can encode) or an env name
with `=` would otherwise surface deep inside `subprocess` as a ValueError or a broken environment: here they are a
validation error, which the endpoint layer answers with 400 in the error shape.
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import AfterValidator, Field

MAX_TIMEOUT_SECONDS = 30 * 86400.0  # asyncio cannot schedule a timer much further out; nobody needs more


def _plain(value: str) -> str:
    if "\x00" in value:
        raise ValueError("contains a NUL byte")
    try:
        os.fsencode(value)
    except UnicodeEncodeError:
        raise ValueError("is not valid UTF-8 (lone surrogate)") from None
    return value


def _env_name(value: str) -> str:
    _plain(value)
    if not value or "=" in value:
        raise ValueError(f"invalid environment variable name {value[:100]!r} (empty or contains '=')")
    return value


Text = Annotated[str, AfterValidator(_plain)]
EnvName = Annotated[str, AfterValidator(_env_name)]
EnvMap = dict[EnvName, Text]
UserSpec = Annotated[str, Field(max_length=256), AfterValidator(_plain)]
CommandKey = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_plain)]
