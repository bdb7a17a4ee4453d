#!/usr/bin/env bash
# Sets up a fresh machine for Corral's main job, the local Docker stack (`pulumi up --stack local`): the Python venv,
# a Docker Engine with the base images, the Pulumi CLI and its Python language host (built from Go modules), the
# execd bundle and the Docker-mode operator image. Nothing else: the test bed's tools (Kubernetes, kind, helm, the
# Kubernetes provider) are built by scripts/testbed.sh, which the test command runs.
# Idempotent: everything is cached outside the repo ($CORRAL_CACHE, default ~/.cache/corral) keyed by version, so a
# second run is a cache hit. Cold, on 2 cores, expect ~10 minutes (5 of them the Pulumi CLI's Go build); warm, seconds.
source "$(dirname "$0")/lib.sh"
t0=$SECONDS

# 1. Python: the project in editable mode with every extra (operator, execd, components) and the dev tools, in
#    $CORRAL_VENV (default .venv).
if [[ ! -x "$CORRAL_VENV/bin/python" ]]; then
  log "creating $CORRAL_VENV"
  python3 -m venv "$CORRAL_VENV"
fi
stamp="$CORRAL_VENV/.corral-installed-$(cat "$REPO_DIR/pyproject.toml" "$REPO_DIR/setup.py" | sha256sum | cut -c1-12)"
if [[ ! -f "$stamp" ]]; then
  log "pip install -e '.[all,dev]'"
  "$CORRAL_VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$CORRAL_VENV/bin/pip" install -q -e "$REPO_DIR[all,dev]"
  rm -f "$CORRAL_VENV"/.corral-installed-* && touch "$stamp"
fi

# 2. Docker Engine (Debian's docker.io, started if none answers) and the debootstrap base images.
"$SCRIPTS_DIR/docker.sh" all

# 3. The Pulumi CLI and Corral's Python language host, from Go modules.
have openssl || { apt-get update -qq && apt-get install -y -qq openssl >/dev/null; }
"$SCRIPTS_DIR/toolchain.sh" pulumi

# 4. The execd bundle (a self-contained daemon injected into sandboxes) and the Docker-mode operator image.
"$SCRIPTS_DIR/execd-bundle.sh" >/dev/null
"$SCRIPTS_DIR/operator-image.sh" >/dev/null   # corral/operator:<key>
log "setup done in $((SECONDS - t0)) s. Use the tools with: eval \"\$(scripts/env.sh)\""
