#!/usr/bin/env bash
# Sets up a fresh machine for Corral: the Python venv, a Docker Engine with the base images, and the test bed's
# tools built from Go modules (Pulumi CLI + language host + kubernetes provider, kube-apiserver & co, etcd, kwok).
# Idempotent: everything is cached outside the repo ($CORRAL_CACHE, default ~/.cache/corral) keyed by version, so a
# second run is a cache hit. Cold, on 2 cores, expect ~45 minutes (mostly Go compiles); warm, well under 2 minutes.
source "$(dirname "$0")/lib.sh"
t0=$SECONDS

# 1. Python: the project in editable mode with the dev extras, in $CORRAL_VENV (default .venv).
if [[ ! -x "$CORRAL_VENV/bin/python" ]]; then
  log "creating $CORRAL_VENV"
  python3 -m venv "$CORRAL_VENV"
fi
stamp="$CORRAL_VENV/.corral-installed-$(sha256sum "$REPO_DIR/pyproject.toml" | cut -c1-12)"
if [[ ! -f "$stamp" ]]; then
  log "pip install -e '.[dev]'"
  "$CORRAL_VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$CORRAL_VENV/bin/pip" install -q -e "$REPO_DIR[dev]"
  rm -f "$CORRAL_VENV"/.corral-installed-* && touch "$stamp"
fi

# 2. Docker Engine (Debian's docker.io, started if none answers) and the debootstrap base images.
"$SCRIPTS_DIR/docker.sh" all

# 3. Go-built tools, one at a time (2 cores).
have openssl || { apt-get update -qq && apt-get install -y -qq openssl >/dev/null; }
have tmux || { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }   # docker tier: drives `corral shell`
"$SCRIPTS_DIR/toolchain.sh" all

# 4. The execd bundle (a self-contained daemon injected into sandboxes).
if [[ -x "$SCRIPTS_DIR/execd-bundle.sh" ]]; then "$SCRIPTS_DIR/execd-bundle.sh"; fi
"$SCRIPTS_DIR/operator-image.sh" >/dev/null   # the Docker-mode operator image (corral/operator:<key>)

# 5. Pulumi plugins where the CLI finds them without downloading.
eval "$("$SCRIPTS_DIR/env.sh")"
if ! pulumi plugin ls 2>/dev/null | grep -qE "^kubernetes +resource +$PULUMI_K8S_VERSION"; then
  pulumi plugin install resource kubernetes "$PULUMI_K8S_VERSION" \
    --file "$(tool_dir pulumi-resource-kubernetes "$PULUMI_K8S_VERSION")/pulumi-resource-kubernetes" >/dev/null
fi
log "setup done in $((SECONDS - t0)) s. Use the tools with: eval \"\$(scripts/env.sh)\""
