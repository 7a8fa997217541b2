"""Dataclass trees from YAML-shaped data: every value checked against its annotation.

A mistake is a :class:`UserError` naming the source and the dotted key (``train.lr: expected a
number, got 'fast'``); unknown keys are refused with the known ones listed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from omnilearn.errors import UserError


def type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def coerce(value: Any, tp: Any, key: str, where: str) -> Any:
    """Check ``value`` against the annotation ``tp``; ints are accepted where floats are expected."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(value, a, key, where)
            except UserError as err:
                errors.append(err)
        raise UserError(f"{where}: {key}: expected {' or '.join(type_name(a) for a in args)}, "
                        f"got {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{where}: {key}: expected a list, got {value!r}")
        return [coerce(v, args[0], f"{key}[{i}]", where) for i, v in enumerate(value)] if args else value
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{where}: {key}: expected a mapping, got {value!r}")
        return {str(k): coerce(v, args[1], f"{key}.{k}", where) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: {key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: {key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: {key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: {key}: expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        return build_dataclass(tp, value, key, where)
    raise AssertionError(f"unsupported config type {tp} for {key}")


def build_dataclass(cls: type, data: Any, prefix: str, where: str) -> Any:
    if not isinstance(data, dict):
        raise UserError(f"{where}: {prefix or 'top level'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.name != "source"]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            raise UserError(f"{where}: unknown key '{dotted}' (known: {', '.join(names)})")
        kwargs[key] = coerce(value, hints[key], dotted, where)
    return cls(**kwargs)
