"""docker tier: the `corral` CLI as a user runs it (the installed console script, a subprocess) against a real
operator container: claim / exec / ls / pools / release, a 200 MB cp round trip (byte-exact, progress bar, constant
memory), `corral shell` driven through tmux (type, see, resize, exit code), and the config file instead of env."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from client_harness import CORRAL, tmux

from corral.client import config as cfg

pytestmark = pytest.mark.docker
BIG = 200 * 1024 * 1024


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


MEASURE = ("import resource, subprocess, sys\n"
           "code = subprocess.run(sys.argv[1:]).returncode\n"
           "print(f'maxrss={resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}', file=sys.stderr)\n"
           "sys.exit(code)\n")


def run_measured(args: list[str], env: dict[str, str], timeout: float = 600) -> tuple[int, str, int]:
    """Run a command; (exit code, stderr, its peak RSS in KiB: the only child of a small wrapper)."""
    proc = subprocess.run([sys.executable, "-c", MEASURE, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)
    err, _, rss = proc.stderr.rpartition("maxrss=")
    return proc.returncode, err, int(rss)


def test_claim_exec_ls_pools_release(local_stack):
    claim = local_stack.corral("claim", "python", "--ttl", "600", "-e", "GREETING=hi")
    assert claim.returncode == 0, claim.stderr
    name = claim.stdout.strip()
    assert name.startswith("c-") and "claim of python" in claim.stderr
    try:
        r = local_stack.corral("exec", name, "--", "sh", "-c", "echo $GREETING-out; echo to-err >&2; exit 7")
        assert (r.returncode, r.stdout, r.stderr) == (7, "hi-out\n", "to-err\n")
        r = local_stack.corral("exec", name, "python3 -c 'print(6*7)' | tr 4 X")  # one argument: a shell line
        assert (r.returncode, r.stdout) == (0, "X2\n")
        listed = json.loads(local_stack.corral("ls", "--json").stdout)
        mine = [c for c in listed if c["name"] == name]
        assert mine and mine[0]["phase"] == "Ready" and mine[0]["pool"] == "python"
        assert name in local_stack.corral("ls").stdout
        pools = {p["name"]: p for p in json.loads(local_stack.corral("pools", "--json").stdout)}
        assert pools["python"]["desired"] == 2 and pools["python"]["allocated"] >= 1
        table = local_stack.corral("pools").stdout
        for word in ("desired", "ready", "idle", "allocated", "python", "shell-noop", "WarmPool", "Pool"):
            assert word in table, table
    finally:
        gone = local_stack.corral("release", name)
    assert gone.returncode == 0 and f"released {name}" in gone.stderr
    again = local_stack.corral("release", name)
    assert again.returncode == 1 and f"no claim named {name}" in again.stderr
    r = local_stack.corral("exec", name, "true")
    assert r.returncode == 1 and f"[404 not_found] no claim named '{name}'" in " ".join(r.stderr.split())


def test_cp_200_mb_round_trip_is_byte_exact_streamed_with_progress(local_stack, tmp_path):
    src, back = tmp_path / "big.bin", tmp_path / "back"
    back.mkdir()
    with open(src, "wb") as f:
        for _ in range(BIG // (1 << 20)):
            f.write(os.urandom(1 << 20))
    name = local_stack.corral("claim", "python", "--ttl", "900").stdout.strip()
    env = local_stack.env(COLUMNS="120")
    try:
        code, err, up_rss = run_measured([CORRAL, "cp", str(src), f"{name}:/workspace/"], env)
        assert code == 0, err
        # The progress bar (rich's final render without a tty): bytes done / total.
        assert "big.bin" in err and "209.7/209.7 MB" in err, err
        assert f"copied {BIG} bytes" in err
        remote = local_stack.corral("exec", name, "--", "sha256sum", "/workspace/big.bin")
        assert remote.stdout.split()[0] == sha256(src)
        code, err, down_rss = run_measured([CORRAL, "cp", f"{name}:/workspace/big.bin", str(back)], env)
        assert code == 0, err
        assert "209.7/209.7 MB" in err, err
        assert sha256(back / "big.bin") == sha256(src)
        assert not list(back.glob(".*corral-part"))  # written beside, then renamed
        # Streamed in 1 MiB chunks: the CLI's peak RSS stays far below the file's 200 MiB.
        print(f"\ncp 200 MiB: peak RSS up {up_rss // 1024} MiB, down {down_rss // 1024} MiB")
        assert 0 < up_rss < 120 * 1024 and 0 < down_rss < 120 * 1024, (up_rss, down_rss)
        missing = local_stack.corral("cp", f"{name}:/workspace/nope", str(back))
        assert missing.returncode == 1 and "No such file or directory" in missing.stderr
    finally:
        local_stack.corral("release", name)


def _pane(tm: str, sock: str, target: str) -> str:
    return subprocess.run([tm, "-L", sock, "capture-pane", "-p", "-J", "-t", target], capture_output=True,
                          text=True).stdout


def _wait_pane(tm: str, sock: str, target: str, text: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        pane = _pane(tm, sock, target)
        if text in pane:
            return pane
        assert time.monotonic() < deadline, f"{text!r} not on the screen:\n{pane}"
        time.sleep(0.2)


def test_shell_through_tmux_types_sees_resizes_and_exits_with_the_code(local_stack, tmp_path):
    tm = tmux()
    name = local_stack.corral("claim", "shell", "--ttl", "600").stdout.strip()
    assert name
    sock, exit_file = f"corral-test-{os.getpid()}", tmp_path / "exit"
    env = local_stack.env()
    # The shell runs in tmux's own terminal; its exit code is written where the test can read it.
    cmd = f"{CORRAL} shell {name}; echo $? > {exit_file}"
    started = subprocess.run([tm, "-L", sock, "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", "80", "-y",
                              "24", "sh", "-c", cmd], env=env, capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    keys = lambda *k: subprocess.run([tm, "-L", sock, "send-keys", "-t", "t", *k], check=True)  # noqa: E731
    try:
        _wait_pane(tm, sock, "t", "$")  # the prompt of the sandbox's login shell
        keys("echo hi-$((40+2))", "Enter")
        _wait_pane(tm, sock, "t", "hi-42")
        keys("stty size", "Enter")
        _wait_pane(tm, sock, "t", "24 80")
        subprocess.run([tm, "-L", sock, "resize-window", "-t", "t", "-x", "132", "-y", "43"], check=True)
        time.sleep(0.5)  # SIGWINCH reaches corral, which sends the resize frame
        keys("clear; stty size", "Enter")
        _wait_pane(tm, sock, "t", "43 132")
        keys("exit 7", "Enter")
        deadline = time.monotonic() + 60
        while not exit_file.exists() or not exit_file.read_text().strip():
            assert time.monotonic() < deadline, _pane(tm, sock, "t")
            time.sleep(0.2)
        assert exit_file.read_text().strip() == "7"
    finally:
        subprocess.run([tm, "-L", sock, "kill-server"], capture_output=True)
        local_stack.corral("release", name)


def test_config_file_is_used_without_env(local_stack, tmp_path):
    path = cfg.write_file(local_stack.url, local_stack.token, tmp_path / "config.toml")
    env = {k: v for k, v in os.environ.items() if k not in ("CORRAL_API_URL", "CORRAL_API_TOKEN")}
    env["CORRAL_CONFIG"] = str(path)
    r = subprocess.run([CORRAL, "pools", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {p["name"] for p in json.loads(r.stdout)} == {"python", "shell", "shell-noop"}
    env["CORRAL_API_TOKEN"] = "wrong"  # the environment wins over the file
    r = subprocess.run([CORRAL, "pools"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "missing or wrong bearer token" in r.stderr
