"""What a loaded model of either kind (LoadedModel, LoadedEncoder) has: its module's config and API, its
parameter count, and how it shows itself: `repr` and a notebook table (`_repr_html_`) of its `summary()`."""

from __future__ import annotations

import functools
import html
import math
from typing import Any

import jax

from ptmjax.families.model_api import ModelApi, model_api


class Loaded:
    """Mixin for a dataclass with `module`, `params`, `mesh` and `summary() -> {row: text}`."""

    @functools.cached_property
    def api(self) -> ModelApi:
        """The model API, kept: its abstract parameters are computed once."""
        return model_api(self.module)

    @property
    def config(self) -> Any:
        """The model config (T5Config, BertConfig, ...)."""
        return self.module.config

    @property
    def num_params(self) -> int:
        return sum(math.prod(x.shape) for x in jax.tree.leaves(self.params))

    def summary(self) -> dict[str, str]:
        raise NotImplementedError

    def mesh_summary(self) -> str:
        """The mesh's axes of size > 1 and its device count, or '1 device'."""
        devices = self.mesh.devices.size
        axes = ", ".join(f"{axis}={size}" for axis, size in self.mesh.shape.items() if size > 1)
        return f"{axes} ({devices} devices)" if axes else "1 device"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{k}: {v}" for k, v in self.summary().items()) + ")"

    def _repr_html_(self) -> str:
        cell = 'style="text-align:left"'
        body = "".join(
            f"<tr><th {cell}>{html.escape(k)}</th><td {cell}>{html.escape(v)}</td></tr>"
            for k, v in self.summary().items()
        )
        return f"<table><caption>{html.escape(type(self.module).__name__)}</caption><tbody>{body}</tbody></table>"
