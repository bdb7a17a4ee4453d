"""docker tier: the README's curl lines (Docker host, after "The local stack is the default") run as written with
bash and curl against a local stack's operator container, as DockerStack creates it. The only changes are what a
user's shell supplies: TOKEN in the environment, the test stack's API port for 7780 (a user's stack may own 7780),
and the claim name the first line printed for `<name>`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from operator_harness import REPO

pytestmark = pytest.mark.docker

CREATE = 'curl -s -H "Authorization: Bearer $TOKEN" -X POST localhost:7780/v1/claims'


def readme_curl_lines() -> list[str]:
    """The curl lines (continuations joined) of the README's fenced sh block that creates a claim."""
    blocks = re.findall(r"^```sh\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.DOTALL | re.MULTILINE)
    (block,) = [b for b in blocks if CREATE in b]
    lines = re.sub(r"\\\n", " ", block).splitlines()  # a backslash-newline is a continuation, as bash reads it
    return [line.strip() for line in lines if line.lstrip().startswith("curl ")]


def run(line: str, token: str) -> str:
    proc = subprocess.run(["bash", "-c", line], env={**os.environ, "TOKEN": token}, capture_output=True, text=True,
                          timeout=180, check=False)
    assert proc.returncode == 0, f"{line}\nexit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_readme_curl_lines_run_as_written(local_stack):  # noqa: F811 - the fixture
    if not shutil.which("curl"):
        pytest.fail("curl is missing: apt-get install curl", pytrace=False)
    lines = readme_curl_lines()
    assert len(lines) == 2, f"expected the create and the command lines, got {lines}"
    create, command = (line.replace("localhost:7780", f"localhost:{local_stack.op.port}") for line in lines)
    assert CREATE.replace("7780", str(local_stack.op.port)) in create and "<name>" in command

    out = run(create, local_stack.token)
    claim = json.loads(out)  # the body is JSON whatever curl's Content-Type was (-d sends a form type)
    assert claim.get("name") and claim.get("phase") == "Ready", out
    try:
        out = run(command.replace("<name>", claim["name"]), local_stack.token)
        result = json.loads(out)
        assert result.get("stdout") == "42\n", out
    finally:
        with local_stack.op.http() as http:
            http.delete(f"/v1/claims/{claim['name']}")
