"""Every Docker Engine call of the Docker runtime (docker SDK only, no CLI), as small blocking functions.

Sandbox containers are hardened by default: all capabilities dropped, no-new-privileges, pids/memory/CPU limits,
`--init`, a non-root user (numeric, so any image allows it), execd's port published on 127.0.0.1 only (not at all
on an internal network), each template's network refusing container-to-container traffic (ICC off), the
writable layer bounded where the storage driver allows it (disk_quota_supported: not on overlay2 over ext4).
execd comes from a read-only volume filled once per bundle version with put_archive (the OpenSandbox way,
done once instead of 46 MB per sandbox) and starts before the template's entrypoint. Its token is
never in the container's config or any environment: it is put into the stopped container as a file (TOKEN_FILE),
which execd deletes once read (corral.execd.server.take_token).
"""

from __future__ import annotations

import io
import logging
import tarfile
import threading
import time
from functools import lru_cache
from typing import Any

import docker
from corral.execd.wire import ENV_PREFIX
from corral.operator.constants import L_HASH, L_MANAGED_BY, L_POOL, L_POOL_KIND, L_SANDBOX, L_TEMPLATE, MANAGED_BY
from docker.errors import APIError, ImageNotFound, NotFound

from .desired import DEFAULT_DISK, DockerTemplate

log = logging.getLogger("corral.operator.docker")

L_STACK = "corral.dev/stack"          # every Docker object of a stack
L_ROLE = "corral.dev/role"            # sandbox | operator | execd | state | network | snapshot
L_BUNDLE = "corral.dev/execd-bundle"  # the bundle key an execd volume holds
EXECD_DIR = "/opt/corral/execd"
EXECD_BIN = f"{EXECD_DIR}/execd"
SNAPSHOT_REPO = "corral-snapshot"
_WRAPPER = f'{EXECD_BIN} & exec "$@"'  # execd supervises itself (a forked server); PID 1 stays the template's
TOKEN_DIR = "/.corral-execd"
TOKEN_FILE = f"{TOKEN_DIR}/token"


def connect(host: str | None = None, *, pool: int = 64, timeout: int = 120) -> docker.DockerClient:
    if host:
        return docker.DockerClient(base_url=host, max_pool_size=pool, timeout=timeout)
    return docker.from_env(max_pool_size=pool, timeout=timeout)


def stack_labels(stack: str, role: str, **extra: str) -> dict[str, str]:
    return {L_MANAGED_BY: MANAGED_BY, L_STACK: stack, L_ROLE: role, **extra}


# Sandboxes of one template share a bridge network but must not reach each other: with inter-container
# communication off, Docker drops bridge-to-same-bridge forwarding (iptables `-i br -o br -j DROP`), so a sandbox
# can connect to no port of another sandbox. The host side of the bridge is not forwarding, so the operator (a host
# process, or a container with network_mode host) still reaches every sandbox's execd by its bridge IP. Different
# template networks are kept apart by Docker's own isolation chains.
ICC_OPTION = "com.docker.network.bridge.enable_icc"
NETWORK_OPTIONS = {ICC_OPTION: "false"}


def network_isolated(attrs: dict[str, Any]) -> bool:
    """Whether a network (its inspect attrs) refuses container-to-container traffic."""
    return (attrs.get("Options") or {}).get(ICC_OPTION) == "false"


def ensure_network(client: docker.DockerClient, name: str, *, internal: bool, stack: str) -> str:
    """The template's sandbox network (bridge, ICC off); returns its id.

    A network of that name made by an older Corral (ICC on) is recreated when no container is attached. With
    sandboxes still on it, it is kept (they would lose their network) and an error is logged: those sandboxes can
    reach each other until they are gone and the operator restarts or reloads."""
    try:
        net = client.networks.get(name)
    except NotFound:
        net = None
    if net is not None and not network_isolated(net.attrs):
        if net.attrs.get("Containers"):
            log.error("network %s lets its sandboxes reach each other (made before isolation, ICC on) and has "
                      "containers attached; it is recreated once they are gone", name)
            return net.id
        try:
            net.remove()
        except NotFound:
            pass
        net = None
    if net is None:
        try:
            net = client.networks.create(name, driver="bridge", internal=internal, options=NETWORK_OPTIONS,
                                         labels=stack_labels(stack, "network"))
        except APIError as exc:
            if exc.status_code != 409:
                raise
            net = client.networks.get(name)
    return net.id


# --- a disk bound per sandbox ----------------------------------------------------------------------------------------
# `storage_opt={"size": ...}` bounds a container's writable layer, but only on some storage drivers: overlay2 over
# xfs mounted with pquota, devicemapper, btrfs, zfs. On overlay2 over ext4 (Debian's default, and this project's
# test bed) Docker refuses the option, so there is NO per-sandbox disk bound there: a sandbox can fill the disk that
# holds /var/lib/docker. Support is detected once per engine (the driver from `docker info`, then one created,
# never started, container with the option) and the bound applied whenever it is supported.
_disk_lock = threading.Lock()
_disk_support: dict[str, bool] = {}


def disk_quota_supported(client: docker.DockerClient, image: str) -> bool:
    """Whether this engine honours storage_opt size (cached per engine ID)."""
    info = client.info()
    key = info.get("ID") or str(client.api.base_url)
    with _disk_lock:
        if key in _disk_support:
            return _disk_support[key]
        driver = info.get("Driver", "")
        backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "")
        if driver == "overlay2" and backing != "xfs" or driver in ("vfs", "aufs", "fuse-overlayfs"):
            ok = False
        else:
            try:
                probe = client.containers.create(image, ["true"], storage_opt={"size": "1G"}, network_mode="none",
                                                 labels={L_MANAGED_BY: MANAGED_BY, L_ROLE: "disk-probe"})
                probe.remove(force=True)
                ok = True
            except APIError:
                ok = False
        log.log(logging.INFO if ok else logging.WARNING, "per-sandbox disk bound %s on this engine (%s over %s)",
                "applied" if ok else "NOT available", driver, backing or "-")
        _disk_support[key] = ok
        return ok


_volume_lock = threading.Lock()
_COMPLETE = ".corral-complete"


def _marker_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"{EXECD_DIR.strip('/')}/{_COMPLETE}")
        info.size = 0
        tar.addfile(info, io.BytesIO(b""))
    return buf.getvalue()


def ensure_execd_volume(client: docker.DockerClient, *, stack: str, key: str, tar_path: str, helper_image: str) -> str:
    """A volume holding execd's bundle, filled once per bundle key; mounted read-only by sandboxes at EXECD_DIR.

    Filled through a created (never started) helper container: put_archive lands on the volume (a real mount, not
    a tmpfs, so nothing is silently lost). A marker file written last tells a complete volume from a half-filled
    one (the operator may die mid-copy)."""
    name = f"corral-{stack}-execd-{key}"
    with _volume_lock:
        try:
            client.volumes.get(name)
            exists = True
        except NotFound:
            client.volumes.create(name, labels=stack_labels(stack, "execd", **{L_BUNDLE: key}))
            exists = False
        helper = client.containers.create(helper_image, ["true"], volumes={name: {"bind": EXECD_DIR, "mode": "rw"}},
                                          labels=stack_labels(stack, "execd-helper"), network_mode="none")
        try:
            if exists:
                try:
                    helper.get_archive(f"{EXECD_DIR}/{_COMPLETE}")
                    return name
                except NotFound:
                    pass
            with open(tar_path, "rb") as data:
                if not helper.put_archive("/", data):
                    raise RuntimeError(f"put_archive of {tar_path} into volume {name} failed")
            helper.put_archive("/", _marker_tar())
        finally:
            helper.remove(force=True)
        return name


@lru_cache(maxsize=64)
def _image_command(client_id: int, image: str, client: Any) -> tuple[str, ...]:
    cfg = client.images.get(image).attrs.get("Config") or {}
    return tuple((cfg.get("Entrypoint") or []) + (cfg.get("Cmd") or []))


def sandbox_command(client: docker.DockerClient, tmpl: DockerTemplate, image: str) -> list[str]:
    """The entrypoint of the sandbox: the template's command/args, else the image's, else `sleep infinity`."""
    if tmpl.command:
        cmd = [*tmpl.command, *(tmpl.args or [])]
    else:
        cmd = list(_image_command(id(client), image, client))
        if tmpl.args:
            cmd = [*cmd[:1], *tmpl.args] if cmd else list(tmpl.args)
    return cmd or ["sleep", "infinity"]


def _token_tar(token: str, user: str) -> bytes:
    """TOKEN_FILE for execd, owned by the sandbox's user (execd runs as it and deletes the file; its directory is
    the user's, 0700). A named user's uid is unknown here: then root owns it, in a directory anyone may write."""
    uid, _, gid = user.partition(":")
    numeric = uid.isdigit()
    owner = (int(uid), int(gid) if gid.isdigit() else int(uid)) if numeric else (0, 0)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo(TOKEN_DIR.strip("/"))
        d.type, d.mode = tarfile.DIRTYPE, 0o700 if numeric else 0o777
        d.uid, d.gid = owner
        tar.addfile(d)
        data = token.encode()
        f = tarfile.TarInfo(TOKEN_FILE.strip("/"))
        f.size, f.mode = len(data), 0o400 if numeric else 0o444
        f.uid, f.gid = owner
        tar.addfile(f, io.BytesIO(data))
    return buf.getvalue()


def _workspace_tar(path: str, user: str) -> bytes | None:
    uid, _, gid = user.partition(":")
    if not uid.isdigit() or int(uid) == 0:
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(path.strip("/"))
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        info.uid, info.gid = int(uid), int(gid or uid)
        tar.addfile(info)
    return buf.getvalue()


# --- execd's liveness, probed by the engine ---------------------------------------------------------------------------
# Every sandbox container carries a HEALTHCHECK: dockerd runs the probe in it every HEALTH_INTERVAL seconds and, when
# its outcome changes, says so on the event stream the runtime already follows (`health_status: unhealthy`), so an
# idle sandbox whose execd is gone for good (supervisor and server killed) is noticed with no polling by the
# operator. The probe asks only whether something listens on execd's port, reading /proc/net/tcp{,6} with shell
# builtins (the image needs /bin/sh, which the entrypoint wrapper needs anyway; no curl, grep or Python). A server
# restarted by execd's supervisor is back within its backoff (at most 5 s), so HEALTH_RETRIES failures in a row,
# an interval apart, mean gone. Paused containers are not probed. Cost, measured on the test bed (2 cores, Docker
# 20.10): one probe is a `docker exec` of ~50 ms CPU in dockerd, containerd, the shim and runc, i.e. ~5 ms per second
# per sandbox at 10 s (~0.5 % of a core; 100 sandboxes ~half a core).
HEALTH_INTERVAL = 10.0
HEALTH_RETRIES = 2
HEALTH_TIMEOUT = 5.0
_LISTENING = ('for f in /proc/net/tcp /proc/net/tcp6; do while read -r _ l _ s _; do case "$l$s" in *:{port}0A) '
              'exit 0;; esac; done < $f; done 2>/dev/null; exit 1')  # 0A: TCP_LISTEN


def healthcheck(port: int, interval: float = HEALTH_INTERVAL) -> dict[str, Any]:
    """The HEALTHCHECK of a sandbox whose execd listens on `port`; none at all for an interval of 0 (not even the
    image's own, which would speak for something else than execd)."""
    if interval <= 0:
        return {"test": ["NONE"]}
    ns = lambda seconds: int(seconds * 1e9)  # noqa: E731
    return {"test": ["CMD", "/bin/sh", "-c", _LISTENING.format(port=f"{port:04X}")], "interval": ns(interval),
            "timeout": ns(min(interval, HEALTH_TIMEOUT)), "retries": HEALTH_RETRIES, "start_period": 0}


def health_of(attrs: dict[str, Any]) -> str | None:
    """A container's health (starting, healthy, unhealthy) from its inspect attrs; None without a HEALTHCHECK."""
    return ((attrs.get("State") or {}).get("Health") or {}).get("Status")


def create_sandbox(client: docker.DockerClient, *, stack: str, name: str, tmpl: DockerTemplate, image: str,
                   token: str, execd_volume: str, pool: str | None, pool_kind: str | None,
                   health_interval: float = HEALTH_INTERVAL) -> dict[str, Any]:
    """Create and start one hardened sandbox container; returns {id, ip, host_port}."""
    labels = {
        **tmpl.labels,
        **stack_labels(stack, "sandbox"),
        L_SANDBOX: name, L_TEMPLATE: tmpl.name, L_HASH: tmpl.blueprint_hash(),
        **({L_POOL: pool, L_POOL_KIND: pool_kind or "WarmPool"} if pool else {}),
    }
    port = f"{tmpl.execd_port}/tcp"
    env = {**tmpl.env, ENV_PREFIX + "TOKEN_FILE": TOKEN_FILE, ENV_PREFIX + "PORT": str(tmpl.execd_port),
           ENV_PREFIX + "WORKSPACE": tmpl.workdir}
    kwargs: dict[str, Any] = dict(
        name=name, labels=labels, environment=env, user=tmpl.user, working_dir=tmpl.workdir,
        entrypoint=["/bin/sh", "-c", _WRAPPER, "corral-execd"], command=sandbox_command(client, tmpl, image),
        cap_drop=["ALL"], security_opt=["no-new-privileges"], init=True,
        pids_limit=tmpl.pids_limit, mem_limit=tmpl.memory_bytes, memswap_limit=tmpl.memory_bytes,
        nano_cpus=tmpl.nano_cpus, network=tmpl.network, detach=True,
        volumes={execd_volume: {"bind": EXECD_DIR, "mode": "ro"}},
        log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "1"}},
        healthcheck=healthcheck(tmpl.execd_port, health_interval),
    )
    if tmpl.cpu_shares:
        kwargs["cpu_shares"] = tmpl.cpu_shares
    if not tmpl.internal:
        kwargs["ports"] = {port: ("127.0.0.1", None)}
    if disk_quota_supported(client, image):
        kwargs["storage_opt"] = {"size": str(tmpl.disk_bytes or DEFAULT_DISK)}
    container = client.containers.create(image, **kwargs)
    try:
        ws = _workspace_tar(tmpl.workdir, tmpl.user)
        if ws is not None:
            container.put_archive("/", ws)
        container.put_archive("/", _token_tar(token, tmpl.user))
        container.start()
        container.reload()
    except BaseException:
        remove(client, container.id)
        raise
    return {"id": container.id, **address(container.attrs, tmpl.network, port)}


def address(attrs: dict[str, Any], network: str, port: str) -> dict[str, Any]:
    ns = attrs.get("NetworkSettings") or {}
    ip = ((ns.get("Networks") or {}).get(network) or {}).get("IPAddress") or None
    bound = (ns.get("Ports") or {}).get(port) or []
    host_port = next((int(b["HostPort"]) for b in bound if b.get("HostIp") == "127.0.0.1"), None)
    return {"ip": ip, "host_port": host_port}


def remove(client: docker.DockerClient, ref: str) -> None:
    try:
        client.api.remove_container(ref, force=True, v=True)
    except NotFound:
        pass
    except APIError as exc:
        if exc.status_code not in (404, 409) or "already in progress" not in str(exc):
            if exc.status_code != 404:
                raise


def restart(client: docker.DockerClient, ref: str, *, token: str, user: str) -> dict[str, Any]:
    """Stop, give execd its next token (only now: the previous claim's processes are gone), start again."""
    c = client.containers.get(ref)
    c.stop(timeout=2)
    c.put_archive("/", _token_tar(token, user))
    c.start()
    c.reload()
    return c.attrs


def pause(client: docker.DockerClient, ref: str) -> None:
    client.api.pause(ref)


def unpause(client: docker.DockerClient, ref: str) -> None:
    client.api.unpause(ref)


def commit(client: docker.DockerClient, ref: str, *, stack: str, tag: str, env: dict[str, str],
           labels: dict[str, str]) -> dict[str, str]:
    """Snapshot: commit the container's filesystem (not its volumes, so not execd) to a local image. The token
    is kept out of the image's config."""
    repo = f"{SNAPSHOT_REPO}/{stack}"
    # Docker merges the given Env with the container's by key, so the token is overwritten rather than left out.
    clean = {**env, ENV_PREFIX + "TOKEN": ""}
    conf = {"Env": [f"{k}={v}" for k, v in clean.items()], "Labels": {**labels, **stack_labels(stack, "snapshot")}}
    image = client.containers.get(ref).commit(repository=repo, tag=tag, conf=conf, pause=True)
    return snapshot_info(client.images.get(image.id), f"{repo}:{tag}")


L_SNAPSHOT_OF = "corral.dev/snapshot-of"  # on a snapshot image: the claim it was taken from


def snapshot_info(image: Any, ref: str) -> dict[str, Any]:
    """What the claims API says of a snapshot image: its reference, ID, source claim, creation time and size."""
    attrs = image.attrs
    return {"image": ref, "id": image.id, "claim": (attrs.get("Config") or {}).get("Labels", {}).get(L_SNAPSHOT_OF),
            "created": attrs.get("Created"), "size": attrs.get("Size")}


def list_snapshots(client: docker.DockerClient, stack: str) -> list[dict[str, Any]]:
    """Every snapshot image of the stack, one entry per tag (an untagged one, by its ID), oldest first."""
    out = []
    for img in client.images.list(filters={"label": [f"{L_STACK}={stack}", f"{L_ROLE}=snapshot"]}):
        for ref in img.tags or [img.id]:
            out.append(snapshot_info(img, ref))
    return sorted(out, key=lambda s: (s["created"] or "", s["image"]))


def snapshot_image(client: docker.DockerClient, stack: str, ref: str) -> Any | None:
    """The stack's snapshot image `ref` names (a reference or an image ID), or None: no such image, or an image that
    is not one of this stack's snapshots (a template's image, say), which the snapshot routes never touch."""
    try:
        image = client.images.get(ref)
    except (ImageNotFound, NotFound):
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(L_STACK) != stack or labels.get(L_ROLE) != "snapshot":
        return None
    return image


def remove_snapshot(client: docker.DockerClient, stack: str, ref: str) -> str:
    """Remove a snapshot: the tag `ref` (the image goes with its last tag), or the image `ref` is the ID of (every
    tag). Returns "removed", "missing" (not one of this stack's snapshots) or "in-use: <containers>" (a container,
    say a sandbox started from it, still uses it: nothing is removed)."""
    image = snapshot_image(client, stack, ref)
    if image is None:
        return "missing"
    users = client.containers.list(all=True, filters={"ancestor": image.id})
    if users:
        return "in-use: " + ", ".join(sorted(c.name for c in users))
    by_id = image.id.removeprefix("sha256:").startswith(ref.removeprefix("sha256:"))
    try:  # by ID: every tag goes (force: Docker refuses an image with several tags otherwise; none is in use)
        client.images.remove(image.id if by_id else ref, force=by_id and len(image.tags) > 1)
    except (ImageNotFound, NotFound):
        return "missing"
    except APIError as exc:
        if exc.status_code == 409:  # a container started from it meanwhile
            return "in-use: a container started from it meanwhile"
        raise
    return "removed"


def container_state(client: docker.DockerClient, ref: str) -> str:
    """A container's state as Docker says it (running, paused, exited, ...), or "missing"."""
    try:
        return client.api.inspect_container(ref)["State"]["Status"]
    except NotFound:
        return "missing"


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except ImageNotFound:
        return False


def list_sandboxes(client: docker.DockerClient, stack: str) -> list[Any]:
    return client.containers.list(all=True, filters={"label": [f"{L_STACK}={stack}", f"{L_ROLE}=sandbox"]})


def sweep(client: docker.DockerClient, stack: str, *, images: bool = True, networks: bool = True) -> dict[str, int]:
    """Remove every container, volume (and snapshot image, network) labelled with the stack. Used on destroy."""
    out = {"containers": 0, "volumes": 0, "images": 0, "networks": 0}
    for c in client.containers.list(all=True, filters={"label": f"{L_STACK}={stack}"}):
        remove(client, c.id)
        out["containers"] += 1
    _wait_removed(client, stack)
    for v in client.volumes.list(filters={"label": f"{L_STACK}={stack}"}):
        try:
            v.remove(force=True)
            out["volumes"] += 1
        except NotFound:
            pass
    if images:
        for img in client.images.list(filters={"label": [f"{L_STACK}={stack}", f"{L_ROLE}=snapshot"]}):
            try:
                client.images.remove(img.id, force=True)
                out["images"] += 1
            except (NotFound, APIError):
                pass
    if networks:
        for n in client.networks.list(filters={"label": f"{L_STACK}={stack}"}):
            out["networks"] += _remove_network(n)
    return out


def _wait_removed(client: docker.DockerClient, stack: str, *, timeout: float = 30.0) -> None:
    """Until no container of the stack is listed: one whose removal someone else had in flight (remove() answered
    409 "already in progress") is still listed, with its volumes and network endpoint, until Docker finishes it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # the low-level list inspects nothing, so a container going meanwhile is fine
        if not client.api.containers(all=True, quiet=True, filters={"label": f"{L_STACK}={stack}"}):
            return
        time.sleep(0.2)
    log.warning("stack %s: containers still being removed after %.0f s", stack, timeout)


def _remove_network(network: Any, *, timeout: float = 30.0) -> int:
    """Remove a network; 1 if removed, 0 if already gone. A container whose removal someone else had in flight
    (the stopped operator's own, say: Docker finishes it) keeps its endpoint until that removal ends, so "has
    active endpoints" is retried, with the remaining endpoints disconnected by force, for up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            network.remove()
            return 1
        except NotFound:
            return 0
        except APIError as exc:
            if "active endpoints" not in str(exc) or time.monotonic() > deadline:
                raise
        try:
            network.reload()
            for cid in (network.attrs.get("Containers") or {}):
                try:
                    network.disconnect(cid, force=True)
                except (NotFound, APIError):
                    pass
        except NotFound:
            return 0
        time.sleep(0.5)
