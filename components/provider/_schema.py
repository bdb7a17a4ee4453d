"""Schema helpers of the component provider: TypedDicts and Enums generated from pydantic models (for a large model
like the chart values, so the mirror cannot drift; their descriptions come from the model's Field descriptions,
filled in by provider(), since generated classes have no source to read docstrings from), and tidy descriptions."""

import inspect
import re
import types
import typing
from enum import Enum
from typing import Any, Literal, NotRequired, TypedDict

from pydantic import BaseModel

MODEL_TYPES: dict[str, type[BaseModel]] = {}
"""Generated TypedDict name -> the pydantic model it mirrors."""
ENUM_TYPES: dict[str, tuple[str, ...]] = {}
"""Generated Enum name -> its values (a Literal of the model)."""


def _enum_member(value: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", value).upper().replace("-", "_")


def _mirror_type(annotation: Any, field: str) -> Any:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return mirror_model(annotation)
    if origin is Literal:
        name = "".join(part.title() for part in field.split("_"))
        if ENUM_TYPES.setdefault(name, args) != args:
            raise TypeError(f"two Literal fields named {field} with different values: name the enum explicitly")
        return Enum(name, {_enum_member(v): v for v in args}, type=str, module=__name__)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        assert len(rest) == 1, f"{field}: unions other than Optional are not supported"
        return _mirror_type(rest[0], field) | None
    if origin is list:  # list[...] and dict[...] of a computed type, spelled so a type checker reads them as values
        return types.GenericAlias(list, (_mirror_type(args[0], field),))
    if origin is dict:
        return types.GenericAlias(dict, (str, _mirror_type(args[1], field)))
    return annotation


def mirror_model(model: type[BaseModel]) -> type:
    """A TypedDict with a pydantic model's fields (snake_case; the schema camelCases them), each NotRequired unless
    the model requires it."""
    hints = typing.get_type_hints(model)
    fields = {name: (_mirror_type(hints[name], name) if f.is_required()
                     else NotRequired[_mirror_type(hints[name], name)])
              for name, f in model.model_fields.items()}
    td = TypedDict(model.__name__, fields)  # type: ignore[misc]
    td.__module__, td.__doc__ = __name__, inspect.cleandoc(model.__doc__ or model.__name__)
    MODEL_TYPES[td.__name__] = model
    return td


def describe(doc: str) -> str:
    """A docstring as a schema description: indentation removed, hard-wrapped lines joined (paragraphs kept)."""
    return re.sub(r"(?<!\n)\n(?!\n)", " ", inspect.cleandoc(doc))


def described(node: Any) -> Any:
    """A schema with every description tidied by describe()."""
    if isinstance(node, dict):
        return {k: describe(v) if k == "description" and isinstance(v, str) else described(v) for k, v in node.items()}
    if isinstance(node, list):
        return [described(v) for v in node]
    return node
