#!/usr/bin/env bash
# Build execd's self-contained bundle (PyInstaller --onedir, from the venv, offline) for images without Python.
#   scripts/execd-bundle.sh [--force]   -> prints the tar path
# Output, keyed by a hash of execd's sources and bundled package versions (corral.execd.bundle.cache_key):
#   $CORRAL_CACHE/execd/<key>/opt/corral/execd/execd   the executable (+ _internal/)
#   $CORRAL_CACHE/execd/<key>/execd-bundle.tar         the same tree as a tar, for Docker put_archive at /
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pyinstaller_python

key="$("$PY" -m corral.execd.bundle --key)"
out="$CORRAL_CACHE/execd/$key"
tar="$out/execd-bundle.tar"
build_lock execd
if [[ -f "$tar" && "${1:-}" != "--force" ]]; then
  echo "$tar"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Stage corral.execd as a plain package: PyInstaller's analysis does not follow the editable-install finder.
mkdir -p "$work/src/corral/execd"
cp "$REPO_DIR"/execd/*.py "$REPO_DIR/execd/openapi.json" "$work/src/corral/execd/"
: >"$work/src/corral/__init__.py"
cat >"$work/entry.py" <<'PY'
import sys

from corral.execd.server import main

sys.exit(main())
PY

log "building execd bundle $key (PyInstaller --onedir)"
t0=$SECONDS
(cd "$work" && "$PY" -m PyInstaller --onedir --name execd --noconfirm --clean --log-level WARN --strip \
  --paths "$work/src" --distpath "$work/dist" --workpath "$work/build" --specpath "$work" \
  --collect-submodules uvicorn --hidden-import uvloop --hidden-import httptools \
  --hidden-import websockets.asyncio.client --hidden-import httpx \
  --exclude-module tkinter --exclude-module matplotlib --exclude-module numpy --exclude-module pytest \
  --exclude-module PIL --exclude-module yaml --exclude-module watchfiles --exclude-module dotenv \
  --exclude-module rich --exclude-module pygments --exclude-module IPython \
  --exclude-module corral.execd.bundle --exclude-module corral.execd.inject --exclude-module corral.execd.openapi \
  entry.py) >&2 || die "PyInstaller failed"

# Smoke test before publishing: the bundle must start and answer /v1/health.
port="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
CORRAL_EXECD_TOKEN=smoke CORRAL_EXECD_HOST=127.0.0.1 CORRAL_EXECD_PORT="$port" "$work/dist/execd/execd" >"$work/smoke.log" 2>&1 &
pid=$!
ok=""
for _ in $(seq 1 300); do
  if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/v1/health', timeout=1)" 2>/dev/null; then ok=1; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill "$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
[[ -n "$ok" ]] || { cat "$work/smoke.log" >&2; die "the bundle did not answer /v1/health"; }

mkdir -p "$work/root/opt/corral"
mv "$work/dist/execd" "$work/root/opt/corral/execd"
tar -C "$work/root" --numeric-owner --owner=0 --group=0 -cf "$work/$(basename "$tar")" opt
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
mv "$work/root/opt" "$out.tmp/opt"
mv "$work/$(basename "$tar")" "$out.tmp/"
rm -rf "$out" && mv "$out.tmp" "$out"
log "bundle $key: $(du -sh "$out/opt" | cut -f1) in $((SECONDS - t0)) s -> $tar"
echo "$tar"
