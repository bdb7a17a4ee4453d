"""One fact, one home: execd's port, paths and token header live in corral.execd.wire (the claims API's own health
path in corral.api.wire), and the code base holds no second copy of them as a literal that could drift."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from corral.api.common import EXECD_ENV_PREFIX
from corral.api.template import EXECD_DEFAULT_PORT
from corral.api.wire import API_HEALTH_PATH
from corral.execd import wire

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "client", "components", "execd", "operator")

# fact -> (how a literal carrying it is recognised, the files allowed to state it)
FACTS = {
    "execd's port": (lambda v: v == wire.PORT or (isinstance(v, str) and str(wire.PORT) in v),
                     {"execd/wire.py", "api/template.py"}),  # the resource model's copy: see the test below
    "the health path": (lambda v: isinstance(v, str) and wire.HEALTH_PATH in v, {"execd/wire.py", "api/wire.py"}),
    "execd's token path": (lambda v: isinstance(v, str) and wire.TOKEN_PATH in v, {"execd/wire.py"}),
    "execd's env path": (lambda v: isinstance(v, str) and wire.ENV_PATH in v, {"execd/wire.py"}),
    "execd's token header": (lambda v: isinstance(v, str | bytes) and wire.TOKEN_HEADER.lower() in (
        v.decode(errors="replace") if isinstance(v, bytes) else v).lower(), {"execd/wire.py"}),
}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes (prose may name a path; code may not)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def stray_literals(root: Path) -> list[str]:
    """Every constant in the packages' code (f-string parts included, docstrings and comments not) that states a wire
    fact outside its home, as "path:line: fact"."""
    found = []
    files = [p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))] + [root / "__main__.py"]
    for path in files:
        if not path.exists():
            continue
        rel = path.relative_to(root).as_posix()
        tree = ast.parse(path.read_text(), filename=rel)
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or id(node) in skip or isinstance(node.value, bool):
                continue
            for fact, (states, homes) in FACTS.items():
                if rel not in homes and states(node.value):
                    found.append(f"{rel}:{node.lineno}: {fact} ({node.value!r})")
    return found


def test_wire_facts_are_stated_only_in_their_home() -> None:
    assert stray_literals(REPO) == [], "import them from corral.execd.wire (the claims API's: corral.api.wire)"


def test_the_resource_models_copies_match_execd() -> None:
    # corral.api imports no other Corral package (import-linter), so it keeps its own copy of these two.
    assert EXECD_DEFAULT_PORT == wire.PORT
    assert EXECD_ENV_PREFIX == wire.ENV_PREFIX


def test_execd_serves_what_the_wire_module_says() -> None:
    doc = json.loads((REPO / "execd" / "openapi.json").read_text())
    assert {wire.HEALTH_PATH, wire.TOKEN_PATH, wire.ENV_PATH} <= set(doc["paths"])
    assert doc["paths"][wire.HEALTH_PATH]["get"].get("security") == []  # the one path without a token
    assert doc["components"]["securitySchemes"]["accessToken"]["name"] == wire.TOKEN_HEADER
    assert doc["servers"] == [{"url": f"http://127.0.0.1:{wire.PORT}"}]


def test_the_claims_api_serves_its_health_path_without_a_token() -> None:
    from corral.operator.claimsapi.app import OPEN_PATHS

    assert API_HEALTH_PATH in OPEN_PATHS
