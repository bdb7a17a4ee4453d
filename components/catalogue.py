"""The template catalogue: Jinja2 files in templates/ rendered into validated SandboxTemplate specs."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import yaml

from corral.api import SandboxTemplateSpec, validate

TEMPLATES_DIR = Path(os.environ.get("CORRAL_TEMPLATES_DIR", Path(__file__).resolve().parents[1] / "templates"))
SUFFIX = ".yaml.j2"


class CatalogueError(ValueError):
    """A catalogue name or parameter is wrong."""


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def names() -> list[str]:
    """Catalogue entries, by name."""
    return sorted(p.name.removesuffix(SUFFIX) for p in TEMPLATES_DIR.glob("*" + SUFFIX))


def parameters(name: str) -> set[str]:
    """The parameters a catalogue entry understands."""
    source = _source(name)
    return jinja2.meta.find_undeclared_variables(_env().parse(source))


def _source(name: str) -> str:
    path = TEMPLATES_DIR / (name + SUFFIX)
    if not path.is_file():
        raise CatalogueError(f"unknown catalogue template {name!r}; known: {', '.join(names())}")
    return path.read_text()


def render(name: str, params: dict[str, Any] | None = None) -> SandboxTemplateSpec:
    """Render a catalogue entry with `params` into a validated spec. Unknown parameters are an error."""
    params = dict(params or {})
    unknown = sorted(set(params) - parameters(name))
    if unknown:
        raise CatalogueError(
            f"catalogue template {name!r} has no parameter(s) {', '.join(unknown)}; "
            f"it takes: {', '.join(sorted(parameters(name)))}"
        )
    try:
        text = _env().get_template(name + SUFFIX).render(**params)
    except jinja2.UndefinedError as exc:
        raise CatalogueError(f"catalogue template {name!r}: {exc}") from None
    return validate(SandboxTemplateSpec, yaml.safe_load(text))
