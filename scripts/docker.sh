#!/usr/bin/env bash
# Makes a Docker Engine answer and loads Corral's base images into it.
#
#   scripts/docker.sh engine     install Debian's docker.io if needed and start dockerd when no engine answers
#   scripts/docker.sh images     corral/base:<suite> (debootstrap minbase) and corral/python:<suite> (+ python3)
#   scripts/docker.sh all        both (default)
#   scripts/docker.sh netbase    corral/netbase:<suite> (+ iptables, ipset, conntrack, nftables): the kind node's
#                                kube-proxy and kube-router images start from it
#
# No image can be pulled here, so base images are built with debootstrap + `docker import` (about a minute each)
# and kept as .tar.gz in $CORRAL_CACHE/images; a new engine gets them back with `docker load` in seconds.
source "$(dirname "$0")/lib.sh"
IMAGES="$CORRAL_CACHE/images"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

apt_install() {
  local missing=() p
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [[ ${#missing[@]} -eq 0 ]] && return
  log "apt-get install ${missing[*]}"
  [[ $(id -u) -eq 0 ]] || die "installing ${missing[*]} needs root"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

engine() {
  if docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    log "docker engine: $(docker version --format '{{.Server.Version}}') answers"; return
  fi
  apt_install docker.io iptables
  log "starting dockerd (log: $CORRAL_RUN/dockerd.log)"
  # The Debian package's own CLI may shadow a newer one on PATH; either talks to this engine.
  nohup /usr/sbin/dockerd >"$CORRAL_RUN/dockerd.log" 2>&1 &
  echo $! >"$CORRAL_RUN/dockerd.pid"
  local i
  for i in $(seq 1 60); do
    docker version >/dev/null 2>&1 && { log "dockerd is up (pid $(cat "$CORRAL_RUN/dockerd.pid"))"; return; }
    sleep 1
  done
  tail -20 "$CORRAL_RUN/dockerd.log" >&2
  die "dockerd did not answer within 60 s"
}

# build_image NAME EXTRA_PACKAGES CMD: debootstrap a minbase rootfs, slim it and import it.
build_image() {
  local name="$1" include="$2" cmd="$3" tag="corral/$1:$DEBIAN_SUITE"
  local sum; sum="$(printf '%s|%s|%s|%s' "$name" "$include" "$cmd" "$DEBIAN_SUITE" | sha256sum | cut -c1-10)"
  local tarball="$IMAGES/$name-$DEBIAN_SUITE-$sum.tar.gz"
  if docker image inspect "$tag" >/dev/null 2>&1 && [[ "$(docker image inspect -f '{{index .Config.Labels "dev.corral.image-sum"}}' "$tag")" == "$sum" ]]; then
    log "image $tag: present"; return
  fi
  if [[ -f "$tarball" ]]; then
    log "image $tag: docker load from cache"; docker load -q -i "$tarball" >/dev/null; return
  fi
  apt_install debootstrap
  local root; root="$(mktemp -d "$CORRAL_CACHE/rootfs.XXXXXX")"
  log "debootstrap $DEBIAN_SUITE ($name${include:+, +$include}) from $MIRROR"
  debootstrap --variant=minbase ${include:+--include="$include"} "$DEBIAN_SUITE" "$root" "$MIRROR" >"$CORRAL_RUN/debootstrap-$name.log" 2>&1 \
    || { tail -20 "$CORRAL_RUN/debootstrap-$name.log" >&2; die "debootstrap failed"; }
  rm -rf "$root"/usr/share/{doc,man,info,locale}/* "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*
  tar -C "$root" --numeric-owner -c . | docker import \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'ENV LANG=C.UTF-8' \
    -c "LABEL dev.corral.image-sum=$sum" -c "CMD $cmd" - "$tag" >/dev/null
  rm -rf "$root"
  mkdir -p "$IMAGES"
  docker save "$tag" | gzip -1 >"$tarball.tmp" && mv "$tarball.tmp" "$tarball"
  log "image $tag built and saved to $tarball"
}

images() {
  build_image base "" '["/bin/bash"]'
  build_image python "python3" '["python3"]'
}

# The base of the kind node's kube-proxy and kube-router images (scripts/kind-node.sh): iptables and friends.
netbase() {
  build_image netbase "iptables,ipset,conntrack,nftables,iproute2" '["/bin/bash"]'
}

case "${1:-all}" in
  engine) engine ;;
  images) images ;;
  all) engine; images ;;
  netbase) netbase ;;
  *) die "usage: scripts/docker.sh [engine|images|all|netbase]" ;;
esac
