#!/usr/bin/env bash
# Build the Docker-mode operator image offline: a PyInstaller --onedir bundle of `corral.operator.docker` on top of
# corral/base (no Python in the image), with execd's bundle tar for the sandboxes.
#   scripts/operator-image.sh [--force]   -> prints the image tag, corral/operator:<key>
# The key (corral.operator.docker.image.cache_key) hashes the sources, this script, execd's bundle key and the
# bundled package versions; an image with that tag is a cache hit. Nothing is written into the repository.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pyinstaller_python
have docker || die "no docker CLI: run scripts/docker.sh engine"

key="$("$PY" -m corral.operator.docker.image --key)"
tag="corral/operator:$key"
build_lock operator
if docker image inspect "$tag" >/dev/null 2>&1 && [[ "${1:-}" != "--force" ]]; then
  echo "$tag"
  exit 0
fi
docker image inspect corral/base:"$DEBIAN_SUITE" >/dev/null 2>&1 || "$SCRIPTS_DIR/docker.sh" images

execd_tar="$("$SCRIPTS_DIR/execd-bundle.sh")"
execd_key="$("$PY" -m corral.execd.bundle --key)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Stage corral.* as plain packages: PyInstaller's analysis does not follow the editable-install finder. Inside the
# staged `corral` package, operator/ may have an __init__.py (it cannot shadow the standard library there).
src="$work/src/corral"
mkdir -p "$src/operator/docker" "$src/operator/claimsapi" "$src/operator/core" "$src/api" "$src/execd"
: >"$src/__init__.py"
: >"$src/operator/__init__.py"
: >"$src/execd/__init__.py"
cp "$REPO_DIR"/execd/wsrelay.py "$REPO_DIR"/execd/wire.py "$src/execd/"  # the claims API's WebSocket relay and
# execd's wire facts (the rest of execd is its bundle)
cp "$REPO_DIR"/operator/planning.py "$REPO_DIR"/operator/constants.py "$REPO_DIR"/operator/taskexec.py "$src/operator/"
cp "$REPO_DIR"/operator/docker/*.py "$src/operator/docker/"
cp "$REPO_DIR"/operator/core/*.py "$src/operator/core/"
cp "$REPO_DIR"/operator/claimsapi/*.py "$src/operator/claimsapi/"
cp "$REPO_DIR"/api/*.py "$src/api/"
cat >"$work/entry.py" <<'PY'
import sys

from corral.operator.docker.main import main

sys.exit(main())
PY

log "building operator image $tag (PyInstaller --onedir)"
t0=$SECONDS
(cd "$work" && "$PY" -m PyInstaller --onedir --name corral-operator --noconfirm --clean --log-level WARN --strip \
  --paths "$work/src" --distpath "$work/dist" --workpath "$work/build" --specpath "$work" \
  --collect-submodules uvicorn --collect-submodules corral --hidden-import uvloop --hidden-import httptools \
  --exclude-module tkinter --exclude-module matplotlib --exclude-module numpy --exclude-module pytest \
  --exclude-module PIL --exclude-module IPython --exclude-module pulumi --exclude-module kopf \
  --exclude-module corral.operator.docker.image \
  entry.py) >&2 || die "PyInstaller failed"

mkdir -p "$work/ctx"
mv "$work/dist/corral-operator" "$work/ctx/operator"
cp "$execd_tar" "$work/ctx/execd-bundle.tar"
cat >"$work/ctx/Dockerfile" <<DOCKERFILE
FROM corral/base:$DEBIAN_SUITE
COPY operator /opt/corral/operator
COPY execd-bundle.tar /opt/corral/execd-bundle.tar
ENV CORRAL_EXECD_BUNDLE=/opt/corral/execd-bundle.tar CORRAL_EXECD_BUNDLE_KEY=$execd_key CORRAL_STATE_DIR=/var/lib/corral
LABEL dev.corral.image-key=$key app.kubernetes.io/name=corral-operator
ENTRYPOINT ["/opt/corral/operator/corral-operator"]
DOCKERFILE
DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$work/ctx" >&2 || die "docker build failed"

# Smoke test: the binary starts and reports its usage error without a pools file.
out="$(docker run --rm --network none "$tag" 2>&1 || true)"
[[ "$out" == *"CORRAL_POOLS_FILE is required"* ]] || { echo "$out" >&2; docker rmi -f "$tag" >/dev/null; die "the operator image does not start"; }
log "operator image $tag built in $((SECONDS - t0)) s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%d MB", $1/1e6}'))"
echo "$tag"
