"""package: the wheel a user installs. Built from the sources (not editable), installed into a fresh venv once per
extra, alone: the base install (the SDK and the CLI), `operator`, `execd` and `components`. Each venv must run what
its extra promises, and must not hold what it does not need (an application that only claims sandboxes pulls no
Pulumi, kopf, docker SDK or web server).

The dependencies come from a local wheelhouse, $CORRAL_CACHE/wheels/<key>, filled once from the package index with
the test bed's own versions (`pip freeze` as constraints) and reused offline (`--no-index`) after that; the key
changes with those versions and the project's requirements.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.package

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "api", "client", "components", "execd", "operator",
           "templates", "charts")
SERVER_SIDE = ("pulumi", "pulumi_kubernetes", "kopf", "docker", "uvicorn", "fastapi", "starlette", "lightkube")


def run(argv: list[str], *, cwd: Path, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
                    f"--- stderr\n{proc.stderr[-3000:]}", pytrace=False)
    return proc


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("wheel")


@pytest.fixture(scope="module")
def wheel(work: Path) -> Path:
    """The wheel, built from a copy of the sources (a build leaves build/ and *.egg-info/ behind) without build
    isolation, so no download: setuptools is in the dev extra."""
    src = work / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(work / "dist"),
         str(src)], cwd=work)
    (built,) = (work / "dist").glob("corral-*.whl")
    return built


@pytest.fixture(scope="module")
def wheelhouse(work: Path, wheel: Path) -> Path:
    freeze = run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], cwd=work).stdout
    pins = "".join(line + "\n" for line in freeze.splitlines() if " @ " not in line and not line.startswith("-"))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needs = repr((project["dependencies"], {k: v for k, v in project["optional-dependencies"].items() if k != "dev"}))
    key = hashlib.sha256(f"{pins}{needs}{platform.python_version()}{platform.machine()}".encode()).hexdigest()[:16]
    cache = Path(os.environ.get("CORRAL_CACHE") or Path.home() / ".cache" / "corral") / "wheels"
    house = cache / key
    if not house.is_dir():
        (work / "constraints.txt").write_text(pins)
        fill = work / "wheelhouse"
        run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(fill), "-c", str(work / "constraints.txt"),
             f"{wheel}[all]"], cwd=work, timeout=1800)
        for own in fill.glob("corral-*.whl"):
            own.unlink()
        cache.mkdir(parents=True, exist_ok=True)
        try:
            fill.rename(house)
        except OSError:  # another run filled it first
            assert house.is_dir()
    return house


def venv_with(work: Path, wheel: Path, wheelhouse: Path, extra: str) -> Path:
    """A fresh venv (no pip of its own: the test bed's pip installs into it) with the wheel and `extra`."""
    venv = work / f"venv-{extra or 'base'}"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
    run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-index",
         "--find-links", str(wheelhouse), f"{wheel}[{extra}]" if extra else str(wheel)], cwd=work)
    return venv


def importable(venv: Path, names: tuple[str, ...], work: Path) -> list[str]:
    code = "import importlib.util, sys; print(' '.join(n for n in sys.argv[1:] if importlib.util.find_spec(n)))"
    return run([str(venv / "bin" / "python"), "-c", code, *names], cwd=work).stdout.split()


def test_the_wheel_holds_every_package_and_the_data_files(wheel: Path):
    names = set(zipfile.ZipFile(wheel).namelist())
    for path in ("corral/operator/claimsapi/app.py", "corral/operator/docker/main.py", "corral/operator/reconcile/",
                 "corral/operator/core/", "corral/api/wire.py", "corral/client/cli.py",
                 "corral/components/provider/PulumiPlugin.yaml", "corral/execd/openapi.json",
                 "corral/operator/claimsapi/openapi.json", "corral/api/crds/corral.dev_pools.yaml",
                 "corral/templates/python.yaml.j2", "corral/charts/corral/Chart.yaml",
                 "corral/charts/corral/templates/deployment.yaml", "corral/charts/corral/crds/pools.corral.dev.yaml"):
        assert any(n.startswith(path) for n in names), path
    assert not any("__pycache__" in n or n.startswith(("tests/", "scripts/", "operator/")) for n in names)
    # operator/ has no __init__.py in the repository; in the wheel too corral.operator is a namespace portion
    assert "corral/operator/__init__.py" not in names


def test_base_install_is_the_sdk_and_cli_only(work: Path, wheel: Path, wheelhouse: Path):
    venv = venv_with(work, wheel, wheelhouse, "")
    out = run([str(venv / "bin" / "corral"), "--help"], cwd=work).stdout
    assert "claim" in out and "exec" in out
    run([str(venv / "bin" / "python"), "-c",
         ("import sys\n"
         "from corral.client import AsyncClient, Client, NotFound\n"
         "from corral.client.models import Claim\n"
         "c = Claim.model_validate({'name': 'c', 'pool': 'p', 'poolKind': 'Pool', 'phase': 'Ready',"
         " 'created': '2026-01-01T00:00:00Z'})\n"
         "assert c.pool_kind == 'Pool'\n"
         "assert not [m for m in sys.modules if m.startswith(('corral.operator', 'corral.components'))]\n")],
        cwd=work)
    assert importable(venv, SERVER_SIDE + ("jinja2",), work) == []


def test_operator_extra_runs_the_operator(work: Path, wheel: Path, wheelhouse: Path):
    venv = venv_with(work, wheel, wheelhouse, "operator")
    out = run([str(venv / "bin" / "python"), "-m", "corral.operator", "--help"], cwd=work).stdout
    assert "--standalone" in out  # kopf run's own help: the operator's entry point got as far as kopf
    run([str(venv / "bin" / "python"), "-c",
         "import corral.operator.handlers, corral.operator.docker.main, corral.operator.claimsapi.app"], cwd=work)
    assert "claim" in run([str(venv / "bin" / "corral"), "--help"], cwd=work).stdout
    assert importable(venv, ("pulumi", "pulumi_kubernetes", "jinja2"), work) == []


def test_execd_extra_runs_execd(work: Path, wheel: Path, wheelhouse: Path):
    venv = venv_with(work, wheel, wheelhouse, "execd")
    proc = run([str(venv / "bin" / "python"), "-m", "corral.execd", "--help"], cwd=work, check=False)
    assert proc.returncode == 0 and "usage: python -m corral.execd" in proc.stdout, proc.stderr
    run([str(venv / "bin" / "python"), "-c", "import corral.execd.app, corral.execd.server"], cwd=work)
    assert importable(venv, ("pulumi", "kopf", "docker", "fastapi", "lightkube"), work) == []


def test_components_extra_renders_the_catalogue_and_imports_the_components(work: Path, wheel: Path,
                                                                          wheelhouse: Path):
    venv = venv_with(work, wheel, wheelhouse, "components")
    out = run([str(venv / "bin" / "python"), "-c",
               ("from corral.components import (ControllerDeployment, DockerStack, Pool, SandboxTemplate, WarmPool,\n"
               "                               __version__)\n"
               "import corral.components.provider\n"
               "from corral.components import catalogue\n"
               "from corral.components.controller import chart_crds\n"
               "from corral.components.controller_values import CHART_DIR\n"
               "spec = catalogue.render('python')\n"
               "assert spec.pod_template.spec['containers'][0]['image'] == 'corral/python:bookworm', spec\n"
               "assert {'python', 'node', 'shell'} <= set(catalogue.names())\n"
               "assert (CHART_DIR / 'Chart.yaml').is_file() and len(chart_crds()) >= 5\n"
               "print(__version__)\n")], cwd=work).stdout
    assert out.strip() == "0.1.0"
    assert importable(venv, ("kopf", "uvicorn", "fastapi", "lightkube"), work) == []
