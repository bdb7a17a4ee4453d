"""Reuse only Corral's DockerStack: one template from the catalogue, one warm pool and the claims API on this
machine's Docker Engine, under its own stack label so it never touches another Corral on the same host.

    pulumi up && curl -H "Authorization: Bearer $(pulumi stack output apiToken --show-secrets)" \
        -X POST "$(pulumi stack output apiUrl)/v1/claims" -d '{"pool": "shell"}'
"""

import pulumi

from corral.components import DockerStack, DockerStackArgs
from corral.components.catalogue import render

config = pulumi.Config()
stack = DockerStack("sandboxes", DockerStackArgs(
    stack=f"example-{pulumi.get_stack()}",
    templates={"shell": render("shell", {"memory": "128Mi"}).to_k8s()},
    warm_pools=[{"name": "shell", "template": "shell", "replicas": 1}],
    api_port=config.get_int("apiPort") or 7790,
))

pulumi.export("apiUrl", stack.api_url)
pulumi.export("apiToken", stack.api_token)
