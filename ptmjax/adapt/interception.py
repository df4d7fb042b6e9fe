"""Adapting a model by Flax method interception: the machinery LoRA, adapters, prompt and prefix tuning share.

`adapted(model, settings)` returns the model as a subclass of its own class
(so `model_api`'s family lookup, gin and decoding treat it as the model it
was) with one more field, `settings.field` (e.g. 'lora'), holding `settings`,
and every entry method (`__call__`, `encode`, `decode`, `hidden_states`, ...:
every public method, so decoding's `method=` calls too) run under a Flax
method interceptor. One class per (base class, settings type), so equal
adapted models compare equal (a jit static argument does not recompile).

A settings type is a frozen dataclass with the class variables `field`,
`class_prefix` and `title` (the method's name in messages), and a `start(model, arguments)` method that returns the call
in progress: an object with `intercept(next_fun, args, kwargs, context)` (the
interceptor, which sees every module method call under the entry call) and
`finish(model)` (after the entry call). `current_call(settings_type)` gives
it to code running under the entry call. Methods of different settings types
stack: adapting an adapted model intercepts with both.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, Protocol

import flax.linen as nn


class Call(Protocol):
    """One entry call of an adapted model in progress."""

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any: ...

    def finish(self, model: nn.Module) -> None: ...


_CALLS: contextvars.ContextVar[dict[type, Call] | None] = contextvars.ContextVar("ptmjax_adapt_calls", default=None)


def adapted(model: nn.Module, settings: Any) -> nn.Module:
    """`model` as a subclass of its class with `settings` in the field `settings.field` (module docstring)."""
    kind = type(settings)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"{kind.field} needs a Flax module to adapt, got {type(model).__name__}; e.g. {kind.field}.model = @GPT2()"
        )
    if settings_of(model, kind) is not None:
        raise ValueError(f"{type(model).__name__} already has {kind.title}; apply {kind.field} to the base model once.")
    return _adapted_class(type(model), kind)(**_fields(model, type(model)), **{kind.field: settings})


def settings_of(model: nn.Module, kind: type) -> Any:
    """The settings of type `kind` a model adapted by them holds, else None."""
    settings = getattr(model, kind.field, None)
    return settings if isinstance(settings, kind) else None


def base_model(model: nn.Module, kind: type) -> nn.Module:
    """The model under an adapted `model` whose settings are of type `kind`."""
    if settings_of(model, kind) is None:
        raise ValueError(f"{type(model).__name__} is not a {kind.field} model (it has no {kind.field} field).")
    base = type(model).__bases__[0]
    return base(**_fields(model, base))


@dataclasses.dataclass
class DenseTargets:
    """Which Dense modules a call of an adapted model targets: the paths it has seen, how many `targets` (a
    regex over '/'-joined module paths) matched, and the error when none did."""

    targets: str
    setting: str  # how the user set `targets`, for the error, e.g. 'lora targets'
    seen: list[str] = dataclasses.field(default_factory=list)
    targeted: int = 0

    def match(self, module: nn.Module) -> str | None:
        """The module's path if `targets` fully matches it, else None (the path is recorded either way)."""
        path = "/".join(module.scope.path)
        self.seen.append(path)
        if not re.fullmatch(self.targets, path):
            return None
        self.targeted += 1
        return path

    def check(self, model: nn.Module) -> None:
        """At initialisation, refuses targets that matched none of the Dense modules seen."""
        if model.is_initializing() and self.seen and not self.targeted:
            raise ValueError(
                f"{self.setting}={self.targets!r} match no Dense module of {type(model).__name__} (its paths: "
                f"{', '.join(self.seen[:4])}, ...); give a regex that fully matches the paths to adapt."
            )


def current_call(kind: type) -> Any:
    """The call in progress of the adapted model with settings of type `kind`, or None outside one."""
    return (_CALLS.get() or {}).get(kind)


def _fields(model: nn.Module, cls: type[nn.Module]) -> dict[str, Any]:
    """`model`'s values of the constructor fields of `cls` (not Flax's parent and name)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init and f.name not in ("parent", "name")]
    return {name: getattr(model, name) for name in names}


@functools.cache
def _adapted_class(base: type[nn.Module], kind: type) -> type[nn.Module]:
    """`base` subclassed with the settings field and every entry method intercepted (one class per base and kind)."""
    namespace: dict[str, Any] = {
        "__module__": kind.__module__, "__annotations__": {kind.field: kind},
        kind.field: dataclasses.field(kw_only=True),
    }
    for name in _entry_methods(base):
        namespace[name] = _intercepted(getattr(base, name), kind)
    return type(f"{kind.class_prefix}{base.__name__}", (base,), namespace)


def _entry_methods(base: type[nn.Module]) -> set[str]:
    """`__call__` and the public methods `base` defines (not nn.Module's, not setup)."""
    names = set()
    for klass in base.__mro__:
        if klass is nn.Module:
            break
        names |= {
            name for name, value in vars(klass).items()
            if inspect.isfunction(value) and (name == "__call__" or not name.startswith("_")) and name != "setup"
        }
    return names


def _intercepted(method: Callable[..., Any], kind: type) -> Callable[..., Any]:
    """`method` run under the interceptor of `kind` when it is the call that enters the model."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def entry(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        calls = _CALLS.get() or {}
        if kind in calls:  # called by another intercepted method: already intercepted
            return method(self, *args, **kwargs)
        arguments = signature.bind(self, *args, **kwargs)
        arguments.apply_defaults()
        call = getattr(self, kind.field).start(self, arguments.arguments)
        token = _CALLS.set({**calls, kind: call})
        try:
            with nn.intercept_methods(call.intercept):
                out = method(self, *args, **kwargs)
        finally:
            _CALLS.reset(token)
        call.finish(self)
        return out

    return entry
