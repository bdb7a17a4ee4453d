"""DockerStack: Corral on one Docker host. Networks, the operator image, the operator container (with the Docker
socket and its state volume), the pools file, and a sweeper that removes what the operator made on destroy.

Docker resources are Pulumi *dynamic* resources on the docker SDK: the pulumi-docker provider cannot be built
offline here (the Go module proxy refuses github.com/pulumi/pulumi-docker/provider at every version). Each provider
implements create/diff (replace where Docker cannot update in place)/update/delete, creates its Docker client
inside each method (never on self: providers are pickled), and tolerates objects that are already gone.

    DockerStack("corral", DockerStackArgs(stack="local", templates={...}, warm_pools=[...], pools=[...]))
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, ResourceProvider, UpdateResult

from ._dynamic import Resource
from ._token import ApiToken, TokenProvider  # noqa: F401

STACK_LABEL = "corral.dev/stack"
ROLE_LABEL = "corral.dev/role"


_IMPORT = threading.Lock()


def _modules() -> None:
    """The engine runs provider calls in threads: the first imports of docker (and of the operator's Docker code,
    which imports it) happen once, under a lock. Concurrent first imports raised importlib's _DeadlockError."""
    with _IMPORT:
        import docker  # noqa: F401
        import docker.errors  # noqa: F401

        import corral.operator.docker.engine  # noqa: F401
        import corral.operator.docker.image  # noqa: F401


def _client(host: str | None):
    _modules()
    import docker

    return docker.DockerClient(base_url=host) if host else docker.from_env()


def _labels(stack: str, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/managed-by": "corral-operator", STACK_LABEL: stack, ROLE_LABEL: role}


def _replace_on(olds: dict[str, Any], news: dict[str, Any], keys: list[str]) -> DiffResult:
    changed = [k for k in keys if olds.get(k) != news.get(k)]
    return DiffResult(changes=bool(changed), replaces=changed, delete_before_replace=True)


class _Provider(ResourceProvider):
    serialize_as_secret_always = False


# --- networks and volumes ------------------------------------------------------------------------------------------
class NetworkProvider(_Provider):
    """A template's sandbox network: bridge, inter-container communication off (engine.ensure_network)."""

    KEYS = ["name", "internal", "stack", "host"]

    def create(self, props: dict[str, Any]) -> CreateResult:
        # The operator's own function: a bridge network with inter-container traffic off (its sandboxes cannot
        # reach each other; the operator, on the host network, still reaches them), an older ICC-on network of the
        # same name recreated when nothing is attached.
        _modules()
        from corral.operator.docker.engine import ensure_network

        net_id = ensure_network(_client(props.get("host")), props["name"], internal=bool(props["internal"]),
                                stack=props["stack"])
        return CreateResult(net_id, {**props, "network_id": net_id})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _replace_on(olds, news, self.KEYS)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _modules()
        from docker.errors import NotFound

        try:
            _client(props.get("host")).networks.get(props["name"]).remove()
        except NotFound:
            pass


class DockerNetwork(Resource):
    network_id: pulumi.Output[str]

    def __init__(self, name: str, *, network: str, internal: bool, stack: str, host: str | None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(NetworkProvider(), name, {"name": network, "internal": internal, "stack": stack,
                                                    "host": host, "network_id": None}, opts)


class VolumeProvider(_Provider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        client = _client(props.get("host"))
        vol = client.volumes.create(props["name"], labels=_labels(props["stack"], props["role"]))
        return CreateResult(vol.name, props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _replace_on(olds, news, ["name", "stack", "role", "host"])

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _modules()
        from docker.errors import NotFound

        try:
            _client(props.get("host")).volumes.get(props["name"]).remove(force=True)
        except NotFound:
            pass


class DockerVolume(Resource):
    def __init__(self, name: str, *, volume: str, stack: str, role: str, host: str | None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(VolumeProvider(), name, {"name": volume, "stack": stack, "role": role, "host": host}, opts)


# --- the operator image --------------------------------------------------------------------------------------------
class ImageProvider(_Provider):
    """The operator image must exist on the engine. The default tag (this checkout's sources) is built offline by
    scripts/operator-image.sh when missing; a user-given tag must already be there. Delete keeps the image (it is a
    build cache, not state)."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        _modules()
        from docker.errors import ImageNotFound

        client = _client(props.get("host"))
        try:
            image = client.images.get(props["tag"])
        except ImageNotFound:
            if not props.get("build"):
                raise RuntimeError(f"image {props['tag']} is not on the Docker engine") from None
            from corral.operator.docker.image import ensure_image

            ensure_image()
            image = client.images.get(props["tag"])
        return CreateResult(image.id, {**props, "image_id": image.id})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _replace_on(olds, news, ["tag", "host"])

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        return None


class OperatorImage(Resource):
    image_id: pulumi.Output[str]
    tag: pulumi.Output[str]

    def __init__(self, name: str, *, tag: str, build: bool, host: str | None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(ImageProvider(), name, {"tag": tag, "build": build, "host": host, "image_id": None}, opts)


# --- the API token: ._token (re-exported here: stacks created earlier name these classes in their state) ----------


# --- the pools file ------------------------------------------------------------------------------------------------
class PoolsFileProvider(_Provider):
    """Writes the pools file (atomically) where the operator container reads it; on a change it signals the
    stack's operator (SIGHUP) to reload."""

    def _write(self, props: dict[str, Any]) -> None:
        path = Path(props["path"])
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(props["content"])
        tmp.replace(path)

    def create(self, props: dict[str, Any]) -> CreateResult:
        self._write(props)
        return CreateResult(f"pools-{props['stack']}", props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        d = _replace_on(olds, news, ["path"])
        return DiffResult(changes=d.changes or olds.get("content") != news.get("content"), replaces=d.replaces,
                          delete_before_replace=True)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        self._write(news)
        client = _client(news.get("host"))
        for c in client.containers.list(filters={"label": [f"{STACK_LABEL}={news['stack']}",
                                                           f"{ROLE_LABEL}=operator"]}):
            c.kill(signal="SIGHUP")
        return UpdateResult(news)

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        path = Path(props["path"])
        path.unlink(missing_ok=True)
        try:
            path.parent.rmdir()
        except OSError:
            pass


class PoolsFile(Resource):
    def __init__(self, name: str, *, path: str, content: str, stack: str, host: str | None,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(PoolsFileProvider(), name, {"path": path, "content": content, "stack": stack, "host": host},
                         opts)


# --- the sweeper ---------------------------------------------------------------------------------------------------
class SweeperProvider(_Provider):
    """Nothing on create. On delete (after the operator container is gone, before networks and volumes) removes
    every container, volume, snapshot image and network labelled with the stack: the sandboxes the operator made."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"sweeper-{props['stack']}", props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _replace_on(olds, news, ["stack", "host"])

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        _modules()
        from corral.operator.docker import engine

        engine.sweep(_client(props.get("host")), props["stack"])


class Sweeper(Resource):
    def __init__(self, name: str, *, stack: str, host: str | None, opts: pulumi.ResourceOptions | None = None):
        super().__init__(SweeperProvider(), name, {"stack": stack, "host": host}, opts)


# --- the operator container ----------------------------------------------------------------------------------------
class OperatorProvider(_Provider):
    """The operator container: host network (its API binds 127.0.0.1:<apiPort> on the host; it reaches sandboxes by
    their bridge IPs, internal networks included), the Docker socket, the state volume, the pools file read-only.
    Create waits until the API answers. Any input change replaces it (the store keeps the state across)."""

    KEYS = ["name", "image", "stack", "api_port", "pools_dir", "state_volume", "token", "host", "log_level"]

    def create(self, props: dict[str, Any]) -> CreateResult:
        import urllib.request

        _modules()
        from docker.errors import NotFound

        from corral.api.wire import API_HEALTH_PATH

        props = {**props, "api_port": int(props["api_port"])}  # numbers arrive as floats
        client = _client(props.get("host"))
        try:  # a leftover of a failed run with our name
            client.containers.get(props["name"]).remove(force=True)
        except NotFound:
            pass
        host = props.get("host") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        volumes = {props["pools_dir"]: {"bind": "/etc/corral", "mode": "ro"},
                   props["state_volume"]: {"bind": "/var/lib/corral", "mode": "rw"}}
        env = {"CORRAL_STACK": props["stack"], "CORRAL_POOLS_FILE": "/etc/corral/pools.json",
               "CORRAL_STATE_DIR": "/var/lib/corral", "CORRAL_API_HOST": "127.0.0.1",
               "CORRAL_API_PORT": str(props["api_port"]), "CORRAL_API_TOKEN": props["token"],
               "CORRAL_LOG_LEVEL": props.get("log_level") or "info"}
        if host.startswith("unix://"):
            sock = host.removeprefix("unix://")
            volumes[sock] = {"bind": "/var/run/docker.sock", "mode": "rw"}
        else:
            env["DOCKER_HOST"] = host
        c = client.containers.run(
            props["image"], name=props["name"], detach=True, network_mode="host", init=True, environment=env,
            volumes=volumes, labels=_labels(props["stack"], "operator"),
            restart_policy={"Name": "unless-stopped"}, mem_limit="1g", pids_limit=1024,
            security_opt=["no-new-privileges"], cap_drop=["ALL"],
            log_config={"type": "json-file", "config": {"max-size": "10m", "max-file": "2"}},
        )
        deadline = time.monotonic() + 180
        url = f"http://127.0.0.1:{props['api_port']}{API_HEALTH_PATH}"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            c.reload()
            if c.status not in ("running", "created", "restarting") or time.monotonic() > deadline:
                logs = c.logs(tail=40).decode(errors="replace")
                raise RuntimeError(f"operator container {props['name']} did not become healthy ({c.status}):\n{logs}")
            time.sleep(0.2)
        return CreateResult(c.id, {**props, "container_id": c.id})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return _replace_on(olds, news, self.KEYS)

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        _modules()
        from docker.errors import NotFound

        try:
            _client(props.get("host")).containers.get(id_)
        except NotFound:
            return ReadResult(None, {})  # gone: the next up creates it again
        return ReadResult(id_, props)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        _modules()
        from docker.errors import NotFound

        client = _client(props.get("host"))
        try:
            c = client.containers.get(props["name"])
            c.stop(timeout=10)
            c.remove(force=True)
        except NotFound:
            pass


class OperatorContainer(Resource):
    container_id: pulumi.Output[str]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None):
        super().__init__(OperatorProvider(), name, {**props, "container_id": None}, opts)


# --- the component -------------------------------------------------------------------------------------------------
def default_state_root() -> Path:
    return Path(os.environ.get("CORRAL_CACHE") or Path.home() / ".cache" / "corral") / "run" / "docker-stacks"


@dataclass
class DockerStackArgs:
    """Arguments of a DockerStack component."""

    stack: str
    """Name of this Corral on the Docker host: every container, network and volume carries
    corral.dev/stack=<stack>, and destroy removes exactly those."""
    templates: dict[str, dict[str, Any]]
    """Sandbox templates by name, each a SandboxTemplate spec in its Kubernetes form (camelCase keys)."""
    warm_pools: list[dict[str, Any]] = field(default_factory=list)
    """Warm pools: each {name, template, replicas, update_strategy (OnReplenish or Recreate),
    readiness_grace_seconds}."""
    pools: list[dict[str, Any]] = field(default_factory=list)
    """Elastic pools: each {name, template, buffer_min, buffer_max, pool_min, pool_max, recycle_strategy
    (Delete, Restart or Noop), max_unavailable, readiness_grace_seconds}."""
    api_port: int = 7780
    """Port of the claims API on the host's 127.0.0.1."""
    host: str | None = None
    """Docker Engine to use (e.g. unix:///var/run/docker.sock; default: the environment's DOCKER_HOST)."""
    internal_networks: list[str] = field(default_factory=list)
    """Templates whose sandbox network has no route out (Docker internal networks)."""
    operator_image: str | None = None
    """Operator image to run; it must exist on the engine (default: corral/operator:<sources key>, built offline
    from this checkout when missing)."""
    pools_dir: str | None = None
    """Host folder of the pools file the operator reads (default: $CORRAL_CACHE/run/docker-stacks/<stack>)."""
    log_level: str = "info"
    """The operator's log level (debug, info, warning, error)."""


class DockerStack(pulumi.ComponentResource):
    """Corral on one Docker host: the operator container (claims API, warm pools and pools of hardened sandbox
    containers) with its networks, state volume and pools file."""

    api_url: pulumi.Output[str]
    """Base URL of the claims API (http://127.0.0.1:<api_port>), known once the operator answers."""
    api_token: pulumi.Output[str]
    """Bearer token of the claims API (secret)."""
    operator_image: pulumi.Output[str]
    """The operator image that runs."""
    networks: pulumi.Output[list[str]]
    """Docker networks of the templates' sandboxes."""

    def __init__(self, name: str, args: DockerStackArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("corral:index:DockerStack", name, None, opts)
        from corral.operator.docker.desired import DesiredState, docker_template, pool, warm_pool

        child = pulumi.ResourceOptions(parent=self)
        stack, host = args.stack, args.host
        networks = {t: f"corral-{stack}-{t}" for t in args.templates}
        desired = DesiredState(
            stack=stack,
            templates=[docker_template(t, spec, network=networks[t], internal=t in args.internal_networks)
                       for t, spec in args.templates.items()],
            warm_pools=[warm_pool(**p) for p in args.warm_pools],
            pools=[pool(**p) for p in args.pools],
        )
        nets = [DockerNetwork(f"{name}-net-{t}", network=n, internal=t in args.internal_networks, stack=stack,
                              host=host, opts=child) for t, n in networks.items()]
        if args.operator_image:
            tag, build = args.operator_image, False
        else:
            from corral.operator.docker.image import tag as image_tag  # the program's main thread: no race

            tag, build = image_tag(), True
        image = OperatorImage(f"{name}-operator-image", tag=tag, build=build, host=host, opts=child)
        state = DockerVolume(f"{name}-state", volume=f"corral-{stack}-state", stack=stack, role="state", host=host,
                             opts=child)
        pools_dir = args.pools_dir or str(default_state_root() / stack)
        pools_file = PoolsFile(f"{name}-pools-file", path=f"{pools_dir}/pools.json", content=desired.dump(),
                               stack=stack, host=host, opts=child)
        sweeper = Sweeper(f"{name}-sweeper", stack=stack, host=host,
                          opts=pulumi.ResourceOptions(parent=self, depends_on=[*nets, state]))
        token = ApiToken(f"{name}-api-token", opts=child)
        operator = OperatorContainer(
            f"{name}-operator",
            {"name": f"corral-{stack}-operator", "image": image.tag, "stack": stack, "api_port": args.api_port,
             "pools_dir": pools_dir, "state_volume": f"corral-{stack}-state", "token": token.token, "host": host,
             "log_level": args.log_level},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[image, state, pools_file, sweeper, *nets]),
        )
        self.api_url = operator.container_id.apply(lambda _: f"http://127.0.0.1:{args.api_port}")
        self.api_token = pulumi.Output.secret(token.token)
        self.operator_image = image.tag
        self.networks = pulumi.Output.from_input(sorted(networks.values()))
        self.register_outputs({"api_url": self.api_url, "api_token": self.api_token,
                               "operator_image": self.operator_image, "networks": self.networks})
