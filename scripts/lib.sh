# Shared by every script under scripts/: paths, pinned versions, logging. Source it; don't run it.
set -euo pipefail
SCRIPTS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$SCRIPTS_DIR/.." && pwd)"
# shellcheck source=versions.env
source "$SCRIPTS_DIR/versions.env"

# Everything built or downloaded lives outside the repo, keyed by version, so a second run is a cache hit.
CORRAL_CACHE="${CORRAL_CACHE:-$HOME/.cache/corral}"
CORRAL_BIN="$CORRAL_CACHE/bin"              # $CORRAL_BIN/<tool>-<version>/<binaries>
CORRAL_RUN="${CORRAL_RUN:-$CORRAL_CACHE/run}"   # state of services the scripts start (cluster data, pids, logs)
CORRAL_VENV="${CORRAL_VENV:-$REPO_DIR/.venv}"
export GOMODCACHE="${GOMODCACHE_CORRAL:-$CORRAL_CACHE/go/mod}"
export GOCACHE="${GOCACHE_CORRAL:-$CORRAL_CACHE/go/build}"
export GOFLAGS="-buildvcs=false -mod=mod"
export GOTOOLCHAIN=local
export CGO_ENABLED=0
mkdir -p "$CORRAL_BIN" "$CORRAL_RUN"

log() { printf '\033[1;34m[corral]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[corral] error:\033[0m %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

# Directory of a tool's binaries for the pinned version.
tool_dir() { echo "$CORRAL_BIN/$1-$2"; }

# Runs "$@" and prints how long it took.
# The venv's python, with PyInstaller, for the offline bundle and image builds (sets PY).
pyinstaller_python() {
  PY="$CORRAL_VENV/bin/python"
  [[ -x "$PY" ]] || die "no venv at $CORRAL_VENV: run scripts/setup.sh first"
  "$PY" -c 'import PyInstaller' 2>/dev/null || "$PY" -m pip install -q 'pyinstaller>=6.10' || die "pyinstaller missing"
}

# One build of a kind at a time across processes: holds $CORRAL_CACHE/<kind>/.lock (fd 9) until the script exits.
build_lock() {
  mkdir -p "$CORRAL_CACHE/$1"
  exec 9>"$CORRAL_CACHE/$1/.lock"
  flock -w 1800 9 || die "another $1 build holds $CORRAL_CACHE/$1/.lock"
}

timed() { local t0=$SECONDS; "$@"; log "$1 took $((SECONDS - t0)) s"; }
