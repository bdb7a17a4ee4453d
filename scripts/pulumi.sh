#!/usr/bin/env bash
# Runs the test bed's Pulumi CLI on this project, offline, selecting (and creating) the stack given by --stack.
#   scripts/pulumi.sh up --stack local --yes
#   scripts/pulumi.sh preview --stack dev --diff
source "$(dirname "$0")/lib.sh"
eval "$("$SCRIPTS_DIR/env.sh")"
have pulumi || die "pulumi is not built: run scripts/setup.sh (or scripts/toolchain.sh pulumi)"
mkdir -p "$CORRAL_CACHE/pulumi-state"
cd "$REPO_DIR"
stack=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --stack|-s) stack="${args[$((i + 1))]:-}" ;;
    --stack=*) stack="${args[$i]#--stack=}" ;;
  esac
done
if [[ -n "$stack" ]]; then
  pulumi stack select --create --non-interactive "$stack" >/dev/null
fi
exec pulumi "$@"
