"""The Docker-mode operator: `python -m corral.operator.docker` (the operator image runs the same entry point).

Configuration (env):
    CORRAL_STACK           stack name (labels: corral.dev/stack=<stack>)                      required
    CORRAL_POOLS_FILE      the pools file (desired state) written by DockerStack             required
    CORRAL_STATE_DIR       SQLite store and secrets (the operator's state volume)           /var/lib/corral
    CORRAL_API_TOKEN / CORRAL_API_TOKEN_FILE   bearer token of the claims API                  required
    CORRAL_API_HOST, CORRAL_API_PORT           listen address                          127.0.0.1, 7780
    CORRAL_EXECD_BUNDLE    execd bundle tar (default: built/cached by corral.execd.bundle)
    CORRAL_MAX_BATCH       slow-start cap of pool creates and deletes (as on Kubernetes)       32
    CORRAL_SANDBOX_HEALTH_INTERVAL  seconds between the engine's execd probes in each sandbox     10
                           (engine.healthcheck; 0: no probe, a dead execd is found at the next bind)
    CORRAL_LOG_LEVEL       info
    DOCKER_HOST            the engine (default: the local socket)
SIGHUP reloads the pools file (the DockerStack component sends it after rewriting the file).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import sys
from pathlib import Path

import uvicorn

from corral.operator.claimsapi import create_app
from corral.operator.planning import MAX_BATCH

from . import desired as pools_file
from . import engine
from .runtime import DockerRuntime
from .settings import Settings
from .store import Store

log = logging.getLogger("corral.operator.docker")


def _env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None:
        sys.exit(f"corral operator: {name} is required")
    return value


def _token() -> str:
    if path := os.environ.get("CORRAL_API_TOKEN_FILE"):
        return Path(path).read_text().strip()
    return _env("CORRAL_API_TOKEN")


def _execd_bundle() -> tuple[str, str]:
    if tar := os.environ.get("CORRAL_EXECD_BUNDLE"):
        key = os.environ.get("CORRAL_EXECD_BUNDLE_KEY") or hashlib.sha256(Path(tar).read_bytes()).hexdigest()[:16]
        return tar, key
    from corral.execd import bundle  # only outside the image: build/cached from the sources

    return str(bundle.ensure_bundle()), bundle.cache_key()


def _max_batch() -> int:
    raw = os.environ.get("CORRAL_MAX_BATCH") or str(MAX_BATCH)
    if not raw.isdigit() or not 1 <= int(raw) <= 500:
        sys.exit(f"corral operator: CORRAL_MAX_BATCH must be an integer in 1..500, not {raw!r}")
    return int(raw)


def _health_interval() -> float:
    raw = os.environ.get("CORRAL_SANDBOX_HEALTH_INTERVAL") or str(engine.HEALTH_INTERVAL)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value == 0 or 1 <= value <= 3600):
        sys.exit(f"corral operator: CORRAL_SANDBOX_HEALTH_INTERVAL must be 0 or seconds in 1..3600, not {raw!r}")
    return value


async def serve() -> None:
    logging.basicConfig(level=os.environ.get("CORRAL_LOG_LEVEL", "info").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    pools_file_path = _env("CORRAL_POOLS_FILE")
    desired = pools_file.load(pools_file_path)
    stack = os.environ.get("CORRAL_STACK", desired.stack)
    state = Path(os.environ.get("CORRAL_STATE_DIR", "/var/lib/corral"))
    tar, key = _execd_bundle()
    settings = Settings(stack=stack, execd_tar=tar, execd_key=key, max_batch=_max_batch(),
                        health_interval=_health_interval())
    store = Store(state / "corral.db")
    client = engine.connect(os.environ.get("DOCKER_HOST"))
    runtime = DockerRuntime(settings, desired, store, client)
    await runtime.start()
    app = create_app(runtime, _token())
    config = uvicorn.Config(app, host=os.environ.get("CORRAL_API_HOST", "127.0.0.1"),
                            port=int(os.environ.get("CORRAL_API_PORT", "7780")), log_level="warning",
                            lifespan="on", access_log=False, timeout_keep_alive=30, backlog=2048)
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()

    def reload() -> None:
        async def go() -> None:
            try:
                await runtime.reload(pools_file.load(pools_file_path))
                log.info("pools file reloaded")
            except Exception:  # noqa: BLE001 - a bad file keeps the old desired state
                log.exception("pools file %s not reloaded", pools_file_path)
        runtime.spawn(go())

    loop.add_signal_handler(signal.SIGHUP, reload)
    # uvicorn stops on SIGTERM and then raises it again for the handler that was there before it started: with
    # SIGTERM's default action the process would end right there, before the runtime stops (Docker calls cut off
    # mid-way, a container left half removed). The server is stopping anyway: nothing more to do on it.
    signal.signal(signal.SIGTERM, lambda *_: None)
    log.info("operator for stack %s: %d templates, %d warm pools, %d pools; API on %s:%s", stack,
             len(desired.templates), len(desired.warm_pools), len(desired.pools), config.host, config.port)
    try:
        await server.serve()
    finally:
        await runtime.stop()
        store.close()


def main() -> int:
    try:
        import uvloop  # the claims API's hot path: libuv loop + httptools parser (both in the image)
    except ImportError:
        asyncio.run(serve())
    else:
        uvloop.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
