"""docker tier: the SDK against a real operator container (as DockerStack creates it) on the real engine: the
README's Python examples run as written; errors come back as typed exceptions with the server's message; the async
client's commands, files, terminals and lifecycle calls."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from client_harness import code_blocks, readme_section

from corral.client import (
    AsyncClient,
    ClaimFailed,
    Client,
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    NotReady,
    TransportError,
    Unauthorized,
)

pytestmark = pytest.mark.docker


def test_readme_sdk_examples_run_as_written(local_stack):
    blocks = code_blocks(readme_section(), "python")
    assert len(blocks) == 2, "the README's SDK section should have the sync and the async example"
    before = {c.name for c in Client(local_stack.url, local_stack.token).claims()}
    outputs = []
    for block in blocks:
        proc = subprocess.run([sys.executable, "-c", block], env=local_stack.env(), capture_output=True, text=True,
                              timeout=600, cwd="/")
        assert proc.returncode == 0, f"README example failed:\n{block}\n--- stderr ---\n{proc.stderr[-3000:]}"
        outputs.append(proc.stdout)
    sync_out, async_out = outputs
    assert "'python': " in sync_out.splitlines()[0]
    assert "0 hello from Python 3." in sync_out
    assert "stdout 1\nstdout 2\nstdout 3\n" in sync_out
    assert "['main.py']" in sync_out
    assert "404 not_found No such file or directory: /workspace/missing.txt" in sync_out
    assert async_out.startswith(f"corral-snapshot/{local_stack.op.stack}:")
    # Both examples released their claims on exit.
    assert {c.name for c in Client(local_stack.url, local_stack.token).claims()} == before


def test_errors_are_typed_with_the_servers_message(local_stack):
    with Client(local_stack.url, "wrong-token") as bad, pytest.raises(Unauthorized) as exc:
        bad.pools()
    assert exc.value.status == 401 and exc.value.message == "missing or wrong bearer token"
    with Client(local_stack.url, local_stack.token) as client:
        with pytest.raises(NotFound) as exc:
            client.claim(pool="nope")
        assert exc.value.message == "no WarmPool or Pool named 'nope'" and exc.value.code == "not_found"
        with pytest.raises(NotFound, match="no claim named 'ghost'"):
            client.sandbox("ghost")
        with pytest.raises(InvalidRequest) as exc:  # the shell template's envVarsInjectionPolicy is Disallowed
            client.claim(pool="shell", env={"A": "b"})
        assert exc.value.status == 400 and "env" in exc.value.message.lower()
        with client.claim(pool="python", ttl=600) as sbx:
            with pytest.raises(Forbidden) as exc:
                sbx.files.read("/etc/passwd")  # outside execd's roots
            assert exc.value.status == 403 and "/etc/passwd" in exc.value.message
            sbx.files.write("/workspace/a", b"1")
            sbx.files.write("/workspace/b", b"2")
            with pytest.raises(Conflict) as exc:
                sbx.files.move("/workspace/a", "/workspace/b")
            assert exc.value.code == "exists" and not isinstance(exc.value, NotReady)
            assert sbx.pause().phase == "Paused"
            with pytest.raises(NotReady) as exc:
                sbx.commands.run("true")
            assert exc.value.message == f"claim {sbx.name} is Paused, not Ready"
            assert sbx.resume().phase == "Ready"
            assert sbx.commands.run("cat /workspace/b").stdout == "2"
            # A claim that is not Ready within its timeout is a ClaimFailed, and is released, not left behind.
            image = sbx.snapshot().image
        with pytest.raises(ClaimFailed, match="not Ready within 0 s") as exc:
            client.claim(pool="python", snapshot=image, timeout=0)  # a snapshot claim is always a cold start
        assert exc.value.claim.name not in {c.name for c in client.claims()}
        assert client.release(sbx.name) is False  # released by the with block already
    with Client("http://127.0.0.1:9", "t", retry=None) as nobody, pytest.raises(TransportError):
        nobody.pools()


async def test_async_client_commands_files_terminal_and_lifecycle(local_stack):
    async with AsyncClient(local_stack.url, local_stack.token) as client:
        pools = {p.name: p for p in await client.pools()}
        assert pools["python"].kind == "WarmPool" and pools["python"].desired == 2
        assert pools["shell"].kind == "Pool" and pools["shell"].template == "shell"
        async with client.claim(pool="python", env={"WHO": "async"}, ttl=300) as sbx:
            assert (await client.pools()) and sbx.claim.launch_type in ("warm", "cold")
            results = await asyncio.gather(*(sbx.commands.run(f"echo $WHO-{i}") for i in range(8)))
            assert [r.stdout for r in results] == [f"async-{i}\n" for i in range(8)]
            bad = await sbx.commands.run(["sh", "-c", "printf '\\377'; echo oops >&2; exit 9"])
            assert bad.exit_code == 9 and bad.stdout_bytes == b"\xff" and bad.stderr == "oops\n"
            slow = await sbx.commands.run("sleep 30", timeout=0.5)
            assert slow.timed_out and slow.exit_code != 0

            stream = await sbx.commands.stream("for i in 1 2 3; do echo $i; echo e$i >&2; done; exit 4")
            chunks = [o async for o in stream]
            assert b"".join(o.data for o in chunks if o.stream == "stdout") == b"1\n2\n3\n"
            assert b"".join(o.data for o in chunks if o.stream == "stderr") == b"e1\ne2\ne3\n"
            assert stream.exit_code == 4 and stream.id

            job = await sbx.commands.background("echo started; sleep 60")
            while not (logs := await job.logs()):
                await asyncio.sleep(0.05)
            assert logs[0].text == "started\n"
            killed = await job.kill()
            assert killed.interrupted and not killed.running

            files = sbx.files
            await files.mkdir("/workspace/d/e")
            await files.write("/workspace/d/e/x.txt", "hello world")
            assert await files.replace("/workspace/d/e/x.txt", "world", "there") == 1
            assert await files.read_text("/workspace/d/e/x.txt") == "hello there"
            found = await files.search("/workspace", "**/*.txt")
            assert [m.path for m in found.matches] == ["/workspace/d/e/x.txt"] and not found.truncated
            names = [e.path for e in await files.list("/workspace", depth=3, page_size=1)]  # 1 per page: cursors
            assert names == ["/workspace/d", "/workspace/d/e", "/workspace/d/e/x.txt"]
            with pytest.raises(Conflict):
                await files.remove("/workspace/d")  # not empty
            await files.remove("/workspace/d", recursive=True)
            assert not await files.exists("/workspace/d")

            async with sbx.pty("sh", cols=80, rows=24) as term:
                await term.write("stty size\n")
                assert b"24 80" in await term.read_until("24 80", timeout=30)
                await term.resize(132, 43)
                await term.write("stty size; exit 6\n")
                assert b"43 132" in await term.read_until("43 132", timeout=30)
                assert await term.wait(timeout=30) == 6
            renewed = await sbx.renew(3600)
            assert renewed.expires_at > sbx.claim.created
        assert await client.release(sbx.name) is False
