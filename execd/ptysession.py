"""A process on a real pseudo-terminal, with a bounded output buffer for reattach and one attached client.

Modelled on terminado's management: the session outlives its WebSocket; a new client replays the buffered output
from an offset, then gets live output. Closing the session escalates SIGHUP -> SIGKILL on the whole tree.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import struct
import termios
import time
from typing import Any

from . import processes
from .processes import RunAs

PAUSE_BYTES = 4 << 20  # stop reading the terminal while this much output waits for the client


def _set_winsize(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _take_controlling_tty() -> None:  # runs in the child, after setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class PtySession:
    def __init__(self, sid: str, argv: list[str], *, cwd: str, env: dict[str, str], run_as: RunAs | None,
                 rows: int, cols: int, buffer_bytes: int) -> None:
        self.id = sid
        self.rows, self.cols = rows, cols
        self.buffer = bytearray()
        self.buffer_limit = buffer_bytes
        self.base = 0  # absolute offset of buffer[0]
        self.started = time.time()
        self.exit_code: int | None = None
        self.signal: str | None = None
        self.client: Any = None  # the attached WebSocket handler's outbox (an asyncio.Queue), at most one
        self.queued = 0
        self.paused = False
        self.exited = asyncio.Event()
        master, slave = os.openpty()
        _set_winsize(slave, rows, cols)
        env.setdefault("TERM", "xterm-256color")
        try:
            self.proc = processes.spawn(
                argv, cwd=cwd, env=env, run_as=run_as, stdin=slave, stdout=slave, stderr=slave,
                preexec_fn=_take_controlling_tty,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self.master = master
        os.set_blocking(master, False)
        loop = asyncio.get_running_loop()
        loop.add_reader(master, self._on_readable)
        self._reading = True
        self._waiter = loop.create_task(self._wait())

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.exit_code is None

    @property
    def offset(self) -> int:
        """Total bytes of output so far (the offset the next byte will have)."""
        return self.base + len(self.buffer)

    # -- output ---------------------------------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data = os.read(self.master, 1 << 16)
        except BlockingIOError:
            return
        except OSError:  # EIO: every holder of the slave side is gone
            data = b""
        if not data:
            self._stop_reading()
            return
        self.buffer += data
        if len(self.buffer) > self.buffer_limit:
            cut = len(self.buffer) - self.buffer_limit
            del self.buffer[:cut]
            self.base += cut
        if self.client is not None:
            self.client.put_nowait(("out", data))
            self.queued += len(data)
            if self.queued > PAUSE_BYTES:
                self._stop_reading()
                self.paused = True

    def _stop_reading(self) -> None:
        if self._reading:
            asyncio.get_running_loop().remove_reader(self.master)
            self._reading = False

    def delivered(self, n: int) -> None:
        self.queued -= n
        if self.paused and self.queued < PAUSE_BYTES // 2 and self.master >= 0:
            self.paused = False
            self._reading = True
            asyncio.get_running_loop().add_reader(self.master, self._on_readable)

    async def _wait(self) -> None:
        code = await processes.wait_exit(self.proc)
        deadline = time.monotonic() + 0.5  # let the last output arrive before announcing the exit
        while self._reading and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.exit_code, self.signal = processes.exit_info(code)
        self.exited.set()
        if self.client is not None:
            self.client.put_nowait(("exit", None))

    # -- clients --------------------------------------------------------------------------------------------------
    def attach(self, outbox: asyncio.Queue, since: int | None) -> tuple[bytes, int]:
        """Make `outbox` the live client; returns (replay bytes from `since`, their start offset). Synchronous, so
        no output can fall between the replay and the live feed."""
        start = self.base if since is None else min(max(since, self.base), self.offset)
        self.client = outbox
        self.queued = 0
        if self.paused:
            self.delivered(0)
        if self.exit_code is not None:
            outbox.put_nowait(("exit", None))
        return bytes(self.buffer[start - self.base :]), start

    def detach(self, outbox: asyncio.Queue) -> None:
        if self.client is outbox:
            self.client = None
            self.queued = 0
            if self.paused:
                self.delivered(0)

    def write(self, data: bytes) -> None:
        if self.master < 0 or not self.running:
            return
        view = memoryview(data)
        while view:  # terminal input is small; a full tty buffer is retried briefly rather than dropped
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:
                time.sleep(0.001)

    def resize(self, rows: int, cols: int) -> None:
        self.rows, self.cols = rows, cols
        if self.master >= 0:
            _set_winsize(self.master, rows, cols)  # the kernel sends SIGWINCH to the foreground group

    def send_signal(self, sig: int) -> None:
        """Signal the terminal's foreground process group (what a key like Ctrl-C would reach)."""
        try:
            pgrp = os.tcgetpgrp(self.master)
        except OSError:
            pgrp = self.pid
        try:
            os.killpg(pgrp, sig)
        except (ProcessLookupError, PermissionError):
            pass

    async def close(self, grace: float) -> None:
        if self.running:
            processes.kill_tree(self.pid, signal.SIGHUP)
            try:
                await asyncio.wait_for(self.exited.wait(), grace)
            except TimeoutError:
                processes.kill_tree(self.pid, signal.SIGKILL)
                await self.exited.wait()
        self._stop_reading()
        if self.master >= 0:
            os.close(self.master)
            self.master = -1
