"""Files: byte-exact round trips at many sizes, bounded daemon memory for 200 MB, atomic concurrent writes, ops."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.execd
MB = 1 << 20
RSS_GROWTH_LIMIT = 32 * MB  # measured: ~4 MiB; the bench reports the figure, the test enforces this bound


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def pattern(size: int, seed: int = 0) -> Iterator[bytes]:
    """Deterministic, non-repeating-looking bytes, generated chunk by chunk (never the whole file in memory)."""
    block = hashlib.sha256(str(seed).encode()).digest() * 2048  # 64 KiB
    sent = 0
    i = 0
    while sent < size:
        chunk = bytes(b ^ (i & 0xFF) for b in block[:32]) + block[32 : min(len(block), size - sent)]
        chunk = chunk[: size - sent]
        sent += len(chunk)
        i += 1
        yield chunk


def digest(chunks: Iterator[bytes]) -> str:
    h = hashlib.sha256()
    for c in chunks:
        h.update(c)
    return h.hexdigest()


@pytest.mark.parametrize("size", [0, 1, 18 * 1024, 64 * 1024 - 1, 64 * 1024, 64 * 1024 + 1, MB, 200 * MB])
def test_round_trip_byte_exact(client, ws_dir, size):
    path = str(ws_dir / f"f{size}.bin")
    r = client.post("/v1/files/upload", params={"path": path}, content=pattern(size, size))
    assert r.status_code == 200, r.text
    assert r.json()["size"] == size and r.json()["type"] == "file"
    assert os.path.getsize(path) == size
    with client.stream("GET", "/v1/files/download", params={"path": path}) as resp:
        assert resp.status_code == 200
        assert int(resp.headers["content-length"]) == size
        assert digest(resp.iter_bytes()) == digest(pattern(size, size))
    assert not [p for p in os.listdir(ws_dir) if p.endswith(".execd-tmp")]


def test_200mb_peak_rss_growth_is_bounded(daemon, client, ws_dir):
    """Sample the daemon's RSS while 200 MB go up and come back down; the growth stays far below the file size."""
    size = 200 * MB
    path = str(ws_dir / "big.bin")
    peak = base = rss(daemon.proc.pid)
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.01):
            peak = max(peak, rss(daemon.proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        assert client.post("/v1/files/upload", params={"path": path}, content=pattern(size)).status_code == 200
        with client.stream("GET", "/v1/files/download", params={"path": path}) as resp:
            assert digest(resp.iter_bytes()) == digest(pattern(size))
    finally:
        stop.set()
        sampler.join()
    growth = peak - base
    print(f"\nexecd RSS: base {base / MB:.1f} MiB, peak {peak / MB:.1f} MiB, growth {growth / MB:.1f} MiB for 200 MiB")
    assert growth < RSS_GROWTH_LIMIT


def test_concurrent_writers_never_tear(daemon, ws_dir):
    """Eight writers race to replace one 4 MiB file while a reader keeps reading it: every read is one whole version."""
    path = str(ws_dir / "contended.bin")
    size = 4 * MB
    versions = {bytes([i]) * size for i in range(8)}
    hashes = {hashlib.sha256(v).hexdigest() for v in versions}
    errors: list[str] = []

    def writer(i: int) -> None:
        with daemon.client() as c:
            for _ in range(4):
                r = c.post("/v1/files/upload", params={"path": path}, content=bytes([i]) * size)
                if r.status_code != 200:
                    errors.append(r.text)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    seen = 0
    while any(t.is_alive() for t in threads):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        assert hashlib.sha256(data).hexdigest() in hashes, "a reader saw a torn file"
        seen += 1
    for t in threads:
        t.join()
    assert not errors
    with open(path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() in hashes
    assert not [p for p in os.listdir(ws_dir) if p.endswith(".execd-tmp")]


def test_upload_mode_and_mkdir(client, ws_dir):
    path = ws_dir / "deep" / "er" / "x.sh"
    r = client.post("/v1/files/upload", params={"path": str(path), "mode": "0755"}, content=b"#!/bin/sh\n")
    assert r.json()["mode"] == "0755" and path.read_bytes() == b"#!/bin/sh\n"
    r = client.post("/v1/files/upload", params={"path": str(ws_dir / "no" / "x"), "mkdir": "false"}, content=b"x")
    assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_download_range(client, ws_dir):
    (ws_dir / "r.txt").write_bytes(b"0123456789")
    r = client.get("/v1/files/download", params={"path": str(ws_dir / "r.txt")}, headers={"Range": "bytes=2-5"})
    assert r.status_code == 206 and r.content == b"2345"


def test_download_range_forms(client, ws_dir):
    """Downloads stream the fd execd opened (not the path again): suffix and open ranges, one unsatisfiable range
    (416 in the error shape), several ranges (served whole: a server may ignore them), an empty file."""
    (ws_dir / "r.txt").write_bytes(b"0123456789")
    get = lambda rng: client.get("/v1/files/download", params={"path": str(ws_dir / "r.txt")},  # noqa: E731
                                 headers={"Range": rng})
    r = get("bytes=-3")
    assert (r.status_code, r.content, r.headers["content-range"]) == (206, b"789", "bytes 7-9/10")
    assert (get("bytes=8-").status_code, get("bytes=8-").content) == (206, b"89")
    r = get("bytes=20-")
    assert (r.status_code, r.json()["code"], r.headers["content-range"]) == (416, "range_not_satisfiable", "bytes */10")
    assert (get("bytes=0-1,3-4").status_code, get("bytes=0-1,3-4").content) == (200, b"0123456789")
    (ws_dir / "empty").touch()
    r = client.get("/v1/files/download", params={"path": str(ws_dir / "empty")})
    assert (r.status_code, r.content, r.headers["content-length"]) == (200, b"", "0")


def test_info_move_chmod_delete(client, ws_dir):
    src, dst = ws_dir / "a.txt", ws_dir / "b.txt"
    src.write_text("hello")
    info = client.get("/v1/files/info", params={"path": str(src)}).json()
    assert (info["name"], info["type"], info["size"]) == ("a.txt", "file", 5)
    assert set(info) >= {"path", "name", "type", "size", "mode", "mtime"}
    r = client.post("/v1/files/mv", json={"source": str(src), "destination": str(dst)})
    assert r.status_code == 200 and dst.read_text() == "hello" and not src.exists()
    src.write_text("again")
    r = client.post("/v1/files/mv", json={"source": str(src), "destination": str(dst)})
    assert r.status_code == 409 and r.json()["code"] == "exists"
    assert client.post("/v1/files/mv",
                       json={"source": str(src), "destination": str(dst), "overwrite": True}).status_code == 200
    assert dst.read_text() == "again"
    r = client.post("/v1/files/permissions", json={"path": str(dst), "mode": "0600"})
    assert r.json()["mode"] == "0600" and (os.stat(dst).st_mode & 0o777) == 0o600
    assert client.post("/v1/files/permissions", json={"path": str(dst), "mode": "9z"}).status_code == 400
    assert client.delete("/v1/files", params={"path": str(dst)}).status_code == 204
    assert not dst.exists()
    r = client.delete("/v1/files", params={"path": str(dst)})
    assert r.status_code == 404 and set(r.json()) == {"code", "message"}
    assert client.delete("/v1/files", params={"path": str(ws_dir)}).status_code == 400


def test_move_across_roots(daemon, client, ws_dir):
    (ws_dir / "m.txt").write_text("m")
    dst = daemon.scratch / "m.txt"
    assert client.post("/v1/files/mv",
                       json={"source": str(ws_dir / "m.txt"), "destination": str(dst)}).status_code == 200
    assert dst.read_text() == "m"


def test_delete_symlink_removes_the_link_only(daemon, client, ws_dir):
    link = ws_dir / "out-link"
    link.symlink_to(daemon.outside / "secret.txt")
    assert client.delete("/v1/files", params={"path": str(link)}).status_code == 204
    assert not link.is_symlink() and (daemon.outside / "secret.txt").exists()


def test_search_glob_and_limit(client, ws_dir):
    for rel in ["a.py", "b.txt", "src/c.py", "src/deep/d.py", "src/deep/e.md"]:
        (ws_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws_dir / rel).write_text("x")
    names = lambda r: sorted(m["name"] for m in r.json()["matches"])  # noqa: E731
    r = client.get("/v1/files/search", params={"path": str(ws_dir), "pattern": "*.py"})
    assert names(r) == ["a.py", "c.py", "d.py"] and not r.json()["truncated"]
    r = client.get("/v1/files/search", params={"path": str(ws_dir), "pattern": "src/**/*.py"})
    assert names(r) == ["c.py", "d.py"]
    r = client.get("/v1/files/search", params={"path": str(ws_dir), "pattern": "*", "limit": 2})
    assert len(r.json()["matches"]) == 2 and r.json()["truncated"]
    assert client.get("/v1/files/search", params={"path": str(ws_dir), "pattern": "*", "limit": 0}).status_code == 400


def test_replace_in_file(client, ws_dir):
    f = ws_dir / "r.txt"
    f.write_text("foo bar foo baz foo")
    os.chmod(f, 0o640)
    r = client.post("/v1/files/replace", json={"path": str(f), "old": "foo", "new": "qux", "count": 2})
    assert r.json()["replacements"] == 2 and f.read_text() == "qux bar qux baz foo"
    assert (os.stat(f).st_mode & 0o777) == 0o640
    r = client.post("/v1/files/replace", json={"path": str(f), "old": "nope", "new": "x"})
    assert r.json()["replacements"] == 0
    assert client.post("/v1/files/replace",
                       json={"path": str(ws_dir / "missing"), "old": "a", "new": "b"}).status_code == 404


@pytest.mark.parametrize(
    "params",
    [
        {"path": "/etc/passwd"},
        {"path": "../../../../../../etc/passwd"},
        {"path": "{ws}/../outside/secret.txt"},
        {"path": "{dir}/link-out"},
    ],
)
def test_paths_outside_roots_are_403(daemon, client, ws_dir, params):
    link = ws_dir / "link-out"
    link.symlink_to(daemon.outside / "secret.txt")
    path = params["path"].format(ws=daemon.workspace, dir=ws_dir)
    for method, url, kw in [
        ("GET", "/v1/files/info", {"params": {"path": path}}),
        ("GET", "/v1/files/download", {"params": {"path": path}}),
        ("POST", "/v1/files/replace", {"json": {"path": path, "old": "a", "new": "b"}}),
        ("POST", "/v1/files/permissions", {"json": {"path": path, "mode": "0777"}}),
    ]:
        r = client.request(method, url, **kw)
        assert r.status_code == 403, (url, r.text)
        assert set(r.json()) == {"code", "message"} and r.json()["code"] == "forbidden"
    r = client.post("/v1/files/upload", params={"path": str(daemon.outside / "new.txt")}, content=b"x")
    assert r.status_code == 403 and not (daemon.outside / "new.txt").exists()
    assert (daemon.outside / "secret.txt").read_text() == "not for you"


def test_missing_file_is_404(client, ws_dir):
    for url in ("/v1/files/info", "/v1/files/download"):
        r = client.get(url, params={"path": str(ws_dir / "nope")})
        assert r.status_code == 404 and r.json()["code"] == "not_found"


def test_upload_interrupted_leaves_no_file(daemon, ws_dir):
    path = ws_dir / "partial.bin"

    def body() -> Iterator[bytes]:
        yield b"x" * MB
        raise RuntimeError("client gave up")

    with daemon.client() as c, pytest.raises(RuntimeError):
        c.post("/v1/files/upload", params={"path": str(path)}, content=body())
    import time

    deadline = time.monotonic() + 30  # the server notices the disconnect on its next read: slow on a loaded machine
    while [p for p in os.listdir(ws_dir) if p.endswith(".execd-tmp")] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not path.exists()
    assert not [p for p in os.listdir(ws_dir) if p.endswith(".execd-tmp")]


@pytest.fixture(scope="module")
def two_filesystems(tmp_path_factory):
    """A daemon whose second root is on another filesystem (/dev/shm is a tmpfs): moves between roots copy."""
    import shutil
    import tempfile

    from execdutil import launch, stop

    shm = Path(tempfile.mkdtemp(dir="/dev/shm")) / "scratch"
    base = tmp_path_factory.mktemp("execd-xdev")
    assert os.stat(base).st_dev != os.stat(shm.parent).st_dev
    d = launch(base, scratch=shm)
    yield d
    stop(d)
    shutil.rmtree(shm.parent)


def test_move_to_another_filesystem_copies_links_as_links(two_filesystems):
    d = two_filesystems
    tree = d.workspace / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "x.sh").write_text("#!/bin/sh\n")
    (tree / "sub" / "x.sh").chmod(0o750)
    (tree / "out").symlink_to(d.outside / "secret.txt")
    (d.workspace / "f.txt").write_text("f")
    with d.client() as c:
        r = c.post("/v1/files/mv", json={"source": str(d.workspace / "f.txt"), "destination": str(d.scratch / "f.txt")})
        assert r.status_code == 200 and (d.scratch / "f.txt").read_text() == "f"
        assert not (d.workspace / "f.txt").exists()
        r = c.post("/v1/files/mv", json={"source": str(tree), "destination": str(d.scratch / "tree")})
        assert r.status_code == 200, r.text
        (d.workspace / "f.txt").write_text("again")
        r = c.post("/v1/files/mv", json={"source": str(d.workspace / "f.txt"), "destination": str(d.scratch / "f.txt")})
        assert r.status_code == 409
    moved = d.scratch / "tree"
    assert not tree.exists()
    assert (moved / "sub" / "x.sh").read_text() == "#!/bin/sh\n" \
        and (moved / "sub" / "x.sh").stat().st_mode & 0o777 == 0o750
    assert os.readlink(moved / "out") == str(d.outside / "secret.txt")  # the link itself, not the secret's bytes
    assert not [p for p in os.listdir(d.scratch) if p.endswith(".execd-tmp")]
