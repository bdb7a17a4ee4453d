"""The OpenAPI document of the claims API, built from the FastAPI app; committed as operator/claimsapi/openapi.json.

    python -m corral.operator.claimsapi.openapi           # rewrite operator/claimsapi/openapi.json
    python -m corral.operator.claimsapi.openapi --check   # exit 1 if the committed file differs (the drift test)

The document is what the app serves at /openapi.json (routes, models, the bearer security scheme); building it
needs no backend, so a stand-in that answers nothing is used.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

DOCUMENT = Path(__file__).with_name("openapi.json")


class _NoBackend:
    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def document() -> dict[str, Any]:
    from .app import create_app

    return create_app(_NoBackend(), "openapi").openapi()


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not DOCUMENT.exists() or DOCUMENT.read_text() != text:
            print(f"{DOCUMENT} is stale: run `python -m corral.operator.claimsapi.openapi`", file=sys.stderr)
            return 1
        return 0
    DOCUMENT.write_text(text)
    print(f"wrote {DOCUMENT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
