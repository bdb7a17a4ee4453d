"""The distribution imports as corral.<part>, and `operator` stays the standard library."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # several conftest.py exist; never import one by name


def test_parts_import_and_stdlib_operator_is_not_shadowed():
    # Run from the repository root, where a folder named `operator/` sits on sys.path[0].
    code = (
        "import corral.api, corral.components, corral.execd, corral.client, operator; "
        "assert operator.add(1, 2) == 3, operator.__file__; "
        "import collections; print(operator.__file__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("/operator.py")
    assert str(REPO) not in out.stdout


def test_operator_folder_has_no_init_so_it_cannot_shadow_stdlib():
    assert not (REPO / "operator" / "__init__.py").exists()
