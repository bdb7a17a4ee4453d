"""Process entry point: the token taken out of the environment, a supervisor process that keeps one server child
alive, and the server: settings from the environment, then uvicorn (uvloop + httptools when available)."""

from __future__ import annotations

import sys
from collections.abc import Callable, MutableMapping

from .wire import ENV_PREFIX  # not settings.py: the supervisor process never loads pydantic


def bootstrap_token(key: str, namespace: str, pod: str, pod_uid: str) -> str:
    """A Kubernetes sandbox's idle token: HMAC(namespace key, namespace/pod/pod uid). The init container derives it
    from the key (a Secret mounted into it alone) and the pod's identity (downward API); the operator derives the
    same from its own secret (corral.operator.tokens). A new pod (a restart, a repair) gets a new one."""
    import hashlib
    import hmac

    return hmac.new(key.encode(), f"corral/bootstrap/{namespace}/{pod}/{pod_uid}".encode(), hashlib.sha256).hexdigest()


def write_token(path: str) -> None:
    """`execd install DEST TOKEN_FILE`: the initContainer hands the sandbox container's execd its first token as a
    file readable by the pod's uid alone, which execd deletes once read (take_token). The token is
    CORRAL_EXECD_TOKEN if set (the init container's own env), else derived (`bootstrap_token`) from the key in
    CORRAL_EXECD_KEY_FILE and CORRAL_EXECD_POD_{NAMESPACE,NAME,UID}, so no pod spec holds it."""
    import os

    token = os.environ.get(ENV_PREFIX + "TOKEN", "")
    key_file = os.environ.get(ENV_PREFIX + "KEY_FILE", "")
    if not token and key_file:
        with open(key_file) as f:
            key = f.read().strip()
        ident = [os.environ.get(ENV_PREFIX + f"POD_{part}", "") for part in ("NAMESPACE", "NAME", "UID")]
        if not key or not all(ident):
            raise SystemExit(f"corral-execd: empty key in {key_file} or pod identity missing: {ident}")
        token = bootstrap_token(key, *ident)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o400)
    with os.fdopen(fd, "w") as f:
        f.write(token)


def install(dest: str, token_file: str | None = None) -> int:
    """`execd install DEST [TOKEN_FILE]`: copy this bundle (the directory of the running executable) to DEST. The
    Kubernetes initContainer runs it to fill the shared emptyDir, so the execd image needs no shell or coreutils."""
    import os
    import shutil

    if not getattr(sys, "frozen", False):
        print("corral-execd: install only works from the bundle", file=sys.stderr)
        return 2
    # Entry by entry: DEST itself is the volume's root, owned by root on a real node (fsGroup only adds group
    # write), so its own mode and times cannot be set by the sandbox user; copytree(src, DEST) would try, and fail.
    src = os.path.dirname(os.path.abspath(sys.executable))
    os.makedirs(dest, exist_ok=True)
    for entry in os.scandir(src):
        target = os.path.join(dest, entry.name)
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir():
            shutil.copytree(entry.path, target, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(entry.path, target)
    if token_file:
        write_token(token_file)
    print(f"corral-execd: installed into {dest}")
    return 0


def take_token(environ: MutableMapping[str, str] | None = None) -> str:
    """The token, put out of reach of the sandbox's code: CORRAL_EXECD_TOKEN_FILE is read and deleted (the operators
    deliver it so, never in an environment: /proc/<pid>/environ shows a process's initial environment for good),
    CORRAL_EXECD_TOKEN is still taken (local runs, tests) and both leave os.environ, so no command inherits them."""
    import os

    env = os.environ if environ is None else environ
    token = env.pop(ENV_PREFIX + "TOKEN", "").strip()
    path = env.pop(ENV_PREFIX + "TOKEN_FILE", "")
    if path:
        try:
            with open(path) as f:
                token = token or f.read().strip()
            os.unlink(path)
        except FileNotFoundError:
            pass  # e.g. the second start of a container: the supervisor died with the token, nothing to take
        except OSError as exc:
            print(f"corral-execd: token file {path}: {exc}", file=sys.stderr)
    return token


def hide_memory() -> None:
    """PR_SET_DUMPABLE 0: processes of the same uid (the sandbox's code) can no longer ptrace execd or read its
    /proc/<pid>/{mem,environ,fd,...} (they become root's; reading them needs CAP_SYS_PTRACE, which sandboxes drop).
    Inherited across fork, reset by execve: the commands execd starts are ordinary processes again."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) == 0:  # PR_SET_DUMPABLE, SUID_DUMP_DISABLE
            return
    except (ImportError, OSError, AttributeError):
        pass
    print("corral-execd: could not make itself non-dumpable: processes of its uid can read its memory",
          file=sys.stderr)


def backoff(restarts: int) -> float:
    """Seconds before the supervisor starts execd again: 0.25, 0.5, 1, 2, 4, then 5."""
    return min(5.0, 0.25 * 2 ** min(restarts, 5))


def supervise(token: str, serve: Callable[[str, int], int], *, stable: float = 30.0) -> int:
    """Run `serve(token, fd)` in a forked child and start it again (after `backoff`) whenever it dies, so a command
    running `kill -9 $PPID` or an OOM kill of the server costs seconds, not the sandbox. The sandbox's PID 1 is left
    alone. The child writes each token PUT /v1/token sets to `fd` (a pipe, close-on-exec: no command inherits it),
    one per line; the next child starts with the latest. This process holds the token in memory only, non-dumpable
    like its child. SIGTERM/SIGINT go to the child, and end the loop. A child exiting 2 (bad configuration) ends it
    too: that does not heal."""
    import os
    import signal
    import time

    child, stopping, restarts = 0, False, 0

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child:
            os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        r, w = os.pipe()
        started = time.monotonic()
        child = os.fork()
        if child == 0:
            os.close(r)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            code = 1
            try:
                code = serve(token, w)
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as pipe:  # EOF once the child is gone
            for line in pipe:
                token = line.decode("ascii", "replace").strip() or token
        _, status = os.waitpid(child, 0)
        child = 0
        code = os.waitstatus_to_exitcode(status)
        if stopping:
            return 0 if code < 0 else code
        if code == 2:
            return 2
        restarts = 1 if time.monotonic() - started > stable else restarts + 1
        delay = backoff(restarts - 1)
        print(f"corral-execd: exited ({code}); starting it again in {delay:.2f} s", file=sys.stderr, flush=True)
        time.sleep(delay)
        if stopping:
            return 0


def serve(token: str, token_fd: int) -> int:
    """One execd server (the supervisor's child): settings from the environment, then uvicorn."""
    import os

    # pydantic looks for plugins through importlib.metadata on first use (~40 ms scanning every installed
    # distribution): execd uses none, and its start-up is on the sandbox cold-start path.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    from pydantic import ValidationError

    from .settings import Settings

    try:
        settings = Settings.from_env(token=token)
    except (ValidationError, OSError) as exc:
        print(f"corral-execd: bad configuration: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from .app import create_app

    def keep(new: str) -> None:
        try:
            os.write(token_fd, new.encode() + b"\n")
        except OSError:
            pass  # no supervisor (it was killed): this server still has it

    uvicorn.run(
        create_app(settings, on_token=keep),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,
        lifespan="on",
        ws_max_size=16 << 20,
        timeout_graceful_shutdown=3,
        server_header=False,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["install"] and len(args) in (2, 3):
        return install(*args[1:])
    usage = ("usage: python -m corral.execd                       serve (configured by CORRAL_EXECD_* env: "
             "see corral.execd.settings)\n"
             "       python -m corral.execd install DEST [TOKEN_FILE]  "
             "copy the daemon into DEST (an init container's job)")
    if args[:1] in (["-h"], ["--help"]):
        print(usage)
        return 0
    if args:
        print(f"corral-execd: unknown arguments {' '.join(args)!r}\n{usage}", file=sys.stderr)
        return 2
    token = take_token()
    if not token:
        print("corral-execd: no token: set CORRAL_EXECD_TOKEN_FILE or CORRAL_EXECD_TOKEN (see corral.execd.settings)",
              file=sys.stderr)
        return 2
    hide_memory()
    return supervise(token, serve)


if __name__ == "__main__":
    sys.exit(main())
