"""Path confinement without a check-then-use gap: directories and files are swapped for symlinks to outside the roots
in a tight loop while every file operation runs many times; nothing outside is read, created, changed or deleted."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.execd
ROUNDS = 150
INSIDE = b"inside"
SECRET = b"OUTSIDE-SECRET-CONTENT"  # a different size from INSIDE, so even an info answer would give it away
MARKER = "outside-only-marker"


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under (and including) `root`: type, mode, size, content hash, mtime and link target."""
    out = {}
    for path in [root, *sorted(root.rglob("*"))]:
        st = path.lstat()
        data = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() and not path.is_symlink() else None
        link = os.readlink(path) if path.is_symlink() else None
        out[str(path.relative_to(root))] = (st.st_mode, st.st_size, data, st.st_mtime_ns, link)
    return out


class Swapper(threading.Thread):
    """Alternate `swap` between the real directory and a symlink to `outside`, and `flip` between a regular file
    and a symlink to the outside secret, as fast as it can."""

    def __init__(self, base: Path, outside: Path) -> None:
        super().__init__(daemon=True)
        self.base, self.outside = base, outside
        self.stop = threading.Event()
        self.swaps = 0

    def run(self) -> None:
        swap, aside = self.base / "swap", self.base / "swap.real"
        flip, tmp = self.base / "flip", self.base / "flip.tmp"
        while not self.stop.is_set():
            try:
                os.rename(swap, aside)
                os.symlink(self.outside, swap)
                os.symlink(self.outside / "victim.txt", tmp)
                os.rename(tmp, flip)
                os.unlink(swap)
                os.rename(aside, swap)
                tmp.write_bytes(INSIDE)
                os.rename(tmp, flip)
                self.swaps += 1
            except OSError:
                continue

    def finish(self) -> None:
        self.stop.set()
        self.join(timeout=30)
        swap, aside = self.base / "swap", self.base / "swap.real"
        if swap.is_symlink():
            swap.unlink()
        if aside.exists() and not swap.exists():
            aside.rename(swap)


def operations(d: str) -> list[tuple[str, str, dict]]:
    """One round: every file and directory operation, aimed through the swapped directory or at the flipped file."""
    s = f"{d}/swap"
    return [
        ("GET", "/v1/files/download", {"params": {"path": f"{s}/victim.txt"}}),
        ("GET", "/v1/files/download", {"params": {"path": f"{d}/flip"}}),
        ("GET", "/v1/files/info", {"params": {"path": f"{s}/victim.txt"}}),
        ("GET", "/v1/files/info", {"params": {"path": f"{d}/flip"}}),
        ("POST", "/v1/files/upload", {"params": {"path": f"{s}/new.txt", "mkdir": "false"}, "content": b"new"}),
        ("POST", "/v1/files/upload", {"params": {"path": f"{s}/victim.txt", "mkdir": "false"}, "content": INSIDE}),
        ("POST", "/v1/files/permissions", {"json": {"path": f"{s}/victim.txt", "mode": "0600"}}),
        ("POST", "/v1/files/permissions", {"json": {"path": f"{d}/flip", "mode": "0600"}}),
        ("POST", "/v1/files/replace", {"json": {"path": f"{s}/victim.txt", "old": "i", "new": "i"}}),
        ("POST", "/v1/files/replace", {"json": {"path": f"{d}/flip", "old": "i", "new": "i"}}),
        ("POST", "/v1/files/mv", {"json": {"source": f"{s}/new.txt", "destination": f"{s}/moved.txt",
                                           "overwrite": True}}),
        ("DELETE", "/v1/files", {"params": {"path": f"{s}/moved.txt"}}),
        ("DELETE", "/v1/files", {"params": {"path": f"{s}/victim.txt"}}),
        ("POST", "/v1/directories", {"json": {"path": f"{s}/newdir", "parents": False}}),
        ("POST", "/v1/files/upload", {"params": {"path": f"{s}/newdir/f", "mkdir": "false"}, "content": b"f"}),
        ("DELETE", "/v1/directories", {"params": {"path": f"{s}/newdir", "recursive": True}}),
        ("DELETE", "/v1/directories", {"params": {"path": f"{s}/sub", "recursive": True}}),
        ("GET", "/v1/directories/list", {"params": {"path": s, "depth": 3}}),
        ("GET", "/v1/files/search", {"params": {"path": s, "pattern": "**"}}),
    ]


def restore(real: int) -> None:
    """Put back what the previous round deleted, through an fd of the real directory (a path could be swapped)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    try:
        os.mkdir("sub", dir_fd=real)
    except FileExistsError:
        pass
    sub = os.open("sub", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=real)
    try:
        for name, where in (("victim.txt", real), ("inner.txt", sub)):
            fd = os.open(name, flags, 0o644, dir_fd=where)
            os.write(fd, INSIDE)
            os.close(fd)
    finally:
        os.close(sub)


def leaked(method: str, url: str, response) -> str | None:
    """What an answer would show if it had read outside the roots."""
    if response.status_code != 200:
        return None
    if url.endswith("/download") and response.content == SECRET:
        return "download read the outside secret"
    if url.endswith("/info") and response.json()["size"] == len(SECRET):
        return "info described the outside secret"
    if url.endswith("/list") or url.endswith("/search"):
        body = response.json()
        names = {e["name"] for e in body.get("entries", body.get("matches", []))}
        if MARKER in names:
            return f"{url} listed the outside directory"
    return None


def test_symlink_swaps_never_reach_outside(daemon, client, ws_dir):
    outside = daemon.outside / "race"
    (outside / "sub").mkdir(parents=True)
    (outside / "victim.txt").write_bytes(SECRET)
    (outside / "victim.txt").chmod(0o640)
    (outside / "sub" / "inner.txt").write_bytes(SECRET)
    (outside / MARKER).write_bytes(SECRET)
    before = snapshot(daemon.outside)
    (ws_dir / "swap").mkdir()
    (ws_dir / "flip").write_bytes(INSIDE)
    real = os.open(ws_dir / "swap", os.O_RDONLY | os.O_DIRECTORY)  # the real directory, whatever it is called
    swapper = Swapper(ws_dir, outside)
    swapper.start()
    leaks, broken, statuses = [], [], set()
    try:
        for _ in range(ROUNDS):
            restore(real)
            for method, url, kw in operations(str(ws_dir)):
                try:
                    r = client.request(method, url, **kw)
                except httpx.HTTPError as exc:  # e.g. a download cut short: the file changed under the daemon
                    broken.append(f"{url}: {exc}")
                    continue
                statuses.add(r.status_code)
                if (what := leaked(method, url, r)) is not None:
                    leaks.append(what)
    finally:
        swapper.finish()
        os.close(real)
    assert swapper.swaps > ROUNDS  # the race really ran alongside
    assert not leaks, sorted(set(leaks))
    assert not broken, broken[:3]
    assert snapshot(daemon.outside) == before, "something outside the roots was created, changed or deleted"
    assert max(statuses) < 500, statuses
    assert 200 in statuses  # operations also succeeded in between swaps
