#!/usr/bin/env bash
# Builds the test bed's Go binaries from the Go module proxy with the ordinary `go` client, into
# $CORRAL_CACHE/bin/<tool>-<version>/. A tool whose binaries exist is skipped (cache hit). Never writes to the repo.
#
#   scripts/toolchain.sh [etcd|kwok|kube|helm|pulumi|yaml|k8s-provider|all]...     (default: all)
#   scripts/toolchain.sh [kube-node|kind|crictl|coredns|kube-router|kind-all]  (the cluster tier's kind node)
#
# Why wrappers: `go install m@v` refuses modules with replace directives (golang/go#44840), which pulumi, k8s and
# etcd all have. A throwaway module requires the module, repeats its non-path replaces and turns path replaces into
# requires of the published siblings. Builds run one at a time (2 cores, 2-4 GB per link).
source "$(dirname "$0")/lib.sh"
have go || die "go is not installed (Debian: apt-get install golang-go, or the machine's /usr/local/go)"
WORK="$CORRAL_CACHE/work"
mkdir -p "$WORK"

# A fresh wrapper module in $WORK/$1.
wrapper() {
  local w="$WORK/$1"
  rm -rf "$w" && mkdir -p "$w" && cd "$w"
  go mod init "local/$1" >/dev/null 2>&1
}

# Prints `go mod edit` arguments that repeat a go.mod's non-path replace lines.
nonpath_replaces() {
  go mod edit -json "$1" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    new = r["New"]
    if new.get("Version"):
        old = r["Old"]["Path"] + ("@" + r["Old"]["Version"] if r["Old"].get("Version") else "")
        print("-replace=%s=%s@%s" % (old, new["Path"], new["Version"]))'
}

gomod_of() { go mod download -json "$1" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["GoMod"] if "Error" not in d else sys.exit(d["Error"]))'; }
dir_of() { go mod download -json "$1" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["Dir"] if "Error" not in d else sys.exit(d["Error"]))'; }

build_etcd() {
  local out; out="$(tool_dir etcd "$ETCD_VERSION")"
  [[ -x "$out/etcd" ]] && { log "etcd $ETCD_VERSION: cached"; return; }
  log "building etcd $ETCD_VERSION"
  wrapper etcd
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION"
  mkdir -p "$out.tmp" && go build -trimpath -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3
  rm -rf "$out" && mv "$out.tmp" "$out"
}

build_kwok() {
  local out; out="$(tool_dir kwok "$KWOK_VERSION")"
  [[ -x "$out/kwok" ]] && { log "kwok $KWOK_VERSION: cached"; return; }
  log "building kwok $KWOK_VERSION"
  mkdir -p "$out.tmp"
  GOFLAGS=-buildvcs=false GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@v$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@v$KWOK_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

build_helm() {
  local out; out="$(tool_dir helm "$HELM_VERSION")"
  [[ -x "$out/helm" ]] && { log "helm $HELM_VERSION: cached"; return; }
  log "building helm $HELM_VERSION"
  mkdir -p "$out.tmp"
  GOFLAGS=-buildvcs=false GOBIN="$out.tmp" go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@v$HELM_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# The wrapper module for k8s.io/kubernetes in $WORK/kube: every ./staging/src/k8s.io/X replace becomes the published
# k8s.io/X v0.<minor>.<patch>.
kube_wrapper() {
  wrapper kube
  local gm
  gm="$(gomod_of "k8s.io/kubernetes@v$KUBE_VERSION")"
  go mod edit -require="k8s.io/kubernetes@v$KUBE_VERSION"
  go mod edit -json "$gm" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print("-replace=%s=%s@%s" % (r["Old"]["Path"], r["Old"]["Path"], sys.argv[1]))' "v0.${KUBE_VERSION#*.}" | xargs go mod edit
  grep -E '^godebug' "$gm" >> go.mod || true
}

kube_ldflags() {
  local ld="-s -w" kv minor="${KUBE_VERSION#*.}"; minor="${minor%%.*}"
  for kv in "gitVersion=v$KUBE_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" "buildDate=$(date -u +%Y-%m-%dT00:00:00Z)"; do
    ld+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  echo "$ld"
}

build_kube() {
  local out; out="$(tool_dir kubernetes "$KUBE_VERSION")"
  [[ -x "$out/kube-apiserver" && -x "$out/kube-controller-manager" && -x "$out/kube-scheduler" && -x "$out/kubectl" ]] \
    && { log "kubernetes $KUBE_VERSION: cached"; return; }
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $KUBE_VERSION"
  kube_wrapper
  local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
              k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  go get "${pkgs[@]/%/@v$KUBE_VERSION}"
  mkdir -p "$out.tmp"
  for p in "${pkgs[@]}"; do
    log "  go build $p"
    go build -trimpath -ldflags "$(kube_ldflags)" -o "$out.tmp/" "$p"
  done
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# kubelet, kubeadm and kube-proxy for the kind node image (scripts/kind-node.sh): the same wrapper module and
# ldflags as build_kube, so the Go build cache is shared; kept in a folder of their own because only the cluster
# tier needs them.
build_kube_node() {
  local out; out="$(tool_dir kubernetes-node "$KUBE_VERSION")"
  [[ -x "$out/kubelet" && -x "$out/kubeadm" && -x "$out/kube-proxy" ]] \
    && { log "kubelet, kubeadm, kube-proxy $KUBE_VERSION: cached"; return; }
  log "building kubelet, kubeadm, kube-proxy $KUBE_VERSION"
  kube_wrapper
  local pkgs=(k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kube-proxy)
  go get "${pkgs[@]/%/@v$KUBE_VERSION}"
  mkdir -p "$out.tmp"
  for p in "${pkgs[@]}"; do
    log "  go build $p"
    go build -trimpath -ldflags "$(kube_ldflags)" -o "$out.tmp/" "$p"
  done
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# The Pulumi CLI, Corral's Python language host (scripts/langhost: the upstream host's module is not served by the
# proxy) and the two Python helper scripts that live in the sdk module.
build_pulumi() {
  local out; out="$(tool_dir pulumi "$PULUMI_CLI_VERSION")"
  local lh_sum; lh_sum="$(cat "$SCRIPTS_DIR/langhost/"*.go | sha256sum | cut -c1-12)"
  [[ -x "$out/pulumi" && -x "$out/pulumi-language-python" && -f "$out/.langhost-$lh_sum" ]] \
    && { log "pulumi $PULUMI_CLI_VERSION: cached"; return; }
  log "building pulumi $PULUMI_CLI_VERSION and the python language host"
  wrapper pulumi
  local v="v$PULUMI_CLI_VERSION"
  go mod edit -require="github.com/pulumi/pulumi/pkg/v3@$v" -require="github.com/pulumi/pulumi/sdk/v3@$v"
  nonpath_replaces "$(gomod_of "github.com/pulumi/pulumi/pkg/v3@$v")" | xargs -r go mod edit
  nonpath_replaces "$(gomod_of "github.com/pulumi/pulumi/sdk/v3@$v")" | xargs -r go mod edit
  mkdir -p langhost && cp "$SCRIPTS_DIR/langhost/"*.go langhost/
  go get "github.com/pulumi/pulumi/pkg/v3/cmd/pulumi@$v"
  go mod tidy
  local ld="-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=$v"
  mkdir -p "$out.tmp"
  go build -trimpath -tags osusergo,grpcnotrace -ldflags "$ld" -o "$out.tmp/pulumi" github.com/pulumi/pulumi/pkg/v3/cmd/pulumi
  go build -trimpath -ldflags "$ld" -o "$out.tmp/pulumi-language-python" ./langhost
  local sdk; sdk="$(dir_of "github.com/pulumi/pulumi/sdk/v3@$v")"
  install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$out.tmp/"
  install -m 0755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$out.tmp/"
  touch "$out.tmp/.langhost-$lh_sum"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# pulumi-language-yaml, the language host of `runtime: yaml` programs: how a platform team reuses the component
# provider without Python (the engine tier runs examples/yaml with it). Its module has no replace directives, so a
# plain `go install` builds it.
build_yaml() {
  local out; out="$(tool_dir pulumi-language-yaml "$PULUMI_YAML_VERSION")"
  [[ -x "$out/pulumi-language-yaml" ]] && { log "pulumi-language-yaml $PULUMI_YAML_VERSION: cached"; return; }
  log "building pulumi-language-yaml $PULUMI_YAML_VERSION"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w -X github.com/pulumi/pulumi-yaml/pkg/version.Version=v$PULUMI_YAML_VERSION" \
    "github.com/pulumi/pulumi-yaml/cmd/pulumi-language-yaml@v$PULUMI_YAML_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# pulumi-resource-kubernetes: its main package embeds two generated files that are not in the module zip, so the
# module is copied to a writable folder, the files are generated from the committed schema, and the wrapper
# replaces the module with that folder.
build_k8s_provider() {
  local out; out="$(tool_dir pulumi-resource-kubernetes "$PULUMI_K8S_VERSION")"
  [[ -x "$out/pulumi-resource-kubernetes" ]] && { log "pulumi-resource-kubernetes $PULUMI_K8S_VERSION: cached"; return; }
  log "building pulumi-resource-kubernetes $PULUMI_K8S_VERSION"
  wrapper k8s-provider
  local mod=github.com/pulumi/pulumi-kubernetes/provider/v4 src
  src="$(dir_of "$mod@$PULUMI_K8S_PROVIDER_PSEUDO")"
  cp -r "$src" provider && chmod -R u+w provider
  python3 - "$PULUMI_K8S_VERSION" <<'PY'
import json, sys
d = "provider/cmd/pulumi-resource-kubernetes/"
schema = json.load(open(d + "schema.json"))
schema["version"] = sys.argv[1]
json.dump(schema, open(d + "schema-embed.json", "w"), separators=(",", ":"))
json.dump(json.load(open(d + "terraform-mapping.json")), open(d + "terraform-mapping-embed.json", "w"), separators=(",", ":"))
PY
  go mod edit -require="$mod@$PULUMI_K8S_PROVIDER_PSEUDO" -replace="$mod=./provider"
  nonpath_replaces provider/go.mod | xargs -r go mod edit
  # Its path replace of sdk/v4 (=> ../sdk) becomes a require of a published sdk/v4.
  go mod edit -json provider/go.mod | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if not r["New"].get("Version") and r["Old"]["Path"].endswith("/sdk/v4"):
        print("-require=%s@%s" % (r["Old"]["Path"], sys.argv[1]))' "v$PULUMI_K8S_VERSION" | xargs -r go mod edit
  go get "$mod/cmd/pulumi-resource-kubernetes"
  mkdir -p "$out.tmp"
  go build -trimpath -ldflags "-s -w -X $mod/pkg/version.Version=v$PULUMI_K8S_VERSION" \
    -o "$out.tmp/pulumi-resource-kubernetes" "$mod/cmd/pulumi-resource-kubernetes"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# kind, patched so it can start nodes where `--privileged` is refused (scripts/kind/unprivileged.go; only when
# CORRAL_KIND_UNPRIVILEGED=1, which scripts/kind.sh sets after probing the engine; otherwise it is stock kind).
build_kind() {
  local out; out="$(tool_dir kind "$KIND_VERSION")"
  local sum; sum="$(cat "$SCRIPTS_DIR/kind/unprivileged.go" | sha256sum | cut -c1-12)"
  [[ -x "$out/kind" && -f "$out/.patch-$sum" ]] && { log "kind $KIND_VERSION: cached"; return; }
  log "building kind $KIND_VERSION (with the unprivileged-node patch)"
  wrapper kind
  local mod=sigs.k8s.io/kind src
  src="$(dir_of "$mod@v$KIND_VERSION")"
  cp -r "$src" kind && chmod -R u+w kind
  local p=kind/pkg/cluster/internal/providers/docker
  cp "$SCRIPTS_DIR/kind/unprivileged.go" "$p/corral_unprivileged.go"
  grep -q 'return append(args, node.Image), nil' "$p/provision.go" || die "kind's provision.go changed: update the patch"
  sed -i 's|return append(args, node.Image), nil|return append(unprivileged(args), node.Image), nil|' "$p/provision.go"
  grep -q 'cmd = exec.CommandContext(c.ctx, "docker", args...)' "$p/node.go" || die "kind's node.go changed: update the patch"
  sed -i 's|\tvar cmd exec.Cmd$|\targs = unprivileged(args)\n\tvar cmd exec.Cmd|' "$p/node.go"
  grep -q 'args = unprivileged(args)' "$p/node.go" || die "patching kind's node.go failed"
  go mod edit -require="$mod@v$KIND_VERSION" -replace="$mod=./kind"
  cat >main.go <<'GO'
package main

import "sigs.k8s.io/kind/cmd/kind/app"

func main() { app.Main() }
GO
  go mod tidy >/dev/null 2>&1 || go mod tidy
  mkdir -p "$out.tmp"
  go build -trimpath -ldflags "-s -w" -o "$out.tmp/kind" .
  touch "$out.tmp/.patch-$sum"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# crictl: kind's `load` and kubeadm look images up with it inside the node.
build_crictl() {
  local out; out="$(tool_dir crictl "$CRICTL_VERSION")"
  [[ -x "$out/crictl" ]] && { log "crictl $CRICTL_VERSION: cached"; return; }
  log "building crictl $CRICTL_VERSION"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v$CRICTL_VERSION" \
    "sigs.k8s.io/cri-tools/cmd/crictl@v$CRICTL_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

build_coredns() {
  local out; out="$(tool_dir coredns "$COREDNS_VERSION")"
  [[ -x "$out/coredns" ]] && { log "coredns $COREDNS_VERSION: cached"; return; }
  log "building coredns $COREDNS_VERSION"
  mkdir -p "$out.tmp"
  GOBIN="$out.tmp" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@v$COREDNS_VERSION"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# kube-router in firewall-only mode enforces NetworkPolicies with iptables + ipset (kindnetd's enforcer needs the
# nftables `queue` expression, which some kernels lack, and then fails open).
build_kube_router() {
  local out; out="$(tool_dir kube-router "$KUBE_ROUTER_VERSION")"
  [[ -x "$out/kube-router" ]] && { log "kube-router $KUBE_ROUTER_VERSION: cached"; return; }
  log "building kube-router $KUBE_ROUTER_VERSION"
  wrapper kube-router
  local mod=github.com/cloudnativelabs/kube-router/v2
  go mod edit -require="$mod@v$KUBE_ROUTER_VERSION"
  nonpath_replaces "$(gomod_of "$mod@v$KUBE_ROUTER_VERSION")" | xargs -r go mod edit
  go get "$mod/cmd/kube-router@v$KUBE_ROUTER_VERSION"
  mkdir -p "$out.tmp"
  go build -trimpath -ldflags "-s -w -X $mod/pkg/version.Version=v$KUBE_ROUTER_VERSION" \
    -o "$out.tmp/kube-router" "$mod/cmd/kube-router"
  rm -rf "$out" && mv "$out.tmp" "$out"
}

# "all" expands in place: `all kind-all` builds both sets (it once dropped every target after "all").
targets=()
for t in "${@:-all}"; do
  if [[ "$t" == all ]]; then targets+=(etcd kwok kube helm pulumi yaml k8s-provider); else targets+=("$t"); fi
done
for t in "${targets[@]}"; do
  case "$t" in
    etcd) timed build_etcd ;; kwok) timed build_kwok ;; kube) timed build_kube ;; helm) timed build_helm ;;
    pulumi) timed build_pulumi ;; yaml) timed build_yaml ;; k8s-provider) timed build_k8s_provider ;; kube-node) timed build_kube_node ;;
    kind) timed build_kind ;; crictl) timed build_crictl ;; coredns) timed build_coredns ;;
    kube-router) timed build_kube_router ;;
    kind-all) timed build_kube_node; timed build_kind; timed build_crictl; timed build_coredns; timed build_kube_router ;;
    *) die "unknown target '$t' (etcd, kwok, kube, helm, pulumi, yaml, k8s-provider, all; for the kind node: kube-node, kind, crictl, coredns, kube-router, kind-all)" ;;
  esac
done
