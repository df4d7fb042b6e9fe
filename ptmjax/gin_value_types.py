"""Checks every literal gin value bound against the type annotation of its parameter.

`train.num_steps = 'abc'` or `rsqrt_with_warmup.peak_learning_rate = 'x'`
would otherwise fail deep inside the run (a 50-line JAX traceback, after
the run started writing). `check_bound_values` reads the annotations of every
ptmjax configurable with bindings (functions, classes, dataclasses; scoped
bindings too) and raises one line naming the binding, its value and the type it needs.
References (`@adafactor`, `%MACRO`) and types without a runtime check
(protocols, type aliases) are left to the callee.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import types
import typing
from typing import Any

import gin


def check_bound_values() -> None:
    """Raises ValueError for the first literal binding that does not fit its parameter's annotation."""
    for (scope, selector), bindings in sorted(gin.config._CONFIG.items()):  # gin has no public iterator
        configurable = gin.get_configurable(selector)
        if not getattr(configurable, "__module__", "").startswith("ptmjax"):
            continue  # another library's annotations (optax's ScalarOrSchedule) are left to it
        hints, parameters = _annotations(configurable)
        for parameter, value in bindings.items():
            hint = hints.get(parameter)
            if parameter not in parameters or hint is None or _is_reference(value) or fits(value, hint):
                continue
            raise ValueError(
                f"gin binding {scope + '/' if scope else ''}{selector.rpartition('.')[2]}.{parameter} = {value!r} "
                f"has type {type(value).__name__}; it must be {type_name(hint)}"
            )


def _annotations(configurable: Any) -> tuple[dict[str, Any], Any]:
    """(parameter -> annotation, the parameters) of a configurable function or class; no annotations where
    they do not resolve (names only imported for type checking)."""
    target = configurable.__init__ if isinstance(configurable, type) and not dataclasses.is_dataclass(
        configurable) else configurable
    try:
        return typing.get_type_hints(target), inspect.signature(configurable).parameters
    except (NameError, TypeError, ValueError):
        return {}, {}


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
