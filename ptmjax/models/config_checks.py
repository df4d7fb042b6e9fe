"""Validation shared by the model configs' `__post_init__`; every error names the field and the fix."""

from __future__ import annotations

from typing import Any

from ptmjax.layers.common import DTYPES
from ptmjax.layers.mlp import ACTIVATIONS


def check_positive_ints(config: Any, *names: str) -> None:
    """Raise unless every named field is a positive int (bools rejected)."""
    owner = type(config).__name__
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}.")


def check_heads_divide(config: Any) -> None:
    """Raise unless num_heads divides d_model (head_dim = d_model // num_heads)."""
    owner = type(config).__name__
    if config.d_model % config.num_heads:
        raise ValueError(
            f"{owner}.d_model={config.d_model} is not divisible by num_heads={config.num_heads}; "
            "pick num_heads dividing d_model."
        )


def check_common(config: Any, *rates: str) -> None:
    """Dropout rates in [0, 1), epsilon > 0, a known activation, supported dtypes."""
    owner = type(config).__name__
    for name in rates:
        value = getattr(config, name)
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{owner}.{name} must be in [0, 1), got {value!r}.")
    if not config.layer_norm_epsilon > 0:
        raise ValueError(f"{owner}.layer_norm_epsilon must be > 0, got {config.layer_norm_epsilon!r}.")
    if config.activation not in ACTIVATIONS:
        raise ValueError(f"{owner}.activation={config.activation!r} is unknown; known: {sorted(ACTIVATIONS)}.")
    for name in ("dtype", "param_dtype"):
        if getattr(config, name) not in DTYPES:
            raise ValueError(f"{owner}.{name}={getattr(config, name)!r} is not supported; use one of {list(DTYPES)}.")
