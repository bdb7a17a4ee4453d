"""Process entry point: settings from the environment, then uvicorn (uvloop + httptools when available)."""

from __future__ import annotations

import sys


def install(dest: str) -> int:
    """`execd install DEST`: copy this bundle (the directory of the running executable) to DEST. The Kubernetes
    initContainer runs it to fill the shared emptyDir, so the execd image needs no shell or coreutils."""
    import os
    import shutil

    if not getattr(sys, "frozen", False):
        print("corral-execd: install only works from the bundle", file=sys.stderr)
        return 2
    # Entry by entry: DEST itself is the volume's root, owned by root on a real node (fsGroup only adds group
    # write), so its own mode and times cannot be set by the sandbox user; copytree(src, DEST) would try, and fail.
    src = os.path.dirname(os.path.abspath(sys.executable))
    for entry in os.scandir(src):
        target = os.path.join(dest, entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            shutil.copytree(entry.path, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(entry.path, target)
    print(f"corral-execd: installed into {dest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["install"] and len(args) == 2:
        return install(args[1])
    if args:
        print("usage: execd            (serve; configured by CORRAL_EXECD_* env)\n       execd install DEST",
              file=sys.stderr)
        return 2
    import os

    # pydantic looks for plugins through importlib.metadata on first use (~40 ms scanning every installed
    # distribution): execd uses none, and its start-up is on the sandbox cold-start path.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
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
