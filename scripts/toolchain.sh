#!/usr/bin/env bash
# Builds the test bed's Go binaries from the Go module proxy with the ordinary `go` client, into
# $CORRAL_CACHE/bin/<tool>-<version>/. A tool whose binaries exist is skipped (cache hit). Never writes to the repo.
#
#   scripts/toolchain.sh [etcd|kwok|kube|helm|pulumi|k8s-provider|all]...     (default: all)
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

build_kube() {
  local out; out="$(tool_dir kubernetes "$KUBE_VERSION")"
  [[ -x "$out/kube-apiserver" && -x "$out/kube-controller-manager" && -x "$out/kube-scheduler" && -x "$out/kubectl" ]] \
    && { log "kubernetes $KUBE_VERSION: cached"; return; }
  log "building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl $KUBE_VERSION"
  wrapper kube
  local gm minor="${KUBE_VERSION#*.}"; minor="${minor%%.*}"
  gm="$(gomod_of "k8s.io/kubernetes@v$KUBE_VERSION")"
  go mod edit -require="k8s.io/kubernetes@v$KUBE_VERSION"
  # Every ./staging/src/k8s.io/X replace becomes the published k8s.io/X v0.<minor>.<patch>.
  go mod edit -json "$gm" | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["New"]["Path"].startswith("./staging/"):
        print("-replace=%s=%s@%s" % (r["Old"]["Path"], r["Old"]["Path"], sys.argv[1]))' "v0.${KUBE_VERSION#*.}" | xargs go mod edit
  grep -E '^godebug' "$gm" >> go.mod || true
  local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
              k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl)
  go get "${pkgs[@]/%/@v$KUBE_VERSION}"
  local ld="-s -w" k v now; now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  for kv in "gitVersion=v$KUBE_VERSION" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" "buildDate=$now"; do
    ld+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
  done
  mkdir -p "$out.tmp"
  for p in "${pkgs[@]}"; do
    log "  go build $p"
    go build -trimpath -ldflags "$ld" -o "$out.tmp/" "$p"
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

targets=("$@"); [[ ${#targets[@]} -eq 0 || "${targets[0]}" == all ]] && targets=(etcd kwok kube helm pulumi k8s-provider)
for t in "${targets[@]}"; do
  case "$t" in
    etcd) timed build_etcd ;; kwok) timed build_kwok ;; kube) timed build_kube ;; helm) timed build_helm ;;
    pulumi) timed build_pulumi ;; k8s-provider) timed build_k8s_provider ;;
    *) die "unknown target '$t' (etcd, kwok, kube, helm, pulumi, k8s-provider, all)" ;;
  esac
done
