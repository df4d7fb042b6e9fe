"""TinyBERT's learned projection W_h: a student narrower (or wider) than its teacher carries a trained
[student width, teacher width] kernel that maps its hidden states to the teacher's width, so that the
distillation's squared-error hidden loss (`Distillation(hidden_loss='mse')`) can compare them.

`hidden_projection(model, teacher_width)` returns `model` adapted by interception (ptmjax/adapt/interception.py)
with one more parameter, `hidden_projection`, in the scope of its probed layer stack (the stack the layer losses
read: the encoder family's, GPT-2's, T5's and BART's encoder), e.g. 'hidden_projection' for BERT and
'encoder/hidden_projection' for T5. The model computes what `model` computes: only the distillation objective
reads the kernel, so the train step trains it with the student, by the run's optimizer, and the checkpoint keeps
it. As in the paper, one projection serves every mapped layer; it has no bias (TinyBERT's code adds one).

Why an adaptation of the student rather than parameters of the objective: the trained parameters are the model's,
so the train state, its sharding rules, the checkpoint, a resume and a folder's config.gin need nothing new; and
what reads the student alone (decoding, evaluation, `ptmjax.load`) sees the model it was. Hugging Face export
leaves the projection out (`float_model`, which says so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
from flax import linen as nn

from ptmjax.adapt import interception
from ptmjax.adapt.interception import adapted
from ptmjax.adapt.probing.layer_features import probed_stack
from ptmjax.families.entries import runs_stack
from ptmjax.layers.common import dtype_kwargs
from ptmjax.models.config import check_positive_ints

PROJECTION = "hidden_projection"
PROJECTION_AXES = ("embed", None)  # the student's width, sharded as its hidden states; the teacher's, whole


@dataclasses.dataclass(frozen=True)
class HiddenProjectionSettings:
    """teacher_width: the width the student's hidden states are projected to."""

    field: ClassVar[str] = "hidden_projection"
    class_prefix: ClassVar[str] = "HiddenProjected"
    title: ClassVar[str] = "a hidden-state projection"

    teacher_width: int

    def __post_init__(self) -> None:
        check_positive_ints(self, "teacher_width")

    def start(self, model: nn.Module, arguments: dict[str, Any]) -> ProjectionCall:
        return ProjectionCall(self, probed_stack(model).path)


@dataclasses.dataclass
class ProjectionCall:
    """A call in progress: creates (at initialisation) or reads the kernel when the probed stack runs; changes
    nothing the model computes."""

    settings: HiddenProjectionSettings
    stack_path: tuple[str, ...]

    def intercept(self, next_fun: Callable[..., Any], args: tuple, kwargs: dict, context: Any) -> Any:
        module = context.module
        if runs_stack(module, context.method_name) and module.scope.path == self.stack_path:
            shape = (module.config.d_model, self.settings.teacher_width)
            init = nn.with_logical_partitioning(nn.initializers.lecun_normal(), PROJECTION_AXES)
            module.param(PROJECTION, init, shape, dtype_kwargs(module.config)["param_dtype"])
        return next_fun(*args, **kwargs)

    def finish(self, model: nn.Module) -> None:
        """Nothing to check after the call."""


def hidden_projection(model: nn.Module, teacher_width: int) -> nn.Module:
    """`model` carrying a trained projection of its hidden states to `teacher_width` (module docstring)."""
    return adapted(model, HiddenProjectionSettings(teacher_width))


def settings_of(model: nn.Module) -> HiddenProjectionSettings | None:
    """The projection settings of a `hidden_projection` model, else None."""
    return interception.settings_of(model, HiddenProjectionSettings)


def base_model(model: nn.Module) -> nn.Module:
    """The model under `hidden_projection(model, ...)`."""
    return interception.base_model(model, HiddenProjectionSettings)


def projection(model: nn.Module, params: Mapping[str, Any]) -> jax.Array:
    """The projection kernel [student width, teacher width] in a `hidden_projection` model's unboxed `params`."""
    for name in probed_stack(model).path:
        params = params[name]
    return params[PROJECTION]


def without_projection(model: nn.Module, params: Mapping[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """The model under a `hidden_projection` model, and its parameters without the kernel."""
    path = probed_stack(model).path

    def drop(tree: Mapping[str, Any], depth: int) -> dict[str, Any]:
        if depth == len(path):
            return {key: value for key, value in tree.items() if key != PROJECTION}
        return {**tree, path[depth]: drop(tree[path[depth]], depth + 1)}

    return base_model(model), drop(params, 0)
