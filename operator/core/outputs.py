"""The tail of a batch task's output, the same in both runtimes: what a batch result's `output` carries.

execd keeps a background command's output (up to its log_buffer_bytes, 8 MiB by default) and serves all of it at
once from GET /v1/command/{id}/logs, as JSON chunks; it has no "last N bytes". `LogsTail` reads that body as it
streams in and keeps only the last `limit` bytes of the chunks' data, so reading the tail of a chatty task costs the
transfer but never the memory: at most `limit` bytes of output plus one chunk's JSON (execd's chunks are one pipe
read each, 64 KiB at most) are held, whatever the body's size.

The tail is read once, right when the task has ended and before its sandbox is released (a Delete policy deletes it
at once), and kept by `OutputStore`, bounded in bytes across all batches: an ended task's output never changes.
"""

from __future__ import annotations

import base64
import codecs
import json
import re
from collections import OrderedDict
from dataclasses import dataclass

from corral.api.wire import OUTPUT_TAIL_BYTES

MAX_CHUNK_JSON = 1 << 20  # one chunk's JSON held while it is parsed: larger means this is not execd's logs body
MAX_TRAILER = 4096        # the fields after the chunks (next_cursor, dropped, ...)
_CHUNKS = re.compile(r'"chunks"\s*:\s*\[')


@dataclass(frozen=True)
class Tail:
    text: str         # the last bytes of the output, UTF-8 with undecodable bytes replaced
    truncated: bool   # the task wrote more than `text` holds (or execd dropped some of it)
    size: int         # bytes of output seen (execd's retained output, not counting what it dropped)


class NotLogs(ValueError):
    """The body is not execd's CommandLogs (or a chunk in it is larger than MAX_CHUNK_JSON)."""


class LogsTail:
    """Feed it execd's CommandLogs body in pieces (`feed`), then take `result()`."""

    def __init__(self, limit: int = OUTPUT_TAIL_BYTES) -> None:
        self.limit = limit
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._buf = ""
        self._state = "head"  # head (before the chunks array) -> items -> trailer
        self._tail = bytearray()
        self._size = 0
        self._dropped = False

    def feed(self, data: bytes) -> None:
        self._buf += self._decoder.decode(data)
        self._advance()

    def _advance(self) -> None:
        if self._state == "head":
            found = _CHUNKS.search(self._buf)
            if found is None:
                if len(self._buf) > MAX_CHUNK_JSON:
                    raise NotLogs("no chunks array in the first MiB of the body")
                return
            self._buf, self._state = self._buf[found.end():], "items"
        decoder = json.JSONDecoder()
        while self._state == "items":
            rest = self._buf.lstrip(" \t\r\n,")
            if not rest:
                self._buf = ""
                return
            if rest[0] == "]":
                self._buf, self._state = rest[1:], "trailer"
                break
            try:
                chunk, end = decoder.raw_decode(rest)
            except json.JSONDecodeError:
                if len(rest) > MAX_CHUNK_JSON:
                    raise NotLogs(f"a chunk of the body is larger than {MAX_CHUNK_JSON} bytes") from None
                self._buf = rest  # incomplete: wait for more
                return
            self._buf = rest[end:]
            self._take(chunk)
        if self._state == "trailer" and len(self._buf) > MAX_TRAILER:
            self._buf = self._buf[:MAX_TRAILER]

    def _take(self, chunk: object) -> None:
        if not isinstance(chunk, dict) or not isinstance(chunk.get("data"), str):
            raise NotLogs("a chunk is not an object with string data")
        data = chunk["data"]
        raw = base64.b64decode(data) if chunk.get("encoding") == "base64" else data.encode()
        self._size += len(raw)
        self._tail += raw
        if len(self._tail) > self.limit:
            del self._tail[:len(self._tail) - self.limit]

    def result(self) -> Tail:
        if self._state == "head":
            raise NotLogs("the body ended before its chunks array")
        if self._state == "trailer":
            try:  # what follows the array: ,"next_cursor":n,"dropped":n,...}
                trailer = json.loads("{" + self._buf.strip().lstrip(",")) if self._buf.strip() != "}" else {}
            except json.JSONDecodeError:
                trailer = {}
            if isinstance(trailer, dict):
                self._dropped = bool(trailer.get("truncated") or trailer.get("dropped")
                                     or trailer.get("dropped_bytes"))
        return tail_of(bytes(self._tail), truncated=self._size > len(self._tail) or self._dropped, size=self._size)


def tail_of(raw: bytes, *, truncated: bool, size: int | None = None) -> Tail:
    """A Tail from the last bytes of an output: a character cut at the start is dropped, not shown as U+FFFD."""
    start = 0
    if truncated:
        while start < min(3, len(raw)) and 0x80 <= raw[start] < 0xC0:
            start += 1
    return Tail(raw[start:].decode("utf-8", "replace"), truncated, len(raw) if size is None else size)


class OutputStore:
    """The tails read so far, by (batch uid, index); the least recently stored go first once `max_chars`
    characters of text are held (4096 tails of 4 KiB by default). Keyed by a batch's uid, not its name: a batch
    created again under the same name never shows the old outputs."""

    def __init__(self, max_chars: int = 16 << 20) -> None:
        self.max_chars = max_chars
        self._items: OrderedDict[tuple[str, int], Tail] = OrderedDict()
        self._bytes = 0

    def put(self, batch_uid: str, index: int, tail: Tail) -> None:
        key = (batch_uid, index)
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= len(old.text)
        self._items[key] = tail
        self._bytes += len(tail.text)
        while self._bytes > self.max_chars and self._items:
            _, gone = self._items.popitem(last=False)
            self._bytes -= len(gone.text)

    def get(self, batch_uid: str, index: int) -> Tail | None:
        return self._items.get((batch_uid, index))

    def __len__(self) -> int:
        return len(self._items)
