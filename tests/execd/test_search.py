"""files/search: the glob matcher's syntax, its linear cost (a pathological pattern never stalls the daemon), and
the time budget on the whole walk."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
from execdutil import launch, stop

from corral.execd import fsops
from corral.execd.globmatch import Glob, GlobError

pytestmark = pytest.mark.execd
HEALTH_WITHIN = 0.100  # the issue's own bound: health answers within 100 ms while a pathological search runs


@pytest.mark.parametrize("pattern,text,matches", [
    ("*.py", "a.py", True), ("*.py", "a.pyc", False), ("*.py", "src/a.py", False), ("a?c", "abc", True),
    ("a?c", "a/c", False), ("[abc]x", "bx", True), ("[!abc]x", "bx", False), ("[^abc]x", "dx", True),
    ("[a-c]", "b", True), ("[a-c]", "/", False), ("[!a]", "/", False), ("[]]", "]", True), ("[!]]", "a", True),
    ("[abc", "[abc", True), ("a\\b", "a\\b", True), ("src/**/*.py", "src/c.py", True),
    ("src/**/*.py", "src/deep/er/d.py", True), ("src/**/*.py", "srcx/d.py", False), ("**", "a/b/c", True),
    ("**/x", "x", True), ("**/x", "a/b/x", True), ("**/x", "a/bx", False), ("a/**", "a/b/c", True),
    ("*", "", True), ("?", "", False), ("a*b*c", "aXbYc", True), ("a*b*c", "aXbY", False), ("é*", "été", True),
])
def test_glob_syntax(pattern, text, matches):
    assert Glob(pattern).match(text) is matches


@pytest.mark.parametrize("pattern", ["[z-a]", "", "a\x00", "x" * 5000])
def test_bad_globs_are_refused(pattern):
    with pytest.raises(GlobError):
        Glob(pattern)


def test_match_cost_is_linear():
    """`*a*a...*b` against 40 `a`s takes minutes as a backtracking regex; here it is len(text) x len(pattern) steps.
    Counted, not timed: every step goes through `_closure`, called once per character."""
    glob = Glob("*a" * 25 + "b")
    calls = 0
    original = glob._closure

    def counting(states):
        nonlocal calls
        calls += 1
        return original(states)

    glob._closure = counting  # type: ignore[method-assign]
    assert glob.match("a" * 40) is False
    assert calls == 41  # the start, then one per character: the states are a set, never a backtracking tree
    assert Glob("*a" * 25 + "b").match("a" * 40 + "b")


def test_pathological_search_leaves_health_answering(daemon, ws_dir):
    """Hundreds of 40-character names against 25 stars: the search must answer (no match) and health must answer
    within 100 ms for as long as the search runs, measured against the real daemon on loopback."""
    for i in range(2000):
        (ws_dir / ("a" * 36 + f"{i:04d}")).touch()
    pattern = "*a" * 25 + "b"
    result: dict = {}

    def run_search() -> None:
        with daemon.client(timeout=600) as c:
            result["response"] = c.get("/v1/files/search", params={"path": str(ws_dir), "pattern": pattern})

    searcher = threading.Thread(target=run_search, daemon=True)
    latencies = []
    with httpx.Client(base_url=daemon.url, timeout=5) as probe:
        probe.get("/v1/health")  # connection made before measuring
        searcher.start()
        while searcher.is_alive():
            t0 = time.perf_counter()
            assert probe.get("/v1/health").status_code == 200
            latencies.append(time.perf_counter() - t0)
            if latencies[-1] > HEALTH_WITHIN:
                break
            time.sleep(0.02)
    assert latencies and max(latencies) < HEALTH_WITHIN, f"health took {max(latencies):.3f}s during the search"
    searcher.join(timeout=600)
    r = result["response"]
    assert r.status_code == 200, r.text
    assert r.json() == {"matches": [], "truncated": False, "timed_out": False}


def test_walk_stops_at_the_time_budget(tmp_path):
    """A fake clock that advances one second per reading: a 3-second budget lets the walk see a few entries, then it
    answers what it found and says it stopped."""
    for i in range(20):
        (tmp_path / f"f{i:02d}.txt").touch()
    ticks = iter(range(10_000))
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        out = fsops.search(fd, str(tmp_path), "*.txt", 1000, 3.0, clock=lambda: float(next(ticks)))
    finally:
        os.close(fd)
    assert out.timed_out and out.truncated
    assert [m.name for m in out.matches] == ["f00.txt", "f01.txt", "f02.txt"]


@pytest.fixture(scope="module")
def hurried(tmp_path_factory):
    """A daemon whose search budget is one nanosecond: every walk runs out of time at its first entry."""
    d = launch(tmp_path_factory.mktemp("execd-hurried"), search_budget_seconds=1e-9)
    yield d
    stop(d)


def test_timed_out_search_answers_and_says_so(hurried):
    (hurried.workspace / "x.txt").touch()
    with hurried.client() as c:
        r = c.get("/v1/files/search", params={"path": str(hurried.workspace), "pattern": "*"})
    assert r.status_code == 200
    assert r.json() == {"matches": [], "truncated": True, "timed_out": True}
