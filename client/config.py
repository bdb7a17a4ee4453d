"""Where the claims API is and its token: explicit arguments, else the environment (`CORRAL_API_URL`,
`CORRAL_API_TOKEN`), else the config file (`CORRAL_CONFIG`, default `~/.config/corral/config.toml`, honouring
`XDG_CONFIG_HOME`). `corral config pulumi --stack local` writes that file from the stack's outputs (`apiUrl` or,
on Kubernetes, `apiEndpoint`, and `apiToken`).

    # ~/.config/corral/config.toml (mode 0600)
    api_url = "http://127.0.0.1:7780"
    api_token = "..."
"""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import CorralError

ENV_URL, ENV_TOKEN, ENV_CONFIG = "CORRAL_API_URL", "CORRAL_API_TOKEN", "CORRAL_CONFIG"
DEFAULT_URL = "http://127.0.0.1:7780"


class ConfigError(CorralError):
    code = "config"


@dataclass(frozen=True)
class Settings:
    url: str
    token: str
    source: str   # where they came from, for messages: "arguments", "environment", or the file's path


def config_path() -> Path:
    if os.environ.get(ENV_CONFIG):
        return Path(os.environ[ENV_CONFIG]).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "corral" / "config.toml"


def read_file(path: Path | None = None) -> dict[str, str]:
    path = path or config_path()
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return {k: str(v) for k, v in data.items() if k in ("api_url", "api_token")}


def resolve(url: str | None = None, token: str | None = None) -> Settings:
    """The API address and token, first found wins per value: arguments, environment, config file."""
    sources = []
    if url or token:
        sources.append("arguments")
    env_url, env_token = os.environ.get(ENV_URL), os.environ.get(ENV_TOKEN)
    if (not url and env_url) or (not token and env_token):
        sources.append("environment")
    url, token = url or env_url, token or env_token
    if not url or not token:
        path = config_path()
        file = read_file(path)
        if file:
            sources.append(str(path))
        url, token = url or file.get("api_url"), token or file.get("api_token")
    if not token:
        raise ConfigError(f"no API token: set {ENV_TOKEN}, pass token=..., or write {config_path()} with "
                          f"`corral config pulumi --stack <stack>` (or `corral config set`)")
    return Settings(url=(url or DEFAULT_URL).rstrip("/"), token=token, source=" + ".join(sources) or "defaults")


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string (\" \\ \n \uXXXX escapes) is a valid TOML basic string


def write_file(url: str, token: str, path: Path | None = None) -> Path:
    """Write the config file (0600: it holds a secret), replacing it atomically."""
    path = path or config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("# Corral client settings (corral config ...). Environment variables override them.\n")
        f.write(f"api_url = {_toml_string(url.rstrip('/'))}\napi_token = {_toml_string(token)}\n")
    os.replace(tmp, path)
    return path


def from_pulumi_outputs(outputs: dict[str, object], stack: str, url: str | None = None) -> tuple[str, str]:
    """(url, token) from `pulumi stack output --json --show-secrets`. The local (Docker) stack exports `apiUrl` and
    `apiToken`; a Kubernetes stack exports `apiEndpoint` (the in-cluster Service URL) and `apiToken`; `url` overrides
    the address (e.g. http://127.0.0.1:7780 through `kubectl port-forward`)."""
    found, token = url or outputs.get("apiUrl") or outputs.get("apiEndpoint"), outputs.get("apiToken")
    if not isinstance(found, str) or not found or not isinstance(token, str) or not token or token == "[secret]":
        have = ", ".join(sorted(outputs)) or "none"
        raise ConfigError(f"stack {stack} does not export apiUrl (or apiEndpoint) and apiToken (it exports: {have}); "
                          f"use `corral config set --url ... --token ...` instead")
    return found, token


def pulumi_outputs(stack: str, *, pulumi: str = "pulumi", cwd: str | None = None) -> dict[str, object]:
    cmd = [*pulumi.split(), "stack", "output", "--json", "--show-secrets", "--stack", stack]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)
    except FileNotFoundError:
        raise ConfigError(f"{cmd[0]} not found (put the Pulumi CLI on PATH, e.g. eval \"$(scripts/env.sh)\", "
                          f"or pass --pulumi)") from None
    if proc.returncode != 0:
        raise ConfigError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    try:
        outputs: dict[str, object] = json.loads(proc.stdout)
        return outputs
    except ValueError:
        raise ConfigError(f"`{' '.join(cmd)}` did not print JSON: {proc.stdout[:500]}") from None
