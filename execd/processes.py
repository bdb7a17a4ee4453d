"""Child processes: spawn in a new session, wait for exit without threads, kill the whole tree.

Shared by commands and PTY sessions. Every child is a session leader (`start_new_session=True`), so its process
group and session ids equal its pid; `kill_tree` signals that group and also every process still in the session or
descending from the child (found in /proc), which catches grandchildren that moved to another group or session.
"""

from __future__ import annotations

import asyncio
import base64
import os
import pwd
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ExecdError, os_error
from .wire import ENV_PREFIX

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HIDDEN_ENV_PREFIX = ENV_PREFIX  # never leak execd's token or config into the sandbox's processes
HIDDEN_ENV = frozenset({"PYDANTIC_DISABLE_PLUGINS"})  # set by execd for itself (server.py)
MAX_ID = 2**32 - 2  # largest valid uid/gid ((uid_t)-1 means "unchanged" to the kernel)


@dataclass(frozen=True)
class RunAs:
    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str
    home: str


def resolve_user(user: str | int | None) -> RunAs | None:
    """`user` as a name or numeric uid -> RunAs; None runs as execd's own user."""
    if user is None or user == "":
        return None
    text = str(user)
    numeric = text.isascii() and text.isdigit()  # not str.isdigit alone: "²" or "١" are digits to it
    if numeric and int(text) > MAX_ID:
        raise ExecdError(400, f"uid {text} is out of range", "unknown_user")
    try:
        entry = pwd.getpwuid(int(text)) if numeric else pwd.getpwnam(text)
    except KeyError:
        if numeric:
            return RunAs(int(text), int(text), (), text, "/")
        raise ExecdError(400, f"unknown user {user!r}", "unknown_user") from None
    except ValueError:  # NUL byte, unencodable text
        raise ExecdError(400, f"invalid user {user!r}", "unknown_user") from None
    try:
        import grp

        groups = tuple(g.gr_gid for g in grp.getgrall() if entry.pw_name in g.gr_mem)
    except Exception:  # noqa: BLE001 - no group database is not fatal
        groups = ()
    return RunAs(entry.pw_uid, entry.pw_gid, groups, entry.pw_name, entry.pw_dir)


def child_env(injected: Mapping[str, str], request: Mapping[str, str] | None, run_as: RunAs | None) -> dict[str, str]:
    """execd's environment (minus its own settings) < env set through PUT /v1/env < the request's env."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(HIDDEN_ENV_PREFIX) and k not in HIDDEN_ENV}
    env.setdefault("PATH", DEFAULT_PATH)
    if run_as is not None:
        env.update(HOME=run_as.home, USER=run_as.name, LOGNAME=run_as.name)
    env.update(injected)
    if request:
        env.update(request)
    return env


def resolve_cwd(cwd: str | None, workspace: str) -> str:
    if cwd is None:
        return workspace if os.path.isdir(workspace) else "/"
    path = cwd if os.path.isabs(cwd) else os.path.join(workspace, cwd)
    if not os.path.isdir(path):
        raise ExecdError(400, f"cwd {cwd} is not an existing directory", "invalid_cwd")
    return path


def spawn(argv: list[str], *, cwd: str, env: dict[str, str], run_as: RunAs | None,
          **popen_kw: object) -> subprocess.Popen:
    """Start `argv` as a session leader. Spawn failures become 4xx errors in the error shape."""
    kw: dict[str, object] = dict(
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    kw.update(popen_kw)
    if run_as is not None and run_as.uid != os.geteuid():
        kw.update(user=run_as.uid, group=run_as.gid, extra_groups=list(run_as.groups))
    try:
        return subprocess.Popen(argv, cwd=cwd, env=env, close_fds=True, **kw)  # type: ignore[call-overload]
    except FileNotFoundError:
        raise ExecdError(400, f"executable not found: {argv[0]}", "not_found") from None
    except PermissionError as exc:
        raise ExecdError(403, f"cannot start {argv[0]}: {exc.strerror}", "forbidden") from None
    except OSError as exc:  # E2BIG (argv/env too large), ENOEXEC, ...: the errno table's answer
        raise os_error(exc, argv[0][:200]) from None
    except (ValueError, UnicodeEncodeError) as exc:  # NUL or unencodable text that slipped past validation
        raise ExecdError(400, f"cannot start {argv[0][:200]!r}: {exc}", "invalid_request") from None


async def wait_exit(proc: subprocess.Popen) -> int:
    """Wait for the child without a thread per child: a pidfd becomes readable when the process exits."""
    loop = asyncio.get_running_loop()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # kernel < 5.3: fall back to a thread
        return await loop.run_in_executor(None, proc.wait)
    done = loop.create_future()
    def exited() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(pidfd, exited)
    try:
        await done
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
    return proc.wait()


def _proc_table() -> list[tuple[int, int, int, int]]:
    """(pid, ppid, pgid, sid) of every process we can see."""
    rows = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        rows.append((int(name), int(fields[1]), int(fields[2]), int(fields[3])))
    return rows


def tree_of(leader: int) -> set[int]:
    """The leader, its session and group members, and all their descendants."""
    table = _proc_table()
    members = {pid for pid, _, pgid, sid in table if pid == leader or pgid == leader or sid == leader}
    children: dict[int, list[int]] = {}
    for pid, ppid, _, _ in table:
        children.setdefault(ppid, []).append(pid)
    stack = list(members)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in members:
                members.add(child)
                stack.append(child)
    return members


def kill_tree(leader: int, sig: int = signal.SIGKILL) -> None:
    """Signal the whole process tree of a session leader that has not been reaped yet."""
    pids = tree_of(leader)
    try:
        os.killpg(leader, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def exit_info(returncode: int) -> tuple[int, str | None]:
    """Popen's returncode -> (shell-style exit code, signal name or None)."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"SIG{-returncode}"
        return 128 - returncode, name
    return returncode, None


def parse_signal(value: str | int) -> int:
    """A signal name (`TERM`, `SIGTERM`) or number (ASCII digits) that this system has, else 400."""
    text = str(value).upper()
    if text.isascii() and text.isdigit():
        if len(text) < 4 and int(text) in signal.valid_signals():
            return int(text)
        raise ExecdError(400, f"signal {value!r} is out of range", "invalid_signal")
    name = text if text.startswith("SIG") else "SIG" + text
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ExecdError(400, f"unknown signal {value!r}", "invalid_signal") from None


def encode_output(data: bytes) -> tuple[str, str]:
    """Bytes -> (text, "utf-8") when they are valid UTF-8, else (base64 text, "base64"): output stays intact."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def utf8_complete_prefix(data: bytes) -> int:
    """Length of `data` without a trailing, incomplete UTF-8 sequence (so a stream chunk never splits a char)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte or ASCII
            need = (1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110
                    else 4 if byte >> 3 == 0b11110 else 1)
            return len(data) - back if need > back else len(data)
    return len(data)
