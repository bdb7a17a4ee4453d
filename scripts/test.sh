#!/usr/bin/env bash
# Runs the static checks (scripts/checks.sh: ruff, mypy, import-linter) and every test tier after making sure the
# machine is set up and the test bed is built (scripts/testbed.sh: setup.sh, then the Kubernetes tools, kind and its
# node image). Extra arguments go to pytest, e.g. `scripts/test.sh -m kube` for one tier; a run with arguments
# skips the static checks (run scripts/checks.sh alone for those).
source "$(dirname "$0")/lib.sh"
"$SCRIPTS_DIR/testbed.sh"
cd "$REPO_DIR"
eval "$("$SCRIPTS_DIR/env.sh")"
[[ $# -gt 0 ]] || "$SCRIPTS_DIR/checks.sh"
set +e
python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
[[ $rc -eq 5 ]] && die "pytest collected no tests"
exit $rc
