"""kube tier: the claims API of the Kubernetes operator process facing hostile callers (issue 15). The operator is
the tier's real process (kopf, the control plane, the API in kopf's loop), not the unit tests' bare app: an
unauthenticated 200 MB POST streamed in chunks gets 401 and leaves the process's peak RSS (VmHWM) flat; an
authenticated 2 MiB JSON body gets 413 `too_large` in the `{code, message}` shape, whether its size is declared
(Content-Length) or only seen as it streams (chunked). Raw sockets, read while writing: the server answers before the
body is read and closes, which an HTTP client still writing the body would report as a write error."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

pytestmark = pytest.mark.kube

MiB = 1 << 20


def peak_rss(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) << 10


def post(url: str, headers: dict[str, str], chunks: Iterable[bytes], *, chunked: bool) -> tuple[int, bytes, int]:
    """POST the chunks (as HTTP chunks, or as they are under a Content-Length the caller set) while reading the
    answer on another thread; stops sending when the server closes. -> (status, answer body, body bytes sent)."""
    u = urlsplit(url)
    answer = bytearray()
    sent = 0
    with socket.create_connection((u.hostname, u.port), timeout=60) as sock:
        def read() -> None:
            try:
                while data := sock.recv(65536):
                    answer.extend(data)
            except OSError:
                pass

        reader = threading.Thread(target=read)
        reader.start()
        head = {"Host": u.netloc, **headers, **({"Transfer-Encoding": "chunked"} if chunked else {})}
        sock.sendall(f"POST {u.path} HTTP/1.1\r\n".encode()
                     + b"".join(f"{k}: {v}\r\n".encode() for k, v in head.items()) + b"\r\n")
        try:
            for chunk in chunks:
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                sent += len(chunk)
            if chunked:
                sock.sendall(b"0\r\n\r\n")
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed: the rest is never sent
            pass
        reader.join(60)
    assert not reader.is_alive(), "the server neither answered nor closed"
    status_line, _, rest = bytes(answer).partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 "), bytes(answer[:300])
    head_text, _, body = rest.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head_text.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), len(body))
    return int(status_line.split()[1]), body[:length], sent


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
