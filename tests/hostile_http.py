"""Hostile HTTP clients shared by the test tiers (imported by name: tests/ is on sys.path through its conftest.py):
a POST that keeps sending while it reads the answer, and a process's peak memory."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit


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
