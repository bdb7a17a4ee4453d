"""kube tier: the claims API of the Kubernetes operator process facing hostile callers (issue 15). The operator is
the tier's real process (kopf, the control plane, the API in kopf's loop), not the unit tests' bare app: an
unauthenticated 200 MB POST streamed in chunks gets 401 and leaves the process's peak RSS (VmHWM) flat; an
authenticated 2 MiB JSON body gets 413 `too_large` in the `{code, message}` shape, whether its size is declared
(Content-Length) or only seen as it streams (chunked). Raw sockets, read while writing: the server answers before the
body is read and closes, which an HTTP client still writing the body would report as a write error."""

from __future__ import annotations

import json

import httpx
import pytest
from hostile_http import peak_rss, post

pytestmark = pytest.mark.kube

MiB = 1 << 20


def error_body(body: bytes, code: str) -> dict:
    doc = json.loads(body)
    assert set(doc) == {"code", "message"} and doc["code"] == code and doc["message"], doc
    return doc


def test_unauthenticated_200_mb_stream_gets_401_and_the_operator_stays_flat(operator):
    pid = operator.proc.pid
    before = peak_rss(pid)
    size, chunk = 200 * MiB, b"x" * MiB
    status, body, sent = post(f"{operator.api_url}/v1/claims", {"Content-Type": "application/json"},
                              (chunk for _ in range(size // len(chunk))), chunked=True)
    grown = peak_rss(pid) - before
    assert grown < 64 * MiB, f"the operator's peak RSS grew by {grown / MiB:.0f} MiB for an unauthenticated body " \
                             f"({sent / MiB:.0f} MiB of it sent)"
    assert status == 401, body
    error_body(body, "unauthorized")
    # A wrong token is refused the same way, and the operator still serves.
    status, body, _ = post(f"{operator.api_url}/v1/claims", {"Authorization": "Bearer wrong"},
                           (chunk for _ in range(8)), chunked=True)
    assert status == 401, body
    assert operator.proc.poll() is None
    assert httpx.get(f"{operator.api_url}/v1/health", timeout=10).status_code == 200


def test_authenticated_2_mib_json_gets_413_too_large(operator):
    pad = 2 * MiB
    doc = json.dumps({"pool": "python", "env": {"PAD": "x" * pad}}).encode()
    assert len(doc) > 2 * MiB
    auth = {"Authorization": f"Bearer {operator.api_token}", "Content-Type": "application/json"}
    pieces = [doc[i:i + 64 * 1024] for i in range(0, len(doc), 64 * 1024)]
    # Declared up front: refused before the body is read.
    status, body, _ = post(f"{operator.api_url}/v1/claims", {**auth, "Content-Length": str(len(doc))}, pieces,
                           chunked=False)
    assert status == 413, body
    error_body(body, "too_large")
    # Only seen as it streams: refused once past the cap.
    status, body, _ = post(f"{operator.api_url}/v1/claims", auth, pieces, chunked=True)
    assert status == 413, body
    error_body(body, "too_large")
    # The cap is on the body, not on the caller: a small body with the same token is served.
    r = httpx.get(f"{operator.api_url}/v1/claims", headers={"Authorization": f"Bearer {operator.api_token}"},
                  timeout=30)
    assert r.status_code != 401 and r.status_code < 500, r.text
