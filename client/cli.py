"""The `corral` command line (typer + rich), on the SDK.

    corral pools [--watch]                    pools: desired / ready / idle / allocated
    corral claim POOL [--env K=V] [--ttl S]   claim a sandbox, print its name
    corral ls [--pool P]                      claims
    corral exec NAME -- CMD [ARGS...]         run a command, stream its output, exit with its exit code
    corral shell NAME                         interactive terminal (raw mode, resizes follow the window)
    corral cp SRC DST                         NAME:/path on either side; streamed with a progress bar
    corral release NAME...                    end claims
    corral batch POOL -n N -- CMD [ARGS...]   CMD in N sandboxes: live progress, a summary table, exit 1 if any failed
    corral batches ls | get NAME | rm NAME... batches
    corral retained ls | rm NAME...           sandboxes kept after their claim ended (--retain)
    corral snapshots ls | rm REF...           snapshot images (Docker mode)
    corral config pulumi --stack local        write ~/.config/corral/config.toml from the stack's outputs
    corral config set --url URL --token T     ... or from an address and a token
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import config as cfg
from .errors import CorralError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from .sync import Client, Sandbox

# Imports are lazy past typer: the SDK (httpx, pydantic, the models) and rich's console, tables and progress bars
# load when a command needs them, so `corral --help` answers in well under 0.3 s (bench/cli_startup).

app = typer.Typer(name="corral", help="Claim and use Corral sandboxes.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
config_app = typer.Typer(help="Where the claims API is: the config file.", no_args_is_help=True)
app.add_typer(config_app, name="config")
retained_app = typer.Typer(help="Sandboxes kept after their claim ended (claimed with --retain).",
                           no_args_is_help=True)
app.add_typer(retained_app, name="retained")
snapshots_app = typer.Typer(help="Snapshot images of claims (Docker mode).", no_args_is_help=True)
app.add_typer(snapshots_app, name="snapshots")
batches_app = typer.Typer(help="Batches: N sandboxes of a pool and one task in each (start one with `corral batch`).",
                          no_args_is_help=True)
app.add_typer(batches_app, name="batches")


class _LazyConsole:
    """A rich Console made on first use."""

    def __init__(self, **kw: Any):
        self._kw: dict[str, Any] = kw
        self._console: Console | None = None

    def real(self) -> Console:
        """The Console itself, for rich objects that take one (Live, Progress)."""
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kw)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)


out = _LazyConsole(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)
err = _LazyConsole(stderr=True)


class Ctx:
    def __init__(self, url: str | None, token: str | None):
        self.url, self.token = url, token

    def client(self, **kw: Any) -> Client:
        from .sync import Client

        return Client(self.url, self.token, **kw)


def fail(exc: Exception, code: int = 1) -> typer.Exit:
    err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
    return typer.Exit(code)


def run_cli(fn: Any) -> Any:
    try:
        return fn()
    except CorralError as exc:
        raise fail(exc) from None


@app.callback()
def main(ctx: typer.Context,
         url: Annotated[str | None, typer.Option(envvar=cfg.ENV_URL, help="Claims API URL.",
                                                    show_envvar=True)] = None,
         token: Annotated[str | None, typer.Option(envvar=cfg.ENV_TOKEN, help="Claims API token.",
                                                      show_envvar=True, show_default=False)] = None) -> None:
    ctx.obj = Ctx(url, token)


def _env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"{pair!r}: use KEY=VALUE", param_hint="--env")
        env[key] = value
    return env


# --- pools and claims ----------------------------------------------------------------------------------------------
def _table(**kw: Any) -> Table:
    from rich.table import Table

    return Table(**kw)


def _pools_table(pools: list[Any]) -> Table:
    t = _table(title=f"pools ({time.strftime('%H:%M:%S')})", title_justify="left")
    for col in ("pool", "kind", "template"):
        t.add_column(col, no_wrap=True)
    for col in ("desired", "ready", "idle", "allocated"):
        t.add_column(col, justify="right")
    for p in pools:
        ready = f"[green]{p.ready}[/green]" if p.ready else "[yellow]0[/yellow]"
        t.add_row(p.name, p.kind, p.template, str(p.desired), ready, str(p.idle), str(p.allocated))
    return t


@app.command()
def pools(ctx: typer.Context,
          watch: Annotated[bool, typer.Option("--watch", "-w", help="Keep the table live.")] = False,
          interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch.")] = 1.0,
          as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Pools with desired / ready / idle / allocated sandboxes."""
    with run_cli(ctx.obj.client) as client:
        items = run_cli(client.pools)
        if as_json:
            out.print_json(json.dumps([p.model_dump(mode="json") for p in items]))
            return
        if not watch:
            out.print(_pools_table(items))
            return
        try:
            from rich.live import Live

            with Live(_pools_table(items), console=out.real(), auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    live.update(_pools_table(run_cli(client.pools)), refresh=True)
        except KeyboardInterrupt:
            pass


@app.command()
def claim(ctx: typer.Context, pool: Annotated[str, typer.Argument(help="WarmPool or Pool to claim from.")],
          env: Annotated[list[str], typer.Option("--env", "-e", help="KEY=VALUE for its commands.")] = [],  # noqa: B006
          ttl: Annotated[int | None, typer.Option(help="Lease in seconds (renewable).")] = None,
          name: Annotated[str | None, typer.Option(help="Claim name (default: generated).")] = None,
          snapshot: Annotated[str | None, typer.Option(help="Start from this snapshot image.")] = None,
          retain: Annotated[bool, typer.Option(help="Keep the container when the claim ends.")] = False,
          timeout: Annotated[float, typer.Option(help="Seconds to wait for Ready.")] = 120.0,
          as_json: Annotated[bool, typer.Option("--json", help="Print the claim as JSON.")] = False) -> None:
    """Claim a sandbox; prints its name (use it with exec, shell, cp, release)."""
    with run_cli(ctx.obj.client) as client:
        sbx = run_cli(lambda: client.claim(pool, env=_env(env), ttl=ttl, name=name, snapshot=snapshot,
                                           shutdown_policy="Retain" if retain else "Delete", timeout=timeout))
        if as_json:
            out.print_json(sbx.claim.model_dump_json(by_alias=True))
        else:
            print(sbx.name)
            c = sbx.claim
            err.print(f"[dim]{c.launch_type} claim of {pool}, sandbox {c.sandbox.name if c.sandbox else '-'}"
                      f"{', expires ' + c.expires_at.isoformat() if c.expires_at else ''}[/dim]")


@app.command("ls")
def list_claims(ctx: typer.Context,
                pool: Annotated[str | None, typer.Option(help="Only this pool's claims.")] = None,
                as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List claims."""
    with run_cli(ctx.obj.client) as client:
        claims = run_cli(lambda: client.claims(pool))
    if as_json:
        out.print_json(json.dumps([c.model_dump(mode="json", by_alias=True) for c in claims]))
        return
    t = _table()
    for col in ("name", "pool", "phase", "launch", "sandbox", "created", "expires"):
        t.add_column(col, no_wrap=True)
    for c in claims:
        t.add_row(c.name, c.pool, c.phase, c.launch_type or "-", c.sandbox.name if c.sandbox else "-",
                  c.created.strftime("%H:%M:%S"), c.expires_at.strftime("%H:%M:%S") if c.expires_at else "-")
    out.print(t)


@app.command()
def release(ctx: typer.Context, names: Annotated[list[str], typer.Argument(help="Claims to end.")]) -> None:
    """End claims (their sandboxes are deleted, recycled into their Pool, or retained)."""
    missing = 0
    with run_cli(ctx.obj.client) as client:
        for name in names:
            if run_cli(lambda name=name: client.release(name)):
                err.print(f"released {name}", highlight=False)
            else:
                err.print(f"[yellow]no claim named {name}[/yellow]", highlight=False)
                missing += 1
    if missing:
        raise typer.Exit(1)


# --- what outlives a claim: retained sandboxes and snapshots -------------------------------------------------------
def _when(t: Any) -> str:
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def _size(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "-"


def _remove(ctx: typer.Context, things: list[str], what: str, remove: Any) -> None:
    """`rm` of retained sandboxes and snapshots: one line each on stderr, exit 1 if any was not there."""
    missing = 0
    with run_cli(ctx.obj.client) as client:
        for thing in things:
            if run_cli(lambda thing=thing: remove(client, thing)):
                err.print(f"removed {thing}", highlight=False)
            else:
                err.print(f"[yellow]no {what} {thing}[/yellow]", highlight=False)
                missing += 1
    if missing:
        raise typer.Exit(1)


@retained_app.command("ls")
def retained_ls(ctx: typer.Context,
                as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List retained sandboxes: the claim and pool each was retained from, when, its state, whether execd answers."""
    with run_cli(ctx.obj.client) as client:
        items = run_cli(client.retained)
    if as_json:
        out.print_json(json.dumps([r.model_dump(mode="json", by_alias=True) for r in items]))
        return
    t = _table()
    for col in ("name", "template", "pool", "claim", "retained", "state", "ready"):
        t.add_column(col, no_wrap=True)
    for r in items:
        t.add_row(r.name, r.template, r.pool or "-", r.claim or "-", _when(r.retained_at), r.state,
                  "yes" if r.ready else "no")
    out.print(t)


@retained_app.command("rm")
def retained_rm(ctx: typer.Context,
                names: Annotated[list[str], typer.Argument(help="Retained sandboxes to delete.")]) -> None:
    """Delete retained sandboxes (their containers or pods go with them)."""
    _remove(ctx, names, "retained sandbox", lambda client, name: client.delete_retained(name))


@snapshots_app.command("ls")
def snapshots_ls(ctx: typer.Context,
                 as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List snapshot images: the claim each was taken from, when, its size."""
    with run_cli(ctx.obj.client) as client:
        items = run_cli(client.snapshots)
    if as_json:
        out.print_json(json.dumps([s.model_dump(mode="json", by_alias=True) for s in items]))
        return
    t = _table()
    for col in ("image", "claim", "created", "size", "id"):
        t.add_column(col, no_wrap=True, justify="right" if col == "size" else "left")
    for snap in items:
        t.add_row(snap.image, snap.claim or "-", _when(snap.created), _size(snap.size),
                  snap.id.removeprefix("sha256:")[:12])
    out.print(t)


@snapshots_app.command("rm")
def snapshots_rm(ctx: typer.Context,
                 refs: Annotated[list[str], typer.Argument(help="Snapshot image references (or IDs) to remove.")],
                 ) -> None:
    """Remove snapshot images (refused while a sandbox or a pool uses one)."""
    _remove(ctx, refs, "snapshot", lambda client, ref: client.delete_snapshot(ref))


# --- exec and shell ------------------------------------------------------------------------------------------------
@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(ctx: typer.Context, name: Annotated[str, typer.Argument(help="Claim name.")],
          command: Annotated[list[str], typer.Argument(help="One argument: a shell command line; several: argv.")],
          env: Annotated[list[str], typer.Option("--env", "-e", help="KEY=VALUE.")] = [],  # noqa: B006
          cwd: Annotated[str | None, typer.Option(help="Working directory.")] = None,
          timeout: Annotated[float | None, typer.Option(help="Kill the command after this many seconds.")] = None,
          ) -> None:
    """Run a command in a sandbox, streaming its output; exits with the command's exit code."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise typer.BadParameter("no command given", param_hint="COMMAND")
    cmd: str | list[str] = command[0] if len(command) == 1 else command
    with run_cli(ctx.obj.client) as client:
        sbx = run_cli(lambda: client.sandbox(name))
        stream = run_cli(lambda: sbx.commands.stream(cmd, env=_env(env), cwd=cwd, timeout=timeout))
        try:
            run_cli(lambda: [os.write(1 if o.stream == "stdout" else 2, o.data) for o in stream])
        except KeyboardInterrupt:
            stream.close()  # execd kills the command when its stream goes away
            raise typer.Exit(130) from None
    raise typer.Exit(stream.exit_code if stream.exit_code is not None else 1)


@app.command()
def shell(ctx: typer.Context, name: Annotated[str, typer.Argument(help="Claim name.")],
          command: Annotated[str | None, typer.Option("--command", "-c",
                                                         help="Run this instead of a login shell.")] = None,
          ) -> None:
    """An interactive terminal in the sandbox (raw mode; resizing the window resizes it). Exits with the remote
    exit code."""
    from .shell import run_shell

    code = run_cli(lambda: run_shell(ctx.obj.url, ctx.obj.token, name, command))
    raise typer.Exit(code)


# --- batches ------------------------------------------------------------------------------------------------------
def tail_lines(output: str | None, lines: int = 3, width: int = 100) -> str:
    """The last `lines` non-empty lines of a task's output tail, each cut to `width` characters (a table cell)."""
    if not output:
        return ""
    kept = [line if len(line) <= width else "…" + line[-(width - 1):]
            for line in output.replace("\r", "\n").splitlines() if line.strip()][-lines:]
    return "\n".join(kept)


def batch_table(name: str, results: list[Any], lines: int = 3) -> Table:
    """The summary: one row per index, by index (index, sandbox, phase, exit code, reason, the output's tail)."""
    from rich.text import Text

    t = _table(title=f"batch {name}", title_justify="left")
    for col in ("index", "sandbox", "phase", "exit", "reason"):
        t.add_column(col, no_wrap=True, justify="right" if col in ("index", "exit") else "left")
    t.add_column("output (tail)", overflow="fold")
    for r in sorted(results, key=lambda r: r.index):
        style = "green" if r.phase == "Succeeded" else "red" if r.phase == "Failed" else "yellow"
        t.add_row(str(r.index), r.sandbox or "-", Text(r.phase, style=style),
                  "-" if r.exit_code is None else str(r.exit_code), r.reason or "-",
                  Text(tail_lines(r.output, lines)))  # Text: output is shown as written, never as markup
    return t


def _failed_line(r: Any) -> str:
    code = "" if r.exit_code is None else f", exit {r.exit_code}"
    return f"[red]index {r.index} failed[/red] ({r.reason or r.phase}{code})"


def _counts(ev: Any) -> str:
    failed = f"[red]{ev.failed} failed[/red]" if ev.failed else "0 failed"
    return (f"{ev.phase}: {ev.bound}/{ev.replicas} bound, {ev.running} running, "
            f"[green]{ev.succeeded} ok[/green], {failed}")


@app.command("batch")
def batch(ctx: typer.Context, pool: Annotated[str, typer.Argument(help="WarmPool or Pool to take sandboxes from.")],
          command: Annotated[list[str], typer.Argument(help="After --: one argument, a shell command line; "
                                                            "several: argv. CORRAL_BATCH_INDEX is the index.")],
          replicas: Annotated[int, typer.Option("--replicas", "-n", help="Sandboxes, and tasks.")] = 1,
          env: Annotated[list[str], typer.Option("--env", "-e", help="KEY=VALUE for the tasks.")] = [],  # noqa: B006
          cwd: Annotated[str | None, typer.Option(help="Working directory of the tasks.")] = None,
          timeout: Annotated[int | None, typer.Option(help="Kill a task after this many seconds (it fails).")] = None,
          name: Annotated[str | None, typer.Option(help="Batch name (default: generated).")] = None,
          retain: Annotated[bool, typer.Option(help="Keep each sandbox after its task until the batch is "
                                                    "deleted.")] = False,
          rm: Annotated[bool, typer.Option("--rm", help="Delete the batch once it finished.")] = False,
          lines: Annotated[int, typer.Option(help="Output lines per task in the summary.")] = 3,
          as_json: Annotated[bool, typer.Option("--json", help="Print the finished batch as JSON, no table.")] = False,
          quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No live progress.")] = False) -> None:
    """Run a command in N sandboxes of a pool, one each; live progress, then a summary table. Exits 1 when any task
    failed (non-zero exit, timeout, lost sandbox), 130 on Ctrl-C (the batch is deleted then)."""
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise typer.BadParameter("no command given (corral batch POOL -n N -- CMD)", param_hint="COMMAND")
    cmd: str | list[str] = command[0] if len(command) == 1 else command
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    results: list[Any] = []
    with run_cli(lambda: ctx.obj.client()) as client:
        handle = run_cli(lambda: client.batch(pool, replicas, cmd, env=_env(env), cwd=cwd, timeout=timeout,
                                              name=name, shutdown_policy="Retain" if retain else "Delete"))
        err.print(f"batch {handle.name}: {replicas} task(s) on {pool}", highlight=False)
        progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=err.real(), disable=quiet, transient=False)
        last: Any = None
        try:
            with progress:
                bar = progress.add_task(f"Pending: 0/{replicas} bound", total=replicas)
                for ev in run_cli(handle.events):  # a generator: errors surface while iterating, caught below
                    last = ev
                    if ev.type == "task" and ev.task is not None:
                        results.append(ev.task)
                        if not ev.task.ok and not quiet:
                            progress.console.print(_failed_line(ev.task), highlight=False)
                    progress.update(bar, completed=ev.succeeded + ev.failed, description=_counts(ev))
        except KeyboardInterrupt:
            client.delete_batch(handle.name)
            err.print(f"interrupted: batch {handle.name} deleted", highlight=False)
            raise typer.Exit(130) from None
        except CorralError as exc:
            raise fail(exc) from None
        final = run_cli(handle.refresh) if as_json else None
        if rm:
            run_cli(lambda: client.delete_batch(handle.name))
    if final is not None:
        out.print_json(final.model_dump_json(by_alias=True))
    else:
        out.print(batch_table(handle.name, results, lines))
        if last is not None:
            err.print(f"{last.succeeded} succeeded, {last.failed} failed of {last.replicas} ({last.phase})",
                      highlight=False)
    failed = last.failed if last is not None else 0
    if final is not None:
        failed = final.failed
    raise typer.Exit(1 if failed or (last is not None and last.phase == "Failed") else 0)


@batches_app.command("ls")
def batches_ls(ctx: typer.Context, pool: Annotated[str | None, typer.Option(help="Only this pool's batches.")] = None,
               as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """List batches with their counts."""
    with run_cli(ctx.obj.client) as client:
        items = run_cli(lambda: client.batches(pool))
    if as_json:
        out.print_json(json.dumps([b.model_dump(mode="json", by_alias=True) for b in items]))
        return
    t = _table()
    for col in ("name", "pool", "phase", "replicas", "bound", "running", "succeeded", "failed", "created"):
        t.add_column(col, no_wrap=True, justify="left" if col in ("name", "pool", "phase", "created") else "right")
    for b in items:
        t.add_row(b.name, b.pool, b.phase, str(b.replicas), str(b.bound), str(b.running), str(b.succeeded),
                  str(b.failed), _when(b.created))
    out.print(t)


@batches_app.command("get")
def batches_get(ctx: typer.Context, name: Annotated[str, typer.Argument(help="Batch name.")],
                lines: Annotated[int, typer.Option(help="Output lines per task.")] = 3,
                as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """A batch's results: one row per index with the tail of its task's output."""
    with run_cli(ctx.obj.client) as client:
        b = run_cli(lambda: client.get_batch(name)).info
    if as_json:
        out.print_json(b.model_dump_json(by_alias=True))
        return
    out.print(batch_table(b.name, b.results, lines))
    err.print(f"{b.phase}: {b.succeeded} succeeded, {b.failed} failed, {b.running} running of {b.replicas}",
              highlight=False)


@batches_app.command("rm")
def batches_rm(ctx: typer.Context, names: Annotated[list[str], typer.Argument(help="Batches to delete.")]) -> None:
    """Delete batches (running tasks end with their sandboxes)."""
    _remove(ctx, names, "batch", lambda client, name: client.delete_batch(name))


# --- cp --------------------------------------------------------------------------------------------------------------
def _split(spec: str) -> tuple[str | None, str]:
    """'NAME:/path' -> (NAME, /path); a local path (incl. ./x:y, /x:y) -> (None, path)."""
    if ":" in spec and not spec.startswith((".", "/", "~")):
        name, path = spec.split(":", 1)
        if name and "/" not in name:
            return name, path or "."
    return None, spec


def _progress() -> Progress:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=err.real())


@app.command()
def cp(ctx: typer.Context, source: Annotated[str, typer.Argument(help="Local path or NAME:/path.")],
       destination: Annotated[str, typer.Argument(help="Local path or NAME:/path.")],
       mode: Annotated[str | None, typer.Option(help="Octal mode of an uploaded file, e.g. 0755.")] = None,
       quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False) -> None:
    """Copy a file to or from a sandbox, streamed (constant memory) with a progress bar."""
    (src_claim, src), (dst_claim, dst) = _split(source), _split(destination)
    if (src_claim is None) == (dst_claim is None):
        raise fail(ValueError("exactly one side must be NAME:/path (copy to or from a sandbox)"), 2)
    with run_cli(lambda: ctx.obj.client(timeout=60.0)) as client, _progress() as progress:
        progress.disable = quiet
        if dst_claim is not None:  # upload
            local = Path(src)
            if not local.is_file():
                raise fail(FileNotFoundError(f"{src}: no such file"), 2)
            sbx = run_cli(lambda: client.sandbox(dst_claim))
            if dst.endswith("/") or run_cli(lambda: _is_dir(sbx, dst)):
                dst = str(PurePosixPath(dst) / local.name)
            task = progress.add_task(f"↑ {local.name}", total=local.stat().st_size)
            info = run_cli(lambda: sbx.files.upload(local, dst, mode=mode,
                                                    progress=lambda n: progress.advance(task, n)))
            size = info.size
        else:
            sbx = run_cli(lambda: client.sandbox(src_claim))
            info = run_cli(lambda: sbx.files.info(src))
            target = Path(dst)
            if target.is_dir():
                target = target / PurePosixPath(info.path).name
            task = progress.add_task(f"↓ {target.name}", total=info.size)
            size = run_cli(lambda: sbx.files.download(src, target, progress=lambda n: progress.advance(task, n)))
    if not quiet:
        where = f"{dst_claim}:{dst}" if dst_claim is not None else str(target)
        err.print(f"copied {size} bytes to {where}", highlight=False)


def _is_dir(sbx: Sandbox, path: str) -> bool:
    try:
        return sbx.files.info(path).is_dir
    except CorralError as exc:
        if exc.status == 404:
            return False
        raise


# --- config ----------------------------------------------------------------------------------------------------------
@config_app.command("pulumi")
def config_pulumi(stack: Annotated[str, typer.Option(help="Pulumi stack whose outputs to read.")] = "local",
                  pulumi: Annotated[str, typer.Option(help="The Pulumi command (e.g. scripts/pulumi.sh).")] = "pulumi",
                  cwd: Annotated[str | None, typer.Option(help="The Pulumi project directory.")] = None,
                  path: Annotated[Path | None, typer.Option(
                      help="Config file (default ~/.config/corral/config.toml).")] = None,
                  url: Annotated[str | None, typer.Option(help="Use this address instead of the stack's (e.g. a "
                                                                  "kubectl port-forward).")] = None,
                  ) -> None:
    """Write the config file from `pulumi stack output`: apiUrl (Docker) or apiEndpoint (Kubernetes), apiToken."""
    try:
        url, token = cfg.from_pulumi_outputs(cfg.pulumi_outputs(stack, pulumi=pulumi, cwd=cwd), stack, url)
    except CorralError as exc:
        raise fail(exc) from None
    written = cfg.write_file(url, token, path)
    err.print(f"wrote {written} (api_url = {url})", highlight=False)


@config_app.command("set")
def config_set(url: Annotated[str, typer.Option(help="Claims API URL.")],
               token: Annotated[str, typer.Option(help="Claims API token.")],
               path: Annotated[Path | None, typer.Option(help="Config file.")] = None) -> None:
    """Write the config file from a URL and a token (e.g. the Kubernetes operator's claims API)."""
    err.print(f"wrote {cfg.write_file(url, token, path)}", highlight=False)


@config_app.command("show")
def config_show(ctx: typer.Context) -> None:
    """Where the client will connect, and where that came from (the token is not shown)."""
    try:
        s = cfg.resolve(ctx.obj.url, ctx.obj.token)
    except CorralError as exc:
        raise fail(exc) from None
    out.print(f"api_url = {s.url}\nsource  = {s.source}\nfile    = {cfg.config_path()}", highlight=False)


if __name__ == "__main__":
    sys.exit(app())
