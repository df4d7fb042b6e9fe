"""Checks the literal gin values bound to the entry points against their type annotations.

`train.num_steps = 'abc'` would otherwise fail deep inside the run with
`TypeError: '<' not supported`. `check_entry_point_values` reads the
annotations of the gin-configurable entry points (`train`, and `DecodeConfig`
of `ptmjax eval` / `ptmjax infer`) and raises one line naming the binding, its
value and the type it needs. References (`@adafactor`, `%MACRO`) and types
without a runtime check (protocols, type aliases) are left to the callee.
"""

from __future__ import annotations

import collections.abc
import inspect
import types
import typing
from typing import Any

import gin

ENTRY_POINTS = ("train", "DecodeConfig")


def check_entry_point_values(entry_points: tuple[str, ...] = ENTRY_POINTS) -> None:
    """Raises ValueError for the first literal binding of an entry point that does not fit its annotation."""
    for name in entry_points:
        configurable = gin.get_configurable(name)
        hints = typing.get_type_hints(configurable)
        parameters = inspect.signature(configurable).parameters
        for parameter, value in gin.get_bindings(name, resolve_references=False).items():
            hint = hints.get(parameter)
            if parameter not in parameters or hint is None or _is_reference(value) or fits(value, hint):
                continue
            raise ValueError(
                f"gin binding {name}.{parameter} = {value!r} has type {type(value).__name__}; "
                f"it must be {type_name(hint)}"
            )


def fits(value: Any, hint: Any) -> bool:
    """Whether `value` can be passed where `hint` is annotated (True where the hint has no runtime check)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or _is_reference(value):  # also inside a list: [%MACRO]
        return True
    if hint is None or hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in args)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin in (collections.abc.Mapping, dict):
        key, item = args or (Any, Any)
        return isinstance(value, collections.abc.Mapping) and all(
            fits(k, key) and fits(v, item) for k, v in value.items()
        )
    if origin in (collections.abc.Sequence, list):
        item = args[0] if args else Any
        return (
            isinstance(value, collections.abc.Sequence)
            and not isinstance(value, str)
            and all(fits(v, item) for v in value)
        )
    if origin is collections.abc.Callable:
        return callable(value)
    if isinstance(hint, type) and not _is_protocol(hint):
        return isinstance(value, hint)
    return True


def type_name(hint: Any) -> str:
    """'int', 'str | None', 'Mapping[str, int]': the annotation as a user would write it."""
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(hint))
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "").replace("collections.abc.", "")


def _is_reference(value: Any) -> bool:
    """A gin `@configurable` or `%MACRO` reference: its value is known only when it is called."""
    return isinstance(value, gin.config.ConfigurableReference)


def _is_protocol(hint: type) -> bool:
    return bool(getattr(hint, "_is_protocol", False))
