"""execd's self-contained bundle: a PyInstaller --onedir build that runs in images without Python.

`ensure_bundle()` returns the bundle tar (entries under `opt/corral/execd/`, for `put_archive` at `/`), building it
with `scripts/execd-bundle.sh` when the cache has none for the current sources. The cache key hashes execd's sources,
the build script and the versions of Python and of every package the bundle contains, so any change rebuilds.

    python -m corral.execd.bundle --key    # the cache key (used by the script)
    python -m corral.execd.bundle          # ensure the bundle, print the tar path
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
REPO = SOURCE_DIR.parent
SCRIPT = REPO / "scripts" / "execd-bundle.sh"
BUNDLED = ("starlette", "uvicorn", "pydantic", "pydantic-core", "anyio", "httpx", "httpcore", "h11", "websockets",
           "uvloop", "httptools", "pyinstaller")
INSTALL_DIR = "/opt/corral/execd"  # where the tar puts the bundle; the executable is INSTALL_DIR/execd
TAR_NAME = "execd-bundle.tar"
BUILD_TIMEOUT = 1800


def cache_dir() -> Path:
    return Path(os.environ.get("CORRAL_CACHE") or Path.home() / ".cache" / "corral") / "execd"


def build_key(sources: list[Path], distributions: tuple[str, ...], *extra: str) -> str:
    """A PyInstaller build's cache key: its sources (path relative to the repo + content), the Python version, the
    versions of the bundled distributions and any `extra` keys (e.g. a bundle it contains). Used for execd's bundle
    and the operator image."""
    h = hashlib.sha256()
    for path in sources:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    for item in (sys.version, *extra):
        h.update(item.encode() + b"\0")
    for dist in distributions:
        try:
            h.update(f"{dist}=={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}==missing".encode())
    return h.hexdigest()[:16]


def cache_key() -> str:
    return build_key(sorted(SOURCE_DIR.glob("*.py")) + [SCRIPT], BUNDLED)


def bundle_tar(key: str | None = None) -> Path:
    return cache_dir() / (key or cache_key()) / TAR_NAME


def ensure_bundle(*, timeout: float = BUILD_TIMEOUT) -> Path:
    """Path of the bundle tar for the current sources; builds it (offline, from the venv) if missing."""
    tar = bundle_tar()
    if tar.is_file():
        return tar
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not tar.is_file():
        raise RuntimeError(f"{SCRIPT} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return tar


if __name__ == "__main__":
    if sys.argv[1:] == ["--key"]:
        print(cache_key())
    else:
        print(ensure_bundle())
