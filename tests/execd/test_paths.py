"""The path policy function alone: realpath + commonpath, relative paths, `..`, symlinks, prefixes."""

from __future__ import annotations

import os

import pytest

from corral.execd.errors import ExecdError
from corral.execd.paths import confine

pytestmark = pytest.mark.execd


@pytest.fixture
def tree(tmp_path):
    root, other = tmp_path / "root", tmp_path / "root-sibling"
    (root / "sub").mkdir(parents=True)
    other.mkdir()
    (root / "in-link").symlink_to(root / "sub")
    (root / "out-link").symlink_to(other)
    return os.path.realpath(root), os.path.realpath(other)


def allowed(raw, root, **kw):
    return confine(raw, [root], root, **kw)


def test_inside_paths(tree):
    root, _ = tree
    assert allowed(root, root) == root
    assert allowed("sub", root) == f"{root}/sub"
    assert allowed(f"{root}/sub/../sub/new-file", root) == f"{root}/sub/new-file"
    assert allowed(f"{root}/in-link", root) == f"{root}/sub"
    assert allowed(f"{root}/in-link", root, follow=False) == f"{root}/in-link"
    assert allowed(f"{root}/out-link", root, follow=False) == f"{root}/out-link"


@pytest.mark.parametrize("raw", ["..", "../root-sibling", "/etc/passwd", "/", "{root}/out-link", "{root}/out-link/x",
                                 "{root}/../root-sibling", "{root}-sibling", "sub/../../root-sibling"])
def test_outside_paths_are_403(tree, raw):
    root, _ = tree
    with pytest.raises(ExecdError) as err:
        allowed(raw.format(root=root), root)
    assert err.value.status == 403


def test_dotdot_after_a_link_is_resolved_not_collapsed(tree):
    root, _ = tree
    # `out-link/..` is the sibling's parent on disk, not `root`: a lexical normpath would get this wrong
    with pytest.raises(ExecdError):
        allowed(f"{root}/out-link/../new", root, follow=False)
    assert allowed(f"{root}/in-link/../new", root, follow=False) == f"{root}/new"


def test_empty_and_nul_are_400(tree):
    root, _ = tree
    for raw in ("", "a\x00b"):
        with pytest.raises(ExecdError) as err:
            allowed(raw, root)
        assert err.value.status == 400


def test_several_roots(tree):
    root, other = tree
    assert confine(f"{other}/x", [root, other], root) == f"{other}/x"
