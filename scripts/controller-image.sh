#!/usr/bin/env bash
# Build the Kubernetes operator image offline: a PyInstaller --onedir bundle of `python -m corral.operator` (kopf,
# the reconcilers and the claims API) on top of corral/base, running as a non-root user, with execd's bundle at
# /opt/corral/execd - so the same image is the operator and the execd image its sandboxes' initContainer copies from.
#
#   scripts/controller-image.sh [--force]   -> prints the image tag, corral/controller:<key>
#
# The image is also tagged corral/controller:<chart appVersion>, the chart's default. The key hashes the sources,
# this script, execd's bundle key and the bundled package versions; an image with that tag is a cache hit. Nothing
# is written into the repository. Load it into a local cluster with `kind load docker-image corral/controller:<v>`
# (or `minikube image load`, or push it to your registry and set the chart's image.repository/tag).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pyinstaller_python
have docker || die "no docker CLI: run scripts/docker.sh engine"

execd_key="$("$PY" -m corral.execd.bundle --key)"
app_version="$("$PY" -c 'from corral.components.controller_values import APP_VERSION; print(APP_VERSION)')"
# The operator's modules: every package under operator/ but the Docker runtime (its own image, operator-image.sh),
# found rather than listed (a hand list left out operator/inflight once, and the image did not start).
operator_py() { (cd "$REPO_DIR" && find operator -path operator/docker -prune -o -name __pycache__ -prune -o -name '*.py' -print | sort); }
key="$(cd "$REPO_DIR" && { cat "$0" api/*.py $(operator_py) execd/*.py;
        echo "$execd_key"; "$PY" -m pip freeze 2>/dev/null | grep -iE '^(kopf|lightkube|aiohttp|msgspec|fastapi|uvicorn|pydantic|httpx)='; } \
        | sha256sum | cut -c1-16)"
tag="corral/controller:$key"
build_lock controller
if docker image inspect "$tag" >/dev/null 2>&1 && [[ "${1:-}" != "--force" ]]; then
  docker tag "$tag" "corral/controller:$app_version"
  echo "$tag"
  exit 0
fi
docker image inspect corral/base:"$DEBIAN_SUITE" >/dev/null 2>&1 || "$SCRIPTS_DIR/docker.sh" images

execd_tar="$("$SCRIPTS_DIR/execd-bundle.sh")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Stage corral.* as plain packages: PyInstaller's analysis does not follow the editable-install finder. Inside the
# staged `corral` package, operator/ may have an __init__.py (it cannot shadow the standard library there).
src="$work/src/corral"
mkdir -p "$src/api" "$src/execd"
: >"$src/__init__.py"
for f in $(operator_py); do
  mkdir -p "$src/$(dirname "$f")" && cp "$REPO_DIR/$f" "$src/$f"
done
: >"$src/operator/__init__.py"
cp "$REPO_DIR"/api/*.py "$src/api/"
cp "$REPO_DIR"/execd/*.py "$src/execd/"
# kopf imports corral.operator.handlers by name (and the handlers import parts lazily): import every staged module
# statically, so PyInstaller's analysis bundles all of them.
(cd "$work/src" && find corral -name '*.py' ! -name '__init__.py' ! -name '__main__.py' | sort | sed 's|/|.|g; s|\.py$||' \
  | awk '{print "import " $0 "  # noqa: F401"}') >"$work/entry.py"
printf '\nfrom corral.operator.__main__ import main\n\nmain()\n' >>"$work/entry.py"

log "building controller image $tag (PyInstaller --onedir)"
t0=$SECONDS
(cd "$work" && "$PY" -m PyInstaller --onedir --name corral-controller --noconfirm --clean --log-level WARN --strip \
  --paths "$work/src" --distpath "$work/dist" --workpath "$work/build" --specpath "$work" \
  --collect-submodules corral --collect-submodules kopf --collect-submodules uvicorn \
  --collect-submodules lightkube --collect-data lightkube \
  --hidden-import uvloop --hidden-import httptools \
  --exclude-module tkinter --exclude-module matplotlib --exclude-module numpy --exclude-module pytest \
  --exclude-module PIL --exclude-module IPython --exclude-module pulumi --exclude-module docker \
  --exclude-module corral.operator.docker --exclude-module PyInstaller \
  entry.py) >&2 || die "PyInstaller failed"

mkdir -p "$work/ctx"
mv "$work/dist/corral-controller" "$work/ctx/controller"
cp "$execd_tar" "$work/ctx/execd-bundle.tar"
cat >"$work/ctx/Dockerfile" <<DOCKERFILE
FROM corral/base:$DEBIAN_SUITE
COPY controller /opt/corral/controller
# ADD unpacks the tar: /opt/corral/execd/execd (+ _internal), what execd's initContainer runs (execd install <dir>).
ADD execd-bundle.tar /
LABEL dev.corral.image-key=$key app.kubernetes.io/name=corral-operator app.kubernetes.io/version=$app_version
# a named user: kopf's peering identity asks getpass.getuser(), which needs a passwd entry for the uid
RUN echo 'corral:x:65532:65532:corral operator:/nonexistent:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'corral:x:65532:' >>/etc/group
USER 65532:65532
ENTRYPOINT ["/opt/corral/controller/corral-controller"]
DOCKERFILE
DOCKER_BUILDKIT=0 docker build -q -t "$tag" "$work/ctx" >&2 || die "docker build failed"

# Smoke test: as the non-root user, without network, kopf's CLI answers and execd's installer runs.
out="$(docker run --rm --network none "$tag" --help 2>&1 || true)"
[[ "$out" == *"--standalone"* ]] || { echo "$out" >&2; docker rmi -f "$tag" >/dev/null; die "the controller image does not start"; }
out="$(docker run --rm --network none --entrypoint /opt/corral/execd/execd "$tag" --help 2>&1 || true)"
[[ -n "$out" ]] || { docker rmi -f "$tag" >/dev/null; die "execd does not start in the controller image"; }
docker tag "$tag" "corral/controller:$app_version"
log "controller image $tag built in $((SECONDS - t0)) s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%d MB", $1/1e6}'))"
echo "$tag"
