#!/usr/bin/env bash
# Prints the environment that puts the test bed's tools first on PATH and runs Pulumi offline:
#   eval "$(scripts/env.sh)"
source "$(dirname "$0")/lib.sh"
PATHS="$(tool_dir pulumi "$PULUMI_CLI_VERSION"):$(tool_dir pulumi-language-yaml "$PULUMI_YAML_VERSION"):$(tool_dir pulumi-resource-kubernetes "$PULUMI_K8S_VERSION"):$(tool_dir kubernetes "$KUBE_VERSION"):$(tool_dir etcd "$ETCD_VERSION"):$(tool_dir kwok "$KWOK_VERSION"):$(tool_dir helm "$HELM_VERSION"):$(tool_dir kind "$KIND_VERSION")"
cat <<ENV
export PATH="$CORRAL_VENV/bin:$PATHS:\$PATH"
export CORRAL_CACHE="$CORRAL_CACHE"
export PULUMI_SKIP_UPDATE_CHECK=true
export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
export PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK=true
export PULUMI_BACKEND_URL="\${PULUMI_BACKEND_URL:-file://$CORRAL_CACHE/pulumi-state}"
export PULUMI_CONFIG_PASSPHRASE="\${PULUMI_CONFIG_PASSPHRASE-corral-local}"
ENV
