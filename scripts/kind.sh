#!/usr/bin/env bash
# A real single-node Kubernetes cluster (kind): a kubelet, containerd and real pods in one Docker container.
#
#   scripts/kind.sh up [NAME]            create it if missing (idempotent) and print its kubeconfig path
#   scripts/kind.sh down [NAME]          delete it (its node container and kubeconfig)
#   scripts/kind.sh load IMAGE...        copy local Docker images into the node (kind load docker-image)
#   scripts/kind.sh kubeconfig [NAME]    print the kubeconfig path
#
# NAME defaults to $CORRAL_KIND_NAME or "corral" (`load` takes it only from there); the tests use a cluster of
# their own ("corral-test").
# The API server listens on 127.0.0.1 (a random port, in the kubeconfig); reach pods through port-forwards.
#
# What it uses, each overridable for a machine that has its own:
#   CORRAL_KIND             the kind binary       default: kind $KIND_VERSION built from its Go module (toolchain.sh kind)
#   CORRAL_KIND_NODE_IMAGE  the node image        default: corral/kind-node:v$KUBE_VERSION built offline (kind-node.sh);
#                                                 with internet, e.g. kindest/node:v1.36.3 works the same
# Where the engine refuses --privileged (no CAP_SYS_RESOURCE), nodes start with the same powers spelled out
# instead (scripts/kind/unprivileged.go, CORRAL_KIND_UNPRIVILEGED=1); on a cgroup v1 host the kubelet is told
# failCgroupV1: false. Neither applies on an ordinary machine.
source "$(dirname "$0")/lib.sh"
have docker || die "no docker CLI: run scripts/docker.sh engine"

cmd="${1:-}"; shift || true
NAME="${CORRAL_KIND_NAME:-corral}"
DIR="$CORRAL_RUN/kind"
mkdir -p "$DIR"

kind_bin() {
  if [[ -n "${CORRAL_KIND:-}" ]]; then echo "$CORRAL_KIND"; return; fi
  local k; k="$(tool_dir kind "$KIND_VERSION")/kind"
  [[ -x "$k" ]] || "$SCRIPTS_DIR/toolchain.sh" kind >&2
  echo "$k"
}

# The engine refuses --privileged on hosts whose processes lack capabilities it would grant (a second's probe).
privileged_ok() {
  local img="corral/base:$DEBIAN_SUITE"
  docker image inspect "$img" >/dev/null 2>&1 || "$SCRIPTS_DIR/docker.sh" images >&2
  docker run --rm --privileged --network none --entrypoint /bin/true "$img" >/dev/null 2>&1
}

kubeconfig_path() { echo "$DIR/$NAME.kubeconfig"; }

exists() { "$(kind_bin)" get clusters 2>/dev/null | grep -qx "$NAME"; }

up() {
  local kind image kubeconfig config
  kind="$(kind_bin)"
  kubeconfig="$(kubeconfig_path)"
  privileged_ok || export CORRAL_KIND_UNPRIVILEGED=1
  if exists; then
    "$kind" export kubeconfig --name "$NAME" --kubeconfig "$kubeconfig" >/dev/null 2>&1
    wait_ready "$kubeconfig"
    echo "$kubeconfig"; return
  fi
  image="${CORRAL_KIND_NODE_IMAGE:-$("$SCRIPTS_DIR/kind-node.sh")}"
  config="$DIR/$NAME.yaml"
  {
    echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    echo "nodes:"
    echo "- role: control-plane"
    echo "  image: $image"
    echo "kubeadmConfigPatches:"
    if [[ "$image" == corral/kind-node:* ]]; then
      # The node image carries the project's etcd build under its own version (kubeadm would ask for 3.6.8-0).
      printf -- '- |\n  kind: ClusterConfiguration\n  etcd:\n    local:\n      imageTag: %s-0\n' "$ETCD_VERSION"
    fi
    # Kubernetes >= 1.35 refuses cgroup v1 unless told; kind sets no such option.
    if [[ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]]; then
      printf -- '- |\n  kind: KubeletConfiguration\n  failCgroupV1: false\n'
    fi
  } >"$config"
  # kind makes its Docker network dual-stack, and Docker turns on the host's net.ipv6.conf.*.forwarding for an IPv6
  # network: made here IPv4-only (with kind's options) when there is none, kind uses it and the host's IPv6
  # settings stay as they were. The cluster is IPv4.
  if ! docker network inspect kind >/dev/null 2>&1; then
    docker network create -d bridge -o com.docker.network.bridge.enable_ip_masquerade=true \
      -o com.docker.network.driver.mtu=1500 kind >/dev/null
  fi
  log "kind create cluster --name $NAME --image $image${CORRAL_KIND_UNPRIVILEGED:+ (unprivileged nodes)}"
  local t0=$SECONDS
  "$kind" create cluster --name "$NAME" --config "$config" --kubeconfig "$kubeconfig" --wait 0s >&2 \
    || die "kind create cluster failed (node logs: $kind export logs --name $NAME)"
  wait_ready "$kubeconfig"
  log "cluster $NAME ready in $((SECONDS - t0)) s"
  echo "$kubeconfig"
}

# The node Ready, and the cluster's own pods (DNS, kube-proxy, the NetworkPolicy enforcer) running.
wait_ready() {
  local k8s; k8s="$(tool_dir kubernetes "$KUBE_VERSION")/kubectl"
  have kubectl && k8s=kubectl
  [[ -x "$(command -v "$k8s")" ]] || die "kubectl is missing: scripts/toolchain.sh kube"
  "$k8s" --kubeconfig "$1" wait --for=condition=Ready node --all --timeout=300s >/dev/null \
    || die "the kind node did not become Ready"
  "$k8s" --kubeconfig "$1" -n kube-system rollout status daemonset --timeout=300s >/dev/null \
    || die "kube-system daemonsets did not roll out"
  "$k8s" --kubeconfig "$1" -n kube-system rollout status deployment --timeout=300s >/dev/null \
    || die "kube-system deployments did not roll out"
}

case "$cmd" in
  up) NAME="${1:-$NAME}"; up ;;
  down)
    NAME="${1:-$NAME}"
    privileged_ok || export CORRAL_KIND_UNPRIVILEGED=1
    if exists; then "$(kind_bin)" delete cluster --name "$NAME" >&2; fi
    rm -f "$(kubeconfig_path)" ;;
  load)
    [[ $# -ge 1 ]] || die "usage: scripts/kind.sh load IMAGE..."
    privileged_ok || export CORRAL_KIND_UNPRIVILEGED=1
    "$(kind_bin)" load docker-image "$@" --name "$NAME" >&2 ;;
  kubeconfig) NAME="${1:-$NAME}"; kubeconfig_path ;;
  *) die "usage: scripts/kind.sh up|down|kubeconfig [NAME], scripts/kind.sh load IMAGE..." ;;
esac
