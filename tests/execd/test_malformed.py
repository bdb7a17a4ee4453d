"""Malformed input is a 4xx in the error shape, never a 500: one row per input that used to crash a handler."""

from __future__ import annotations

import errno
import json

import pytest

from corral.execd.errors import os_error

pytestmark = pytest.mark.execd
LONG_NAME = "n" * 300  # NAME_MAX is 255


def body(obj: dict) -> dict:
    """A JSON body as raw bytes: json.dumps escapes lone surrogates (`\\ud800`), which JSON allows."""
    return {"content": json.dumps(obj).encode(), "headers": {"content-type": "application/json"}}


# (id, method, url, request kwargs with {dir} for the test's directory, expected status)
CASES = [
    ("command-nul", "POST", "/v1/command", body({"command": "echo a\x00b"}), 400),
    ("argv-nul", "POST", "/v1/command", body({"argv": ["echo", "a\x00b"]}), 400),
    ("env-name-nul", "POST", "/v1/command", body({"command": "true", "env": {"A\x00": "x"}}), 400),
    ("env-name-equals", "POST", "/v1/command", body({"command": "true", "env": {"A=B": "x"}}), 400),
    ("env-name-empty", "POST", "/v1/command", body({"command": "true", "env": {"": "x"}}), 400),
    ("env-value-nul", "POST", "/v1/command", body({"command": "true", "env": {"A": "x\x00"}}), 400),
    ("cwd-nul", "POST", "/v1/command", body({"command": "true", "cwd": "/tmp\x00x"}), 400),
    ("user-nul", "POST", "/v1/command", body({"command": "true", "user": "ro\x00ot"}), 400),
    ("user-superscript-digit", "POST", "/v1/command", body({"command": "true", "user": "\u00b2"}), 400),
    ("user-arabic-digits", "POST", "/v1/command", body({"command": "true", "user": "\u0661\u0662\u0663"}), 400),
    ("user-uid-out-of-range", "POST", "/v1/command", body({"command": "true", "user": "99999999999999"}), 400),
    ("user-over-long", "POST", "/v1/command", body({"command": "true", "user": "u" * 5000}), 400),
    ("command-surrogate", "POST", "/v1/command", body({"command": "echo \ud800"}), 400),
    ("huge-argv", "POST", "/v1/command", body({"argv": ["echo", "x" * 200_000]}), 400),
    ("timeout-too-far", "POST", "/v1/command", body({"command": "true", "timeout": 1e300}), 400),
    ("stream-argv-nul", "POST", "/v1/command/stream", body({"argv": ["a\x00"]}), 400),
    ("pty-command-nul", "POST", "/v1/pty", body({"command": "sh\x00"}), 400),
    ("pty-env-surrogate", "POST", "/v1/pty", body({"env": {"A": "\udc80\ud800"}}), 400),
    ("set-env-nul", "PUT", "/v1/env", body({"env": {"A": "\x00"}}), 400),
    ("chmod-uid-huge", "POST", "/v1/files/permissions", body({"path": "{dir}/f", "mode": "0644", "uid": 2**40}), 400),
    ("chmod-gid-negative", "POST", "/v1/files/permissions", body({"path": "{dir}/f", "mode": "0644", "gid": -5}), 400),
    ("chmod-mode-digits", "POST", "/v1/files/permissions",
     body({"path": "{dir}/f", "mode": "\u0667\u0665\u0665"}), 400),
    ("info-long-name", "GET", "/v1/files/info", {"params": {"path": f"{{dir}}/{LONG_NAME}"}}, 400),
    ("upload-long-name", "POST", "/v1/files/upload",
     {"params": {"path": f"{{dir}}/{LONG_NAME}"}, "content": b"x"}, 400),
    ("mkdir-long-name", "POST", "/v1/directories", body({"path": f"{{dir}}/{LONG_NAME}/x"}), 400),
    ("path-too-long", "GET", "/v1/files/info", {"params": {"path": "{dir}/" + "a/" * 3000}}, 400),
    ("path-control-char", "GET", "/v1/files/info", {"params": {"path": "{dir}/a\x01b"}}, 400),
    ("path-newline", "POST", "/v1/files/upload", {"params": {"path": "{dir}/a\nb"}, "content": b"x"}, 400),
    ("list-control-char", "GET", "/v1/directories/list", {"params": {"path": "{dir}/\x1b[31m"}}, 400),
    ("mv-surrogate", "POST", "/v1/files/mv", body({"source": "{dir}/f", "destination": "{dir}/\ud800"}), 400),
    ("glob-reversed-range", "GET", "/v1/files/search", {"params": {"path": "{dir}", "pattern": "[z-a]"}}, 400),
    ("glob-nul", "GET", "/v1/files/search", {"params": {"path": "{dir}", "pattern": "a\x00"}}, 400),
    ("glob-over-long", "GET", "/v1/files/search", {"params": {"path": "{dir}", "pattern": "*" * 5000}}, 400),
    ("search-not-a-directory", "GET", "/v1/files/search", {"params": {"path": "{dir}/f", "pattern": "*"}}, 400),
    ("download-directory", "GET", "/v1/files/download", {"params": {"path": "{dir}"}}, 400),
    ("proxy-port-out-of-range", "GET", "/v1/proxy/99999999999999999999/x", {}, 400),
]


def fill(value, directory: str):
    if isinstance(value, str):
        return value.replace("{dir}", directory)
    if isinstance(value, bytes):
        return value.replace(b"{dir}", directory.encode())
    if isinstance(value, dict):
        return {k: fill(v, directory) for k, v in value.items()}
    return value


@pytest.mark.parametrize("method,url,kwargs,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_input_is_4xx(client, ws_dir, method, url, kwargs, expected):
    (ws_dir / "f").write_text("f")
    r = client.request(method, url, **fill(kwargs, str(ws_dir)))
    assert r.status_code == expected, r.text
    assert set(r.json()) == {"code", "message"}


@pytest.mark.parametrize("sig", ["\u00b2", "\u0661", "99999", "0", "-9", "SIGNOPE", "9" * 30])
def test_bad_signals_are_400(client, sig):
    cid = client.post("/v1/command", json={"command": "sleep 30", "background": True}).json()["id"]
    try:
        r = client.delete(f"/v1/command/{cid}", params={"signal": sig})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "invalid_signal"
        assert client.get(f"/v1/command/{cid}").json()["running"]
    finally:
        client.delete(f"/v1/command/{cid}", params={"signal": "KILL"})


@pytest.mark.parametrize("code,status", [
    (errno.ENOENT, 404), (errno.EACCES, 403), (errno.EPERM, 403), (errno.EEXIST, 409), (errno.ENOTDIR, 400),
    (errno.EISDIR, 400), (errno.ELOOP, 400), (errno.ENAMETOOLONG, 400), (errno.ENOSPC, 507), (errno.EROFS, 403),
    (errno.E2BIG, 400), (errno.EINVAL, 400), (errno.EXDEV, 400), (errno.ENOTEMPTY, 409), (errno.EOVERFLOW, 400),
])
def test_os_errors_map_to_the_error_shape(code, status):
    """One table maps every OSError; an errno it does not name is a 400, not a 500."""
    err = os_error(OSError(code, "boom"), "/x")
    assert (err.status, bool(err.code), err.message) == (status, True, "boom: /x")
