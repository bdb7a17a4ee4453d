#!/usr/bin/env bash
# Static checks, run by scripts/test.sh before any test: ruff (lint), mypy (types) and import-linter (the package
# boundaries: contracts in pyproject.toml). mypy and import-linter read the package as it installs (corral.<part>),
# through a throwaway view of it (scripts/pkgview.sh): from the repository root `operator/` would be the stdlib's.
source "$(dirname "$0")/lib.sh"
cd "$REPO_DIR"
bin="$CORRAL_VENV/bin"
view="$(mktemp -d)"
trap 'rm -rf "$view"' EXIT
"$SCRIPTS_DIR/pkgview.sh" "$view"
rc=0
log "ruff"
"$bin/ruff" check --quiet . || rc=1
log "mypy"
(cd "$view" && "$bin/mypy" --config-file "$REPO_DIR/pyproject.toml" --no-incremental -p corral) || rc=1
log "import-linter"
(cd "$view" && PYTHONPATH="$view" "$bin/lint-imports" --no-cache "$REPO_DIR/pyproject.toml" \
  | sed -n '/^Contracts/,$p') || rc=1
[[ $rc -eq 0 ]] || die "static checks failed (above)"
log "static checks passed"
