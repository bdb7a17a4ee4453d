"""Corral's dynamic resources (DockerStack's Docker objects, the generated tokens), run by the Python that runs Corral.

A Pulumi dynamic resource is registered as `pulumi-python:dynamic:Resource`, and the engine runs its CRUD in the
`pulumi-resource-pulumi-python` plugin, a script that starts `$PULUMI_RUNTIME_VIRTUALENV/bin/python` (the
program's own `virtualenv` runtime option), else `$PULUMI_PYTHON_CMD`, else `python3` on PATH. That is right for a
Python program, whose venv holds Corral. It is wrong when the components run inside the component provider
(components/provider) for a YAML, TypeScript or Go program: that program has no Python options, so the dynamic
provider would run whatever `python3` is on PATH, which usually has neither `pulumi` nor Corral. The engine gives the
component provider no say over how it starts another plugin.

So inside the component provider (serve_here(), called by its main()) these resources are registered as
`corral:dynamic:Resource` at the provider's own version: the engine sends their check/diff/create/read/update/delete
to the `corral` provider itself, which runs them with the same pickled ResourceProvider objects, in its own
interpreter (components/provider/_crud.py). In a Python program nothing changes.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi.dynamic

from ._version import __version__

PACKAGE = "corral"
_served_here = False


def serve_here() -> None:
    """From now on, this process's dynamic resources are served by the `corral` provider (the component provider's
    process calls this before it serves)."""
    global _served_here
    _served_here = True


class _Register(pulumi.CustomResource):
    """Sits between pulumi.dynamic.Resource and CustomResource in the MRO: renames the type when serve_here() was
    called, so everything else (the pickled provider in `__provider`, secrets) stays the SDK's."""

    def __init__(self, t: str, name: str, props: Any = None, opts: pulumi.ResourceOptions | None = None,
                 **kwargs: Any) -> None:
        if _served_here and t.startswith("pulumi-python:"):
            t = f"{PACKAGE}:{t.removeprefix('pulumi-python:')}"
            # The same version as the components: the engine hands both to one default `corral` provider.
            opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(version=__version__))
        super().__init__(t, name, props, opts, **kwargs)


class Resource(pulumi.dynamic.Resource, _Register):
    """pulumi.dynamic.Resource, served by the component provider when Corral runs inside it (see the module)."""
