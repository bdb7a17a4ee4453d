"""`corral shell`: the local terminal bridged to a PTY in the sandbox. Raw mode while attached (restored on every
exit path), keystrokes forwarded in order, SIGWINCH → resize, remote output straight to stdout; returns the remote
process's exit code."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from .aio import AsyncClient


@contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    if not os.isatty(fd):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def terminal_size() -> tuple[int, int]:
    size = shutil.get_terminal_size((80, 24))
    return size.columns, size.lines


async def shell(url: str | None, token: str | None, name: str, command: str | None) -> int:
    stdin, stdout = sys.stdin.fileno(), sys.stdout.fileno()
    loop = asyncio.get_running_loop()
    async with AsyncClient(url, token) as client:
        sbx = await client.sandbox(name)
        cols, rows = terminal_size()
        async with sbx.pty(command, cols=cols, rows=rows) as term:
            inbox: asyncio.Queue[bytes | tuple[int, int] | None] = asyncio.Queue()

            def on_input() -> None:
                try:
                    data = os.read(stdin, 65536)
                except OSError:
                    data = b""
                if not data:  # EOF on a non-tty stdin: stop reading, the remote side decides when to end
                    loop.remove_reader(stdin)
                    return
                inbox.put_nowait(data)

            async def forward() -> None:  # one writer keeps keystrokes and resizes in order
                while (item := await inbox.get()) is not None:
                    if isinstance(item, tuple):
                        await term.resize(*item)
                    else:
                        await term.write(item)

            with raw_mode(stdin):
                loop.add_reader(stdin, on_input)
                loop.add_signal_handler(signal.SIGWINCH, lambda: inbox.put_nowait(terminal_size()))
                writer = asyncio.ensure_future(forward())
                try:
                    async for chunk in term:
                        os.write(stdout, chunk)
                    if term.exit_code is None:  # the socket ended without an exit frame: ask the session
                        await term.wait(timeout=10)
                finally:
                    loop.remove_reader(stdin)
                    loop.remove_signal_handler(signal.SIGWINCH)
                    writer.cancel()
                    await asyncio.gather(writer, return_exceptions=True)
            code = term.exit_code
    return code if code is not None else 1


def run_shell(url: str | None, token: str | None, name: str, command: str | None) -> int:
    return asyncio.run(shell(url, token, name, command))
