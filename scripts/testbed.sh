#!/usr/bin/env bash
# Everything the test tiers need beyond scripts/setup.sh, built once and cached like the rest ($CORRAL_CACHE):
#   - the kube and engine tiers: kube-apiserver & co, etcd, kwok, helm, the Pulumi Kubernetes provider (plugin
#     installed where the CLI finds it without downloading), pulumi-language-yaml (a YAML program on the components);
#   - the cluster tier: kubelet, kubeadm, kube-proxy, kind, crictl, CoreDNS, kube-router and the offline kind
#     node image (scripts/kind-node.sh), the Kubernetes controller image (scripts/controller-image.sh).
# scripts/test.sh runs it. Cold, on 2 cores, about 35 minutes (28 of them Go builds); warm, seconds (a saved node
# image is restored with `docker load` in seconds).
source "$(dirname "$0")/lib.sh"
t0=$SECONDS
"$SCRIPTS_DIR/setup.sh"
have tmux || { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }   # docker tier: drives `corral shell`
have gcc || { apt-get update -qq && apt-get install -y -qq gcc libc6-dev >/dev/null; }   # kind node: pause
"$SCRIPTS_DIR/toolchain.sh" all kind-all
"$SCRIPTS_DIR/kind-node.sh" >/dev/null
"$SCRIPTS_DIR/controller-image.sh" >/dev/null

eval "$("$SCRIPTS_DIR/env.sh")"
if ! pulumi plugin ls 2>/dev/null | grep -qE "^kubernetes +resource +$PULUMI_K8S_VERSION"; then
  pulumi plugin install resource kubernetes "$PULUMI_K8S_VERSION" \
    --file "$(tool_dir pulumi-resource-kubernetes "$PULUMI_K8S_VERSION")/pulumi-resource-kubernetes" >/dev/null
fi
log "test bed ready in $((SECONDS - t0)) s"
