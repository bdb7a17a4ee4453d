"""docker tier fixtures for the Docker runtime: a started operator of a throwaway stack (operator_harness.py), and a
sweep of everything that stack made."""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from client_harness import local_stack as local_stack  # the client tests' module-scoped stack, one per module
from operator_harness import REPO, Operator, desired_state, free_port, list_containers  # noqa: F401

from corral.operator.docker import engine

# REPO and free_port are re-exported: with several conftest.py files, the one loaded last is the module `conftest`,
# and other tiers' tests do `from conftest import REPO` (execd's: free_port).


@pytest.fixture
def make_operator(docker_client, tmp_path):
    """make_operator(warm={...}, pools=[...]) -> a started Operator; everything of its stack is removed after."""
    made: list[Operator] = []

    def make(*, start: bool = True, **kw: Any) -> Operator:
        stack = f"t{secrets.token_hex(3)}"
        op = Operator(client=docker_client, desired=desired_state(stack, **kw), workdir=tmp_path / stack)
        op.workdir.mkdir()
        made.append(op)
        return op.start() if start else op

    yield make
    for op in made:
        op.stop()
        op.sweep()
        left = stack_containers(docker_client, op.stack)
        assert not left, f"containers of stack {op.stack} left behind: {[c.name for c in left]}"


def stack_containers(client: Any, stack: str) -> list[Any]:
    return list_containers(client, [f"{engine.L_STACK}={stack}"])
