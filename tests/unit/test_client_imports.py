"""unit: what the SDK and the CLI import. The SDK never imports the operator, the components or execd (the wire
models are corral.api.wire); `corral --help` loads neither the SDK (httpx, pydantic, the models) nor rich's live
displays and progress bars, much of what keeps it fast (the time itself is measured in bench/cli_startup)."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVER_SIDE = ("corral.operator", "corral.components", "corral.execd")


def loaded_after(code: str) -> tuple[list[str], str]:
    """Run `code` in a fresh interpreter (outside the repository), then list the modules it loaded."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=REPO.parent, check=False)
    assert proc.returncode == 0, proc.stderr
    *printed, modules = proc.stdout.rstrip("\n").split("\n")
    return json.loads(modules), "\n".join(printed)


def test_the_sdk_does_not_import_the_server_side():
    modules, _ = loaded_after(
        "from corral.client import AsyncClient, Claim, Client, NotFound, PoolStatus\n"
        "import corral.client.cli, corral.client.models, corral.client.shell\n"
        "Claim.model_validate({'name': 'c', 'pool': 'p', 'poolKind': 'WarmPool', 'phase': 'Ready',"
        " 'created': '2026-01-01T00:00:00Z', 'futureField': 1})")
    assert "corral.api.wire" in modules and "httpx" in modules  # it did load the SDK
    assert [m for m in modules if m.startswith(SERVER_SIDE)] == []


def test_corral_help_loads_no_sdk_and_no_progress_bars():
    modules, printed = loaded_after(
        "from corral.client.cli import app\n"
        "try:\n"
        "    app(['--help'], prog_name='corral')\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n")
    for command in ("claim", "exec", "shell", "cp", "release", "config"):
        assert command in printed
    heavy = ("httpx", "pydantic", "websockets", "corral.api", "corral.client.sync", "corral.client.aio",
             "rich.progress", "rich.live", *SERVER_SIDE)  # (typer's help draws its panels with rich.table)
    assert [m for m in modules if m.split(".")[0] in heavy or m.startswith(heavy)] == []
