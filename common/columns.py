"""Column-wise wire encoding for long lists of small records (a snapshot's nodes and shapes).

Why: a list of 10,000 ``NodeInfo`` maps repeats every key 10,000 times and every ``state`` /
``native_state`` / feature string as often; as msgpack that is ~2.6 MB and ~30 ms to decode
and validate. Written as columns — one list per field, a field left out when every record has
its default, and low-cardinality values (states, feature lists, partitions) written once in a
table and referred to by index — the same nodes are a fraction of the size, and the records are
rebuilt and validated in one ``TypeAdapter`` call.

Format (a msgpack map)::

    {"n": 3,                                   # number of records
     "name": ["w1", "w2", "w3"],               # a plain column: one value per record
     "state": {"t": ["free", "busy"], "i": [0, 1, 0]},   # an interned column: table + indexes
     ...}                                      # fields absent here take their default

Everything is validated as the verbose form would be (each field's type and constraints,
strict); a malformed column (wrong length, bad index, wrong type) is a ``ValueError`` naming
the field. Fields a newer sender added are ignored, as in the verbose form.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from itertools import repeat
from operator import attrgetter, itemgetter, methodcaller, setitem
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

#: Immutable value types a column may share among records when every record has the same one.
#: Not float: a strict float column may also hold ints, and 1 == 1.0 would make them one.
_SHAREABLE = frozenset({str, int, bool, type(None)})


@cache
def _adapter(cls: type[BaseModel]) -> TypeAdapter:
    return TypeAdapter(list[cls])  # type: ignore[valid-type]


@cache
def _defaults(cls: type[BaseModel]) -> dict[str, Any]:
    out = {}
    for name, f in cls.model_fields.items():
        if not f.is_required():
            out[name] = f.get_default(call_default_factory=True)
    return out


@contextmanager
def gc_paused() -> Iterator[None]:
    """Building many small containers triggers the cyclic GC over and over (20–25 % of a big
    decode); none of them form cycles, so pause it for the duration."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def encode_columns(records: Sequence[BaseModel], cls: type[BaseModel], intern: frozenset[str]) -> dict[str, Any]:
    """Records → the column map described in the module docstring."""
    n = len(records)
    out: dict[str, Any] = {"n": n}
    if not n:
        return out
    defaults = _defaults(cls)
    names = tuple(cls.model_fields)
    # One C call per record takes its values in field order (whatever the order of its map),
    # and one ``zip`` turns the rows into columns.
    getter = itemgetter(*names) if len(names) > 1 else lambda d: (d[names[0]],)
    rows = map(getter, map(attrgetter("__dict__"), records))
    for name, column in zip(names, zip(*rows, strict=True), strict=True):
        values = list(column)
        if name in defaults and values.count(defaults[name]) == n:
            continue
        if name in intern:
            keys = list(map(tuple, values)) if isinstance(values[0], list) else values
            table = {k: i for i, k in enumerate(dict.fromkeys(keys))}
            if len(table) * 2 < n:
                out[name] = {"t": [list(k) if isinstance(k, tuple) else k for k in table],
                             "i": list(map(table.__getitem__, keys))}
                continue
        out[name] = values
    return out


@cache
def _column_adapter(cls: type[BaseModel], name: str) -> TypeAdapter:
    """``list[<the field's type and constraints>]``, strict: one call validates a whole column
    exactly as the model would validate each record's field."""
    f = cls.model_fields[name]
    item = Annotated[(f.annotation, *f.metadata)] if f.metadata else f.annotation
    return TypeAdapter(list[item], config=ConfigDict(strict=True))  # type: ignore[valid-type]


_INDEXES = TypeAdapter(list[Annotated[int, Field(ge=0)]], config=ConfigDict(strict=True))


def _column(cls: type[BaseModel], name: str, col: Any, n: int, what: str) -> list[Any]:
    adapter = _column_adapter(cls, name)
    try:
        if isinstance(col, dict):
            table, index = col.get("t"), col.get("i")
            if not isinstance(table, list) or not isinstance(index, list):
                raise ValueError(f"{what}.{name}: an interned column needs a table 't' and indexes 'i'")
            table = adapter.validate_python(table)
            index = _INDEXES.validate_python(index)
            if index and max(index) >= len(table):
                raise ValueError(f"{what}.{name}: index outside its table")
            if table and isinstance(table[0], list):
                col = list(map(list, map(table.__getitem__, index)))  # every record its own list
            else:
                col = list(map(table.__getitem__, index))
        elif isinstance(col, list):
            col = adapter.validate_python(col)
        else:
            raise ValueError(f"{what}.{name}: expected a list of values or an interned column")
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{what}.{name}[{'.'.join(str(p) for p in err['loc'])}]: {err['msg']}") from None
    if len(col) != n:
        raise ValueError(f"{what}.{name}: expected {n} values, got {len(col)}")
    return col


def decode_columns(doc: Any, cls: type[BaseModel], what: str) -> list[Any]:
    """The column map → records; ``ValueError`` naming ``what`` and the field when malformed.

    Each column is validated in one call with the field's own type and constraints (strict),
    which is the whole of the model's validation (these models have no cross-field
    validators); the records are then assembled without validating them a second time, with
    pydantic's documented instance attributes (``__dict__``, ``__pydantic_fields_set__``,
    ``__pydantic_extra__``, ``__pydantic_private__``). ``tests/common/test_columns.py`` checks
    the result equals ``model_validate`` of the verbose form, so a pydantic change that breaks
    this fails there."""
    if not isinstance(doc, dict):
        raise ValueError(f"{what}: expected a list of records or a column map, got {type(doc).__name__}")
    n = doc.get("n")
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise ValueError(f"{what}.n: expected the number of records (an integer >= 0)")
    if n == 0:
        return []
    defaults = _defaults(cls)
    template: dict[str, Any] = {}  # every record's map starts as a copy of this (field order)
    filled: list[tuple[str, list[Any]]] = []  # then these columns are written into the copies
    with gc_paused():
        for name, f in cls.model_fields.items():
            if name in doc:
                col = _column(cls, name, doc[name], n, what)
                first = col[0]
                if type(first) in _SHAREABLE and col.count(first) == n:
                    template[name] = first  # one immutable value in every record: no per-record write
                else:
                    template[name] = None
                    filled.append((name, col))
            elif name not in defaults:
                raise ValueError(f"{what}.{name}: required column missing")
            elif f.default_factory is not None:
                template[name] = None
                filled.append((name, [f.default_factory() for _ in range(n)]))  # type: ignore[call-arg]
            else:
                template[name] = defaults[name]  # immutable default: shared, as pydantic shares it
        # Every step below is a C-level map over the records: no bytecode runs per record
        # (the records are the bulk of a big snapshot's decode). Copying a prepared map and
        # writing the columns into the copies is twice as fast as ``dict(zip(names, row))`` per
        # record, and fields left at their default cost nothing per record.
        dicts = list(map(dict.copy, repeat(template, n)))
        for name, col in filled:
            _drain(map(setitem, dicts, repeat(name, n), col))
        out = list(map(cls.__new__, repeat(cls, n)))
        slots = BaseModel.__dict__
        _drain(map(slots["__dict__"].__set__, out, dicts))
        _drain(map(slots["__pydantic_fields_set__"].__set__, out, repeat(set(template), n)))
        _drain(map(slots["__pydantic_extra__"].__set__, out, repeat(None, n)))
        _drain(map(slots["__pydantic_private__"].__set__, out, repeat(None, n)))
        return out


def _drain(calls: Iterator[Any]) -> None:
    """Run a lazy ``map`` of calls for their effect, in C (``deque`` with no room keeps nothing)."""
    deque(calls, maxlen=0)


_ABSENT = object()


def validate_nodes(rows: list[dict[str, Any]]) -> list[Any]:
    """Many ``NodeInfo`` maps (a parser builds plain maps, not models) → models, validated
    column by column like a decoded snapshot (``decode_columns``): one strict validation call
    per field over all rows, then records assembled without validating them again — half the
    time of validating 10,000 maps as models one by one. A field a row leaves out takes its
    default; keys that are not fields are ignored (as ``extra="ignore"`` does); a bad value is a
    ``ValueError`` naming the field and the row."""
    from epu.common.messages import NodeInfo

    return validate_records(rows, NodeInfo, "nodes")


def validate_records(rows: list[dict[str, Any]], cls: type[BaseModel], what: str) -> list[Any]:
    """``rows`` (maps) → ``cls`` records, validated column-wise (see ``validate_nodes``)."""
    n = len(rows)
    doc: dict[str, Any] = {"n": n}
    if not n:
        return []
    key_orders = set(map(tuple, rows))
    if len(key_orders) == 1 and "n" not in rows[0]:  # the usual case (one dict literal per parser): transpose in C
        doc.update(zip(next(iter(key_orders)), map(list, zip(*map(dict.values, rows), strict=True)), strict=True))
        return decode_columns(doc, cls, what)
    for name, f in cls.model_fields.items():
        col = list(map(methodcaller("get", name, _ABSENT), rows))
        if col.count(_ABSENT) == n:
            continue  # absent everywhere: decode_columns fills the default (or says it is required)
        if _ABSENT in col:
            if f.is_required():
                raise ValueError(f"{what}[{col.index(_ABSENT)}].{name}: field required")
            col = [f.get_default(call_default_factory=True) if v is _ABSENT else v for v in col]
        doc[name] = col
    return decode_columns(doc, cls, what)


def replace_field_each(records: Sequence[BaseModel], name: str, values: Sequence[Any]) -> list[Any]:
    """``[replace_fields(r, **{name: v}) for r, v in zip(records, values)]`` in one loop with the
    slot setters bound once: the sensor stamps ``state_since`` on every node of a read (10,000
    calls of ``replace_fields`` were ~10 % of a big Slurm read)."""
    slots = BaseModel.__dict__
    set_dict = slots["__dict__"].__set__
    set_fields = slots["__pydantic_fields_set__"].__set__
    set_extra = slots["__pydantic_extra__"].__set__
    set_private = slots["__pydantic_private__"].__set__
    added = {name}
    out = []
    append = out.append
    for record, value in zip(records, values, strict=True):
        cls = type(record)
        new = cls.__new__(cls)
        d = record.__dict__.copy()
        d[name] = value
        set_dict(new, d)
        set_fields(new, record.__pydantic_fields_set__ | added)
        set_extra(new, record.__pydantic_extra__)
        set_private(new, record.__pydantic_private__)
        append(new)
    return out


def replace_fields(record: BaseModel, **update: Any) -> Any:
    """``record`` with some fields replaced, without validating again: for values the caller
    built with the right types (e.g. a float timestamp). ~1 µs where ``model_copy`` takes ~7."""
    cls = type(record)
    new = cls.__new__(cls)
    slots = BaseModel.__dict__
    slots["__dict__"].__set__(new, {**record.__dict__, **update})
    slots["__pydantic_fields_set__"].__set__(new, record.__pydantic_fields_set__ | update.keys())
    slots["__pydantic_extra__"].__set__(new, record.__pydantic_extra__)
    slots["__pydantic_private__"].__set__(new, record.__pydantic_private__)
    return new


# ------------------------------------------------------------------ a snapshot's owners
#: ``[[owner, [job id, ...]], ...]``: the grouped wire form of ``SensorSnapshot.owners``.
_OWNER_GROUPS = TypeAdapter(list[list[list[str]]], config=ConfigDict(strict=True))


def encode_owners(owners: dict[str, list[str]]) -> list[list[Any]]:
    """``SensorSnapshot.owners`` (running job id → [account, user, partition]) → one entry
    ``[owner, [job id, ...]]`` per distinct owner, in first-seen order.

    Why: the plain map repeats the owner of every running job — at 20,000 running jobs (the
    10,000-node bench site) ~0.47 MiB, which took the snapshot from 0.79 to 1.26 MiB (goal ≤ 1
    MiB) and its decode past its budget; a site has a few hundred distinct owners, so the groups
    cost little more than the job ids themselves. The inverse is ``decode_owners``;
    ``tests/common/test_columns.py`` checks the round trip against the plain map."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for job, owner in owners.items():
        key = tuple(owner)
        ids = groups.get(key)
        if ids is None:
            groups[key] = [job]
        else:
            ids.append(job)
    return [[list(k), ids] for k, ids in groups.items()]


def decode_owners(doc: Any) -> dict[str, list[str]]:
    """The grouped form → the plain map, validated (strict, as ``dict[str, list[str]]`` is);
    ``ValueError`` naming ``owners`` when malformed or when a job id appears twice (the map has
    one owner per job). Jobs of one group share one list (the snapshot only reads it, as the
    sensors' own maps share it)."""
    try:
        groups = _OWNER_GROUPS.validate_python(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"owners[{'.'.join(str(p) for p in err['loc'])}]: {err['msg']}") from None
    out: dict[str, list[str]] = {}
    n = 0
    if any(len(g) != 2 for g in groups):
        raise ValueError("owners: each entry is [owner, [job id, ...]]")
    for owner, ids in groups:
        out.update(dict.fromkeys(ids, owner))
        n += len(ids)
    if len(out) != n:
        raise ValueError("owners: a job id appears more than once")
    return out
