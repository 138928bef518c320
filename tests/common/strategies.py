"""Hypothesis strategies for every registered message type, built from the models' own fields.

Built by introspection so a new message type or field is covered without editing this file:
patterns, bounds, literals, optionals, nested models, lists and dicts are honoured.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any, Literal

from annotated_types import Ge, MaxLen, MinLen
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**31), 2**31),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20))


def _constraints(meta: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    flat: list[Any] = []
    for m in meta:
        flat.extend(m.metadata if isinstance(m, FieldInfo) else [m])
    for m in flat:
        if isinstance(m, Ge):
            out["ge"] = m.ge
        elif isinstance(m, MinLen):
            out["min_length"] = m.min_length
        elif isinstance(m, MaxLen):
            out["max_length"] = m.max_length
        pattern = getattr(m, "pattern", None)
        if pattern:
            out["pattern"] = pattern
        for attr in ("min_length", "max_length"):
            v = getattr(m, attr, None)
            if v is not None:
                out.setdefault(attr, v)
    return out


def for_annotation(ann: Any, meta: list[Any] | None = None) -> st.SearchStrategy[Any]:
    meta = list(meta or [])
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(ann)
        return for_annotation(base, meta + extra)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*[for_annotation(a, meta) for a in typing.get_args(ann)])
    if ann is type(None):
        return st.none()
    if origin is Literal:
        return st.sampled_from(typing.get_args(ann))
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        return st.sampled_from(list(ann))
    if origin is list:
        (item,) = typing.get_args(ann)
        return st.lists(for_annotation(item), max_size=3)
    if origin is dict:
        _k, v = typing.get_args(ann)
        return st.dictionaries(st.text(min_size=1, max_size=8), for_annotation(v), max_size=3)
    c = _constraints(meta)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return model_strategy(ann)
    if ann is bool:
        return st.booleans()
    if ann is int:
        return st.integers(min_value=c.get("ge", -(2**40)), max_value=2**40)
    if ann is float:
        return st.floats(min_value=0, max_value=2e9, allow_nan=False)
    if ann is str:
        if "pattern" in c:
            s = st.from_regex(c["pattern"], fullmatch=True)
            if "max_length" in c:
                s = s.filter(lambda x: len(x) <= c["max_length"])
            return s
        return st.text(min_size=c.get("min_length", 0), max_size=min(c.get("max_length", 40), 40))
    if ann is Any:
        return SCALARS
    raise NotImplementedError(f"no strategy for {ann!r}")


def field_strategy(info: FieldInfo) -> st.SearchStrategy[Any]:
    return for_annotation(info.annotation, info.metadata)


def model_strategy(cls: type[BaseModel]) -> st.SearchStrategy[Any]:
    fields = {name: field_strategy(info) for name, info in cls.model_fields.items()}
    return st.fixed_dictionaries(fields).map(lambda kw: _valid(cls, kw)).filter(lambda m: m is not None)


def _valid(cls: type[BaseModel], kw: dict[str, Any]) -> BaseModel | None:
    """The model of ``kw``, or None when the model's own validators refuse the combination (a
    terminate whose proof contradicts its flags): such a body is bad input, not a message."""
    try:
        return cls(**kw)
    except ValidationError:
        return None
