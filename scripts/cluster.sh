#!/usr/bin/env bash
# A local Kubernetes control plane from the binaries scripts/toolchain.sh builds: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (fake nodes; it marks pods Running/Ready and gives them IPs).
# Everything listens on 127.0.0.1; kwok hands out pod IPs from a loopback range, so nothing can leave the machine.
#
#   scripts/cluster.sh up       start it (idempotent) and print the kubeconfig path
#   scripts/cluster.sh down     stop what `up` started (by pid) and keep the data
#   scripts/cluster.sh reset    down + delete the data
#   scripts/cluster.sh status   print what runs
#   scripts/cluster.sh env      print `export KUBECONFIG=...`
# CORRAL_APISERVER_PROFILING=true serves kube-apiserver's /debug/pprof (for `kubectl get --raw
# "/debug/pprof/profile?seconds=20"` while a bench runs); off by default, as in a hardened cluster.
source "$(dirname "$0")/lib.sh"

DIR="$CORRAL_RUN/cluster"
PKI="$DIR/pki"
KUBECONFIG_FILE="$DIR/kubeconfig"
ETCD_PORT="${CORRAL_ETCD_PORT:-23790}"
API_PORT="${CORRAL_APISERVER_PORT:-16443}"
POD_CIDR="${CORRAL_POD_CIDR:-127.16.0.0/16}"       # loopback: kwok's pod IPs never route off the machine
SERVICE_CIDR="10.96.0.0/16"                        # never connected to; cluster IPs are bookkeeping only
NODES="${CORRAL_FAKE_NODES:-3}"
K8S="$(tool_dir kubernetes "$KUBE_VERSION")"
ETCD="$(tool_dir etcd "$ETCD_VERSION")/etcd"
KWOK="$(tool_dir kwok "$KWOK_VERSION")/kwok"
KUBECTL="$K8S/kubectl"

need_binaries() {
  local b
  for b in "$ETCD" "$K8S/kube-apiserver" "$K8S/kube-controller-manager" "$K8S/kube-scheduler" "$KUBECTL" "$KWOK"; do
    [[ -x "$b" ]] || die "$b is missing: build it with scripts/toolchain.sh etcd kwok kube"
  done
}

pki() {
  [[ -f "$PKI/sa.pub" ]] && return
  have openssl || die "openssl is needed (apt-get install openssl)"
  mkdir -p "$PKI" && cd "$PKI"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt -subj "/CN=corral-test-ca" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj "/CN=kube-apiserver" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,IP:10.96.0.1\n' >ext.cnf
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile ext.cnf \
    -out apiserver.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  # Static tokens: an admin (system:masters) for tests and tools. Impersonation covers other identities.
  local token; token="$(openssl rand -hex 16)"
  printf '%s,corral-admin,corral-admin,system:masters\n' "$token" >tokens.csv
  echo "$token" >admin.token
  cd - >/dev/null
}

kubeconfig() {
  cat >"$KUBECONFIG_FILE" <<KC
apiVersion: v1
kind: Config
clusters:
- name: corral-local
  cluster: {server: "https://127.0.0.1:$API_PORT", certificate-authority: "$PKI/ca.crt"}
users:
- name: corral-admin
  user: {token: "$(cat "$PKI/admin.token")"}
contexts:
- name: corral-local
  context: {cluster: corral-local, user: corral-admin}
current-context: corral-local
KC
}

running() { [[ -f "$DIR/$1.pid" ]] && kill -0 "$(cat "$DIR/$1.pid")" 2>/dev/null; }

start() {  # start NAME CMD...
  local name="$1"; shift
  running "$name" && return
  setsid nohup "$@" >"$DIR/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/$name.pid"
}

wait_for() {  # wait_for WHAT SECONDS CMD...
  local what="$1" deadline=$((SECONDS + $2)); shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$what did not come up within the time limit (logs: $DIR/*.log)"
    sleep 0.25
  done
}

# kwok needs Stage definitions: the "fast" node and pod stages that ship in its module (what kwokctl uses).
kwok_stages() {
  local src="$GOMODCACHE/sigs.k8s.io/kwok@v$KWOK_VERSION/kustomize/stage"
  [[ -d "$src" ]] || go mod download "sigs.k8s.io/kwok@v$KWOK_VERSION" >/dev/null
  local f
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [[ -f "$src/$f" ]] || die "kwok stage $f is missing in $src"
    echo "---"; cat "$src/$f"
  done >"$DIR/kwok-stages.yaml"
}

kc() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

fake_nodes() {
  local i
  for ((i = 0; i < NODES; i++)); do
    cat <<NODE
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels: {type: kwok, kubernetes.io/hostname: kwok-node-$i, kubernetes.io/os: linux, kubernetes.io/arch: amd64, topology.kubernetes.io/zone: zone-$((i % 3))}
spec:
  taints: []
status:
  allocatable: {cpu: "64", memory: 256Gi, pods: "1000"}
  capacity: {cpu: "64", memory: 256Gi, pods: "1000"}
---
NODE
  done
}

up() {
  need_binaries
  mkdir -p "$DIR/etcd"
  pki
  kubeconfig
  start etcd "$ETCD" --name corral --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
    --initial-cluster "corral=http://127.0.0.1:$((ETCD_PORT + 10))" --listen-metrics-urls "" \
    --unsafe-no-fsync --quota-backend-bytes 4294967296 --log-level warn
  start kube-apiserver "$K8S/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
    --secure-port "$API_PORT" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --token-auth-file "$PKI/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" --service-cluster-ip-range "$SERVICE_CIDR" \
    --endpoint-reconciler-type none --allow-privileged --profiling="${CORRAL_APISERVER_PROFILING:-false}" --v 1
  wait_for "kube-apiserver" 90 kc get --raw /readyz
  start kube-controller-manager "$K8S/kube-controller-manager" --kubeconfig "$KUBECONFIG_FILE" \
    --bind-address 127.0.0.1 --secure-port "$((API_PORT + 1))" --leader-elect=false \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --use-service-account-credentials=false --controllers '*,-nodeipam,-nodelifecycle,-cloud-node-lifecycle' --v 1
  start kube-scheduler "$K8S/kube-scheduler" --kubeconfig "$KUBECONFIG_FILE" --bind-address 127.0.0.1 \
    --secure-port "$((API_PORT + 2))" --leader-elect=false --v 1
  kwok_stages
  start kwok "$KWOK" --kubeconfig "$KUBECONFIG_FILE" --config "$DIR/kwok-stages.yaml" --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake --cidr "$POD_CIDR" --node-ip 127.0.0.1 \
    --node-lease-duration-seconds 40 -v WARN
  fake_nodes | kc apply -f - >/dev/null
  wait_for "fake nodes Ready" 60 kc wait --for condition=Ready node --all --timeout 2s
  # The TaintNodesByCondition admission plugin puts node.kubernetes.io/not-ready on every new node; the node
  # lifecycle controller that would lift it is off (kwok's nodes have no kubelet to evict from), so lift it here.
  local node
  for node in $(kc get nodes -o name); do kc patch "$node" --type merge -p '{"spec":{"taints":null}}' >/dev/null; done
  wait_for "default service account" 60 kc get serviceaccount default -n default
  log "cluster up: export KUBECONFIG=$KUBECONFIG_FILE"
  echo "$KUBECONFIG_FILE"
}

down() {
  local name
  for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
    if running "$name"; then
      kill "$(cat "$DIR/$name.pid")" 2>/dev/null || true
      local i; for ((i = 0; i < 40; i++)); do running "$name" || break; sleep 0.25; done
      running "$name" && kill -9 "$(cat "$DIR/$name.pid")" 2>/dev/null || true
    fi
    rm -f "$DIR/$name.pid"
  done
  log "cluster down"
}

status() {
  local name
  for name in etcd kube-apiserver kube-controller-manager kube-scheduler kwok; do
    if running "$name"; then echo "$name: running (pid $(cat "$DIR/$name.pid"))"; else echo "$name: stopped"; fi
  done
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  reset) down; rm -rf "$DIR" ;;
  status) status ;;
  env) echo "export KUBECONFIG=$KUBECONFIG_FILE" ;;
  *) die "usage: scripts/cluster.sh [up|down|reset|status|env]" ;;
esac
