"""Directories: paging a 100,000-entry tree, symlink root, traversal, error shape for bad input."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.execd


def make_tree(root: Path, dirs: int, files_per_dir: int) -> set[str]:
    """`dirs` directories of `files_per_dir` files each, plus the directories themselves."""
    expected = set()
    for d in range(dirs):
        sub = root / f"d{d:04d}"
        sub.mkdir()
        expected.add(str(sub))
        for f in range(files_per_dir):
            p = sub / f"f{f:04d}"
            p.touch()
            expected.add(str(p))
    return expected


@pytest.fixture(scope="module")
def big_tree(daemon) -> tuple[Path, set[str]]:
    root = daemon.workspace / "big-tree"
    root.mkdir()
    expected = make_tree(root, 100, 999)  # 100 dirs + 99,900 files = 100,000 entries
    (root / "flat").mkdir()  # plus one big flat directory, to page through the middle of a listing
    expected.add(str(root / "flat"))
    for i in range(2500):
        (root / "flat" / f"n{i}").touch()
        expected.add(str(root / "flat" / f"n{i}"))
    return root, expected


def list_all(client, path: str, depth: int, limit: int) -> list[dict]:
    entries, cursor, pages = [], None, 0
    while True:
        params = {"path": path, "depth": depth, "limit": limit}
        if cursor:
            params["cursor"] = cursor
        r = client.get("/v1/directories/list", params=params)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["entries"]) <= limit
        entries += body["entries"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return entries
        assert pages < 10_000


def test_100k_tree_paged_returns_every_entry_once(client, big_tree):
    root, expected = big_tree
    assert len(expected) == 102_501
    entries = list_all(client, str(root), depth=2, limit=1000)
    paths = [e["path"] for e in entries]
    assert len(paths) == len(set(paths)), "an entry came back twice"
    assert set(paths) == expected
    assert {"path", "name", "type", "size", "mode", "mtime"} <= set(entries[0])


def test_depth_one_lists_only_children(client, big_tree):
    root, _ = big_tree
    names = [e["name"] for e in list_all(client, str(root), depth=1, limit=7)]
    assert names == sorted(names) and len(names) == 101 and "f0000" not in names


@pytest.mark.parametrize("params", [{"depth": 0}, {"depth": -1}, {"depth": "x"}, {"depth": 65}, {"limit": 0},
                                    {"limit": -5}, {"limit": 10_001}, {"cursor": "garbage!"}])
def test_bad_parameters_are_400(client, ws_dir, params):
    r = client.get("/v1/directories/list", params={"path": str(ws_dir), **params})
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"code", "message"}


def test_cursor_of_another_listing_is_400(client, ws_dir):
    for i in range(3):
        (ws_dir / f"x{i}").touch()
    (ws_dir / "sub").mkdir()
    cursor = client.get("/v1/directories/list", params={"path": str(ws_dir), "limit": 1}).json()["next_cursor"]
    r = client.get("/v1/directories/list", params={"path": str(ws_dir / "sub"), "cursor": cursor})
    assert r.status_code == 400 and r.json()["code"] == "invalid_cursor"


def test_symlink_root_is_400(client, ws_dir):
    (ws_dir / "real").mkdir()
    (ws_dir / "alias").symlink_to(ws_dir / "real")
    r = client.get("/v1/directories/list", params={"path": str(ws_dir / "alias")})
    assert r.status_code == 400 and r.json()["code"] == "symlink_root"


def test_symlinks_inside_are_listed_not_followed(daemon, client, ws_dir):
    (ws_dir / "out").symlink_to(daemon.outside)
    (ws_dir / "loop").symlink_to(ws_dir)
    entries = client.get("/v1/directories/list", params={"path": str(ws_dir), "depth": 5}).json()["entries"]
    assert {(e["name"], e["type"], e["target"]) for e in entries} == {
        ("out", "symlink", str(daemon.outside)), ("loop", "symlink", str(ws_dir))
    }


@pytest.mark.parametrize("raw", ["/etc", "{ws}/..", "{ws}/../../..", "{dir}/out", "{dir}/out/..", "/"])
def test_traversal_is_403(daemon, client, ws_dir, raw):
    (ws_dir / "out").symlink_to(daemon.outside)
    path = raw.format(ws=daemon.workspace, dir=ws_dir)
    r = client.get("/v1/directories/list", params={"path": path})
    assert r.status_code == 403, r.text
    assert r.json()["code"] == "forbidden"
    assert client.post("/v1/directories", json={"path": path + "/new"}).status_code == 403
    assert client.delete("/v1/directories", params={"path": path, "recursive": True}).status_code == 403
    assert os.path.exists(daemon.outside / "secret.txt")


def test_missing_is_404(client, ws_dir):
    r = client.get("/v1/directories/list", params={"path": str(ws_dir / "missing")})
    assert r.status_code == 404 and r.json() == {"code": "not_found", "message": r.json()["message"]}


def test_not_a_directory_is_400(client, ws_dir):
    (ws_dir / "f").touch()
    assert client.get("/v1/directories/list", params={"path": str(ws_dir / "f")}).status_code == 400


def test_create_and_delete(client, ws_dir):
    target = ws_dir / "a" / "b" / "c"
    r = client.post("/v1/directories", json={"path": str(target), "mode": "0700"})
    assert r.status_code == 201 and target.is_dir() and r.json()["type"] == "directory"
    assert client.post("/v1/directories", json={"path": str(target)}).status_code == 201  # idempotent
    (ws_dir / "file").touch()
    assert client.post("/v1/directories", json={"path": str(ws_dir / "file")}).status_code == 409
    (target / "x").touch()
    r = client.delete("/v1/directories", params={"path": str(ws_dir / "a")})
    assert r.status_code == 409 and r.json()["code"] == "not_empty"
    assert client.delete("/v1/directories", params={"path": str(ws_dir / "a"), "recursive": True}).status_code == 204
    assert not (ws_dir / "a").exists()


def test_roots_cannot_be_deleted(daemon, client):
    r = client.delete("/v1/directories", params={"path": str(daemon.scratch), "recursive": True})
    assert r.status_code == 403 and daemon.scratch.exists()


def test_recursive_delete_does_not_follow_links(daemon, client, ws_dir):
    (ws_dir / "d").mkdir()
    (ws_dir / "d" / "out").symlink_to(daemon.outside)
    assert client.delete("/v1/directories", params={"path": str(ws_dir / "d"), "recursive": True}).status_code == 204
    assert (daemon.outside / "secret.txt").exists()
