"""The operator image (`corral/operator:<key>`): a PyInstaller bundle of the Docker-mode operator on corral/base
(no Python in the image), plus execd's bundle tar for the sandboxes. Built offline by scripts/operator-image.sh.

The key hashes the operator's sources (and those it imports), the build script, execd's bundle key and the versions
of Python and of the bundled packages, so any change gives a new tag and a rebuild.

    python -m corral.operator.docker.image --key    # the key (used by the script)
    python -m corral.operator.docker.image          # ensure the image, print its tag
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

OPERATOR_DIR = Path(__file__).resolve().parents[1]
REPO = OPERATOR_DIR.parent
SCRIPT = REPO / "scripts" / "operator-image.sh"
REPOSITORY = "corral/operator"
BUNDLED = ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core", "anyio", "httpx", "httpcore", "h11",
           "docker", "requests", "urllib3", "prometheus-client", "uvloop", "httptools", "pyinstaller")
BUILD_TIMEOUT = 1800


def sources() -> list[Path]:
    return sorted([*OPERATOR_DIR.glob("docker/*.py"), *OPERATOR_DIR.glob("claimsapi/*.py"),
                   *OPERATOR_DIR.glob("core/*.py"),
                   OPERATOR_DIR / "planning.py", OPERATOR_DIR / "constants.py", OPERATOR_DIR / "taskexec.py",
                   *(REPO / "api").glob("*.py"),
                   REPO / "execd" / "wsrelay.py", REPO / "execd" / "wire.py", SCRIPT])


def cache_key() -> str:
    from corral.execd import bundle

    return bundle.build_key(sources(), BUNDLED, bundle.cache_key())


def tag(key: str | None = None) -> str:
    return f"{REPOSITORY}:{key or cache_key()}"


def ensure_image(*, timeout: float = BUILD_TIMEOUT) -> str:
    """The operator image's tag for the current sources; builds it (offline) when the engine lacks it."""
    import docker
    from docker.errors import ImageNotFound

    ref = tag()
    client = docker.from_env()
    try:
        client.images.get(ref)
        return ref
    except ImageNotFound:
        pass
    finally:
        client.close()
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{SCRIPT} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return ref


if __name__ == "__main__":
    print(cache_key() if sys.argv[1:] == ["--key"] else ensure_image())
