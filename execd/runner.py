"""A running command: output capture (run), event streaming (stream) or a bounded log (background); timeout/kill."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections import deque
from dataclasses import dataclass, field
from signal import SIGKILL
from typing import Any

from . import processes

DRAIN_SECONDS = 0.5  # after the child exits, how long to wait for grandchildren holding its pipes
PAUSE_BYTES = 1 << 20  # a streaming reader stops reading the child when this much is queued for the client


@dataclass
class Event:
    seq: int
    stream: str  # stdout | stderr
    data: bytes


@dataclass
class Command:
    id: str
    mode: str  # run | stream | background
    proc: subprocess.Popen
    timeout: float | None
    max_output: int
    log_bytes: int
    started: float = field(default_factory=time.time)
    finished: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    timed_out: bool = False
    interrupted: bool = False
    key: str | None = None  # the caller's key (background commands: POST /v1/command answers a second start with it)
    # run mode
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    truncated: bool = False
    # background mode: a bounded log; stream mode: a queue for the client
    log: deque[Event] = field(default_factory=deque)
    log_size: int = 0
    dropped: int = 0
    dropped_bytes: int = 0
    retention: Any = None  # retention.Retention: the bound on all background commands' logs together
    queue: asyncio.Queue | None = None
    queued: int = 0
    seq: int = 0
    metrics: Any = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    _open: dict[int, str] = field(default_factory=dict)
    _paused: set[int] = field(default_factory=set)
    _carry: dict[str, bytes] = field(default_factory=dict)
    _eof: asyncio.Event = field(default_factory=asyncio.Event)  # set whenever a pipe reaches EOF

    def __post_init__(self) -> None:
        if self.mode == "stream":
            self.queue = asyncio.Queue()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.exit_code is None

    @property
    def duration_ms(self) -> float:
        return round(((self.finished or time.time()) - self.started) * 1000, 3)

    # -- output ---------------------------------------------------------------------------------------------------
    def _start_readers(self) -> None:
        loop = asyncio.get_running_loop()
        for pipe, stream in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            assert pipe is not None
            fd = pipe.fileno()
            os.set_blocking(fd, False)
            self._open[fd] = stream
            loop.add_reader(fd, self._on_readable, fd)

    def _on_readable(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._emit(self._open[fd], data, fd)
        else:
            self._close_fd(fd)

    def _close_fd(self, fd: int) -> None:
        stream = self._open.pop(fd, None)
        if stream is None:
            return
        if fd not in self._paused:
            asyncio.get_running_loop().remove_reader(fd)
        self._paused.discard(fd)
        self._eof.set()
        if carry := self._carry.pop(stream, b""):
            self._emit(stream, carry, None, flush=True)

    def _emit(self, stream: str, data: bytes, fd: int | None, flush: bool = False) -> None:
        if self.mode == "run":
            buf = self.stdout if stream == "stdout" else self.stderr
            room = self.max_output - len(buf)
            if room < len(data):
                self.truncated = True
            buf += data[: max(room, 0)]
            return
        if not flush:  # never cut a UTF-8 character between two events
            data = self._carry.pop(stream, b"") + data
            cut = processes.utf8_complete_prefix(data)
            data, self._carry[stream] = data[:cut], data[cut:]
            if not data:
                return
        self.seq += 1
        event = Event(self.seq, stream, data)
        if self.mode == "stream":
            assert self.queue is not None
            self.queue.put_nowait(event)
            self.queued += len(data)
            if fd is not None and self.queued > PAUSE_BYTES and fd in self._open:
                asyncio.get_running_loop().remove_reader(fd)
                self._paused.add(fd)
        else:
            self.log.append(event)
            self.log_size += len(data)
            if self.retention is not None:
                self.retention.grew(len(data))
            if self.log_size > self.log_bytes:
                self.drop_oldest(len(self.log) - 1, keep_bytes=self.log_bytes)

    def drop_oldest(self, chunks: int, keep_bytes: int = 0) -> None:
        """Drop up to `chunks` of the oldest retained chunks, stopping once no more than `keep_bytes` are left."""
        freed = 0
        while chunks > 0 and self.log and self.log_size - freed > keep_bytes:
            old = self.log.popleft()
            freed += len(old.data)
            self.dropped += 1
            chunks -= 1
        self.log_size -= freed
        self.dropped_bytes += freed
        if self.retention is not None:
            self.retention.shrank(freed)

    def consumed(self, event: Event) -> None:
        """The stream client took `event`: resume paused readers once the backlog is small again."""
        self.queued -= len(event.data)
        if self._paused and self.queued <= PAUSE_BYTES // 2:
            loop = asyncio.get_running_loop()
            for fd in list(self._paused):
                loop.add_reader(fd, self._on_readable, fd)
            self._paused.clear()

    # -- lifecycle ------------------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Supervise the child until it exits (or the timeout kills its tree), then drain and close its pipes."""
        self._start_readers()
        waiter = asyncio.ensure_future(processes.wait_exit(self.proc))
        try:
            try:
                await asyncio.wait_for(asyncio.shield(waiter), self.timeout)
            except TimeoutError:
                self.timed_out = True
                self.kill(SIGKILL, reason="timeout")
                await waiter
            await self._drain()
        except asyncio.CancelledError:
            self.kill(SIGKILL, reason="cancelled")
            self.proc.wait()
            raise
        finally:
            for fd in list(self._open):
                self._close_fd(fd)
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
            if self.exit_code is None:
                self.exit_code, self.signal = processes.exit_info(self.proc.wait())
                self.finished = time.time()
            self.done.set()
            if self.queue is not None:
                self.queue.put_nowait(None)

    async def _drain(self) -> None:
        """Wait for EOF on the pipes: at once in the usual case, up to DRAIN_SECONDS if a grandchild holds them
        (longer while a slow stream client has paused reading: its output is still wanted)."""
        deadline = time.monotonic() + DRAIN_SECONDS
        while self._open:
            self._eof.clear()
            left = deadline - time.monotonic()
            if left <= 0 and not self._paused:
                return
            try:
                await asyncio.wait_for(self._eof.wait(), max(left, 0.05))
            except TimeoutError:
                pass

    def kill(self, sig: int = SIGKILL, reason: str = "interrupt") -> bool:
        """Signal the command's whole tree; False if it already finished."""
        if not self.running or self.proc.returncode is not None:
            return False
        if reason == "interrupt":
            self.interrupted = True
        processes.kill_tree(self.pid, sig)
        if self.metrics is not None:
            self.metrics.inc("execd_command_kills_total", reason=reason)
        return True

    async def interrupt(self, sig: int, grace: float) -> None:
        """Send `sig` to the tree, escalate to SIGKILL after `grace` seconds if it is still running."""
        if not self.kill(sig):
            return
        try:
            await asyncio.wait_for(self.done.wait(), grace)
        except TimeoutError:
            self.kill(SIGKILL)

