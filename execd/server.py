"""Process entry point: settings from the environment, then uvicorn (uvloop + httptools when available)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    from .settings import Settings

    try:
        settings = Settings.from_env()
    except (ValidationError, OSError) as exc:
        print(f"corral-execd: bad configuration: {exc}", file=sys.stderr)
        print("set CORRAL_EXECD_TOKEN or CORRAL_EXECD_TOKEN_FILE (see corral.execd.settings)", file=sys.stderr)
        return 2
    import uvicorn

    from .app import create_app

    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        ws_max_size=16 << 20,
        timeout_graceful_shutdown=3,
        server_header=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
