"""A random token made once and kept in the stack's state (a Pulumi dynamic resource): the Docker stack's claims API
token, and ControllerDeployment's execd-token key and API token."""

from __future__ import annotations

import secrets
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider

from ._dynamic import Resource


class TokenProvider(ResourceProvider):
    serialize_as_secret_always = False

    def create(self, props: dict[str, Any]) -> CreateResult:
        token = secrets.token_urlsafe(32)
        return CreateResult(f"token-{secrets.token_hex(4)}", {"token": token})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=False)


class ApiToken(Resource):
    token: pulumi.Output[str]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None):
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["token"]))
        super().__init__(TokenProvider(), name, {"token": None}, opts)
