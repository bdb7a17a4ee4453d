#!/usr/bin/env bash
# Builds a kind node image for Kubernetes $KUBE_VERSION offline: corral/kind-node:v$KUBE_VERSION.
#
#   scripts/kind-node.sh [--force]    -> prints the image tag
#   scripts/kind-node.sh rootfs       only the node rootfs image (no Kubernetes binaries needed yet)
#
# `kind build node-image` cannot be used without a registry (it `ctr content fetch`es etcd, CoreDNS, pause, kindnetd
# and the storage images), so this does what its buildImage() does, from parts built here:
#   - the node rootfs by debootstrap ($KIND_NODE_SUITE): Debian's systemd, containerd, runc and CNI plugins, with
#     kind's own base-image files (entrypoint, systemd units, containerd config) from the kind module;
#   - kubelet, kubeadm, kubectl and crictl (scripts/toolchain.sh kube-node kube crictl);
#   - the images kubeadm asks for, under the exact names it asks for, made by `docker build` from the Go-built
#     binaries: kube-apiserver, -controller-manager, -scheduler, -proxy, etcd, CoreDNS, and pause compiled from the
#     kubernetes module's build/pause/linux/pause.c; plus kube-router (firewall only) as the NetworkPolicy enforcer;
#     all imported into the node's containerd and pinned, so the kubelet's image GC never drops what cannot be
#     pulled again.
# The image is saved to $CORRAL_CACHE/images keyed by everything that went in; a new engine gets it back with
# `docker load` in seconds.
source "$(dirname "$0")/lib.sh"
have docker || die "no docker CLI: run scripts/docker.sh engine"
build_lock kind-node

K8S="$(tool_dir kubernetes "$KUBE_VERSION")"
K8S_NODE="$(tool_dir kubernetes-node "$KUBE_VERSION")"
ETCD_BIN="$(tool_dir etcd "$ETCD_VERSION")/etcd"
CRICTL="$(tool_dir crictl "$CRICTL_VERSION")/crictl"
COREDNS="$(tool_dir coredns "$COREDNS_VERSION")/coredns"
KUBE_ROUTER="$(tool_dir kube-router "$KUBE_ROUTER_VERSION")/kube-router"
TAG="corral/kind-node:v$KUBE_VERSION"
IMAGES="$CORRAL_CACHE/images"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# kubeadm v1.36's defaults (cmd/kubeadm/app/constants): its etcd and CoreDNS tags; containerd's sandbox_image in
# kind's config is pause:3.10. etcd is the project's own build, tagged as what it is: kind.sh points kubeadm at it.
ETCD_TAG="$ETCD_VERSION-0"
PAUSE_TAG=3.10

key() {
  { cat "$0" "$SCRIPTS_DIR"/kind/entrypoint-corral "$SCRIPTS_DIR"/kind/default-cni.yaml "$SCRIPTS_DIR"/kind/iptables-mode
    echo "$KUBE_VERSION $ETCD_VERSION $CRICTL_VERSION $COREDNS_VERSION $KUBE_ROUTER_VERSION $KIND_VERSION $KIND_NODE_SUITE"
  } | sha256sum | cut -c1-12
}
KEY="$(key)"
TARBALL="$IMAGES/kind-node-v$KUBE_VERSION-$KEY.tar.gz"

if [[ "${1:-}" != "--force" && "${1:-}" != rootfs ]]; then
  if [[ "$(docker image inspect -f '{{index .Config.Labels "dev.corral.image-key"}}' "$TAG" 2>/dev/null)" == "$KEY" ]]; then
    echo "$TAG"; exit 0
  fi
  if [[ -f "$TARBALL" ]]; then
    log "kind node image: docker load from $TARBALL"
    gunzip -c "$TARBALL" | docker load -q >/dev/null
    echo "$TAG"; exit 0
  fi
fi

KIND_SRC="$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kind@v$KIND_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
t0=$SECONDS
work="$(mktemp -d "$CORRAL_CACHE/kind-node.XXXXXX")"
node=""
cleanup() { [[ -n "$node" ]] && docker rm -f "$node" >/dev/null 2>&1; rm -rf "$work"; }
trap cleanup EXIT

# 1. The node rootfs (kind's images/base/Dockerfile, with Debian's containerd, runc and CNI plugins).
# Keyed by its own recipe (this section of the script) and the files it takes, so the rest can change without a
# new debootstrap.
rootfs_key="$({ sed -n '/^# 1\. The node rootfs/,/^# 2\. The images/p' "$0"; cat "$SCRIPTS_DIR"/kind/entrypoint-corral
               echo "$KIND_NODE_SUITE $KIND_VERSION"; } | sha256sum | cut -c1-12)"
rootfs_tag="corral/kind-rootfs:$KIND_NODE_SUITE-$rootfs_key"
if ! docker image inspect "$rootfs_tag" >/dev/null 2>&1; then
  apt_pkgs=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,ipset,iproute2,ethtool,util-linux,mount,kmod,libseccomp2
  apt_pkgs+=,pigz,fuse-overlayfs,e2fsprogs,bash,ca-certificates,curl,jq,procps,containerd,runc,containernetworking-plugins
  have debootstrap || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  root="$work/rootfs"
  log "debootstrap $KIND_NODE_SUITE (kind node rootfs) from $MIRROR"
  debootstrap --variant=minbase --include="$apt_pkgs" "$KIND_NODE_SUITE" "$root" "$MIRROR" \
    >"$CORRAL_RUN/debootstrap-kind-node.log" 2>&1 || { tail -20 "$CORRAL_RUN/debootstrap-kind-node.log" >&2; die "debootstrap failed"; }
  files="$KIND_SRC/images/base/files"
  install -m 0755 "$files"/usr/local/bin/* "$root/usr/local/bin/"
  mkdir -p "$root/kind/bin" "$root/etc/systemd/system/kubelet.service.d" "$root/etc/kubernetes/manifests" "$root/etc/cni/net.d"
  install -m 0644 "$files"/kind/README.txt "$root/kind/"
  install -m 0755 "$files"/kind/bin/* "$root/kind/bin/"
  install -m 0644 "$files"/etc/crictl.yaml "$root/etc/"
  install -m 0644 "$files"/etc/containerd/config.toml "$root/etc/containerd/"
  install -m 0644 "$files"/etc/default/kubelet "$root/etc/default/"
  install -m 0644 "$files"/etc/sysctl.d/* "$root/etc/sysctl.d/"
  find "$files/etc/systemd/system" -maxdepth 1 -type f -exec install -m 0644 {} "$root/etc/systemd/system/" \;
  install -m 0644 "$files"/etc/systemd/system/kubelet.service.d/* "$root/etc/systemd/system/kubelet.service.d/"
  install -m 0755 "$SCRIPTS_DIR/kind/entrypoint-corral" "$root/usr/local/bin/entrypoint-corral"
  # Debian's paths for what kind builds from source.
  ln -sf /usr/bin/containerd "$root/usr/local/bin/containerd"
  mkdir -p "$root/opt/cni" && ln -sfn /usr/lib/cni "$root/opt/cni/bin"
  # Pods get their sandbox's oom_score_adj clamped instead of refused where lowering it needs CAP_SYS_RESOURCE
  # (the setting kind documents for rootless nodes); an ordinary host loses nothing by it.
  sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$root/etc/containerd/config.toml"
  grep -q 'restrict_oom_score_adj = true' "$root/etc/containerd/config.toml" || die "kind's containerd config changed"
  # Only kind's own, per-network-namespace sysctls: Debian's /usr/lib/sysctl.d sets kernel-wide ones (fs.protected_*,
  # kernel.*) that systemd in the node would write into the host's kernel.
  rm -f "$root"/usr/lib/sysctl.d/* "$root"/etc/sysctl.d/99-sysctl.conf
  # The pod network: one node, so a static ptp + host-local conflist (routed per pod through the node, where
  # kube-router's iptables rules see every packet). kind's podSubnet default is 10.244.0.0/16; the first node's
  # podCIDR is 10.244.0.0/24.
  cat >"$root/etc/cni/net.d/10-corral-ptp.conflist" <<'JSON'
{"cniVersion": "0.4.0", "name": "corral-ptp", "plugins": [
  {"type": "ptp", "ipMasq": false, "mtu": 1500,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}
JSON
  (
    cd "$root"
    find lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
    rm -f lib/systemd/system/multi-user.target.wants/* etc/systemd/system/*.wants/* lib/systemd/system/local-fs.target.wants/*
    rm -f lib/systemd/system/sockets.target.wants/*udev* lib/systemd/system/sockets.target.wants/*initctl*
    rm -f lib/systemd/system/basic.target.wants/*
    echo "ReadKMsg=no" >>etc/systemd/journald.conf
    ln -sf /usr/lib/systemd/systemd sbin/init
  )
  chroot "$root" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1 \
    || die "systemctl enable in the node rootfs failed"
  chroot "$root" systemctl mask systemd-binfmt.service >/dev/null 2>&1
  # cri-base.json: `ctr oci spec` plus kind's createContainer hook, rlimits removed (kind's Dockerfile).
  chroot "$root" ctr oci spec | python3 -c '
import json, sys
spec = json.load(sys.stdin)
spec.setdefault("hooks", {})["createContainer"] = [{"path": "/kind/bin/mount-product-files.sh"}]
spec["process"].pop("rlimits", None)
json.dump(spec, open(sys.argv[1], "w"), indent=2)' "$root/etc/containerd/cri-base.json"
  rm -rf "$root"/usr/share/{doc,man,info,locale}/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*
  log "docker import $rootfs_tag"
  tar -C "$root" --numeric-owner -c . | docker import -c 'ENV container=docker' - "$rootfs_tag" >/dev/null
  rm -rf "$root"
fi
[[ "${1:-}" == rootfs ]] && { echo "$rootfs_tag"; exit 0; }

for b in "$K8S/kube-apiserver" "$K8S/kube-controller-manager" "$K8S/kube-scheduler" "$K8S/kubectl" \
         "$K8S_NODE/kubelet" "$K8S_NODE/kubeadm" "$K8S_NODE/kube-proxy" "$ETCD_BIN" "$CRICTL" "$COREDNS" "$KUBE_ROUTER"; do
  [[ -x "$b" ]] || die "$b is missing: build it with scripts/toolchain.sh kube etcd kind-all"
done
have gcc || die "gcc is needed to build pause (apt-get install gcc libc6-dev)"
K8S_SRC="$(GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"

# 2. The images kubeadm and the kube-router manifest ask for, from the Go-built binaries.
"$SCRIPTS_DIR/docker.sh" netbase >/dev/null     # corral/netbase: minbase + iptables, ipset, conntrack, nftables
img() {  # img NAME:TAG FROM BINARY PATH_IN_IMAGE [ENTRYPOINT_JSON]
  local ref="$1" from="$2" bin="$3" dest="$4" entry="${5:-}" ctx="$work/img-${1//[\/:]/_}"
  mkdir -p "$ctx"
  cp "$bin" "$ctx/bin"
  cp "$SCRIPTS_DIR/kind/iptables-mode" "$ctx/iptables-mode"
  {
    echo "FROM $from"
    echo "COPY bin $dest"
    [[ "$from" == scratch ]] || echo "COPY iptables-mode /usr/local/bin/iptables-mode"
    echo 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    [[ -n "$entry" ]] && echo "ENTRYPOINT $entry"
  } >"$ctx/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$ref" "$ctx" >/dev/null 2>&1 || die "docker build $ref failed"
  docker save "$ref" >"$work/images/${ref//[\/:]/_}.tar"
}
mkdir -p "$work/images"
gcc -Os -static -DVERSION="$PAUSE_TAG" -o "$work/pause" "$K8S_SRC/build/pause/linux/pause.c" || die "building pause failed"
netbase="corral/netbase:$DEBIAN_SUITE"
img "registry.k8s.io/kube-apiserver:v$KUBE_VERSION" scratch "$K8S/kube-apiserver" /usr/local/bin/kube-apiserver
img "registry.k8s.io/kube-controller-manager:v$KUBE_VERSION" scratch "$K8S/kube-controller-manager" /usr/local/bin/kube-controller-manager
img "registry.k8s.io/kube-scheduler:v$KUBE_VERSION" scratch "$K8S/kube-scheduler" /usr/local/bin/kube-scheduler
img "registry.k8s.io/etcd:$ETCD_TAG" scratch "$ETCD_BIN" /usr/local/bin/etcd
img "registry.k8s.io/coredns/coredns:v$COREDNS_VERSION" scratch "$COREDNS" /coredns '["/coredns"]'
img "registry.k8s.io/pause:$PAUSE_TAG" scratch "$work/pause" /pause '["/pause"]'
# kube-proxy and kube-router drive iptables: iptables-mode picks legacy or nft the way the node's entrypoint did.
img "registry.k8s.io/kube-proxy:v$KUBE_VERSION" "$netbase" "$K8S_NODE/kube-proxy" /usr/local/bin/kube-proxy.bin
img "corral/kube-router:v$KUBE_ROUTER_VERSION" "$netbase" "$KUBE_ROUTER" /usr/local/bin/kube-router \
  '["/usr/local/bin/iptables-mode", "/usr/local/bin/kube-router"]'
# kubeadm's kube-proxy manifest runs /usr/local/bin/kube-proxy by absolute path: a wrapper that selects the mode.
ctx="$work/img-kube-proxy-wrap"; mkdir -p "$ctx"
printf '#!/bin/sh\nexec /usr/local/bin/iptables-mode /usr/local/bin/kube-proxy.bin "$@"\n' >"$ctx/kube-proxy"
chmod 0755 "$ctx/kube-proxy"
printf 'FROM registry.k8s.io/kube-proxy:v%s\nCOPY kube-proxy /usr/local/bin/kube-proxy\n' "$KUBE_VERSION" >"$ctx/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q -t "registry.k8s.io/kube-proxy:v$KUBE_VERSION" "$ctx" >/dev/null 2>&1 || die "kube-proxy wrapper"
docker save "registry.k8s.io/kube-proxy:v$KUBE_VERSION" >"$work/images/registry.k8s.io_kube-proxy_v$KUBE_VERSION.tar"

# 3. Assemble: run the rootfs, import every image into its containerd (namespace k8s.io) and pin it, commit.
log "assembling $TAG"
node="corral-kind-node-build-$$"
docker run -d --name "$node" --entrypoint sleep --cap-add ALL --cap-drop SYS_RESOURCE \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined \
  --tmpfs /tmp --tmpfs /run --network none "$rootfs_tag" infinity >/dev/null
docker exec "$node" mkdir -p /kind/images /kind/manifests
for b in "$K8S_NODE/kubelet" "$K8S_NODE/kubeadm" "$K8S/kubectl" "$CRICTL"; do docker cp "$b" "$node:/usr/bin/" >/dev/null; done
for t in "$work"/images/*.tar; do docker cp "$t" "$node:/kind/images/" >/dev/null; done
docker cp "$SCRIPTS_DIR/kind/default-cni.yaml" "$node:/kind/manifests/default-cni.yaml" >/dev/null
docker exec -i "$node" bash -euo pipefail -s "$KUBE_VERSION" <<'NODE'
echo "v$1" >/kind/version
containerd >/tmp/containerd.log 2>&1 &
for i in $(seq 1 60); do ctr version >/dev/null 2>&1 && break; sleep 0.5; done
for t in /kind/images/*.tar; do
  ctr -n k8s.io images import --no-unpack --all-platforms "$t" >/dev/null
done
for ref in $(ctr -n k8s.io images ls -q); do ctr -n k8s.io images label "$ref" io.cri-containerd.pinned=pinned >/dev/null; done
ctr -n k8s.io images ls -q | sort >/kind/images.txt
kill %1; wait || true
rm -rf /kind/images /tmp/containerd.log
NODE
log "images in the node: $(docker exec "$node" grep -v '^sha256:' /kind/images.txt | tr '\n' ' ')"
docker stop -t 5 "$node" >/dev/null
docker commit "$node" "$TAG-assembled" >/dev/null
docker rm -f "$node" >/dev/null; node=""
# STOPSIGNAL cannot be set by `docker commit --change` on every engine: one more (metadata-only) build step.
mkdir -p "$work/final"
cat >"$work/final/Dockerfile" <<DOCKERFILE
FROM $TAG-assembled
ENV container=docker
STOPSIGNAL SIGRTMIN+3
LABEL dev.corral.image-key=$KEY
ENTRYPOINT ["/usr/local/bin/entrypoint-corral", "/sbin/init"]
CMD []
DOCKERFILE
DOCKER_BUILDKIT=0 docker build -q -t "$TAG" "$work/final" >/dev/null 2>&1 || die "tagging the node image failed"
docker rmi "$TAG-assembled" >/dev/null
mkdir -p "$IMAGES"
rm -f "$IMAGES"/kind-node-v"$KUBE_VERSION"-*.tar.gz
docker save "$TAG" | gzip -1 >"$TARBALL.tmp" && mv "$TARBALL.tmp" "$TARBALL"
log "kind node image $TAG built in $((SECONDS - t0)) s ($(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%d MB", $1/1e6}')), saved to $TARBALL"
echo "$TAG"
