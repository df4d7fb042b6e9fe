"""Optimizers: Adafactor (the T5 default) and AdamW, both from optax; scanned layers see them unscanned."""

from __future__ import annotations

import gin
import optax

from ptmjax.layers.layer_stack import LayerStacks, scan, unscan


@gin.configurable
def adafactor(
    learning_rate: optax.ScalarOrSchedule = gin.REQUIRED, decay_rate: float = 0.8,
    clipping_threshold: float | None = 1.0, momentum: float | None = None,
    multiply_by_parameter_scale: bool = True, factored: bool = True,
    weight_decay_rate: float | None = None,
) -> optax.GradientTransformation:
    """Adafactor with factored second moments, as T5 pre-training used it."""
    return optax.adafactor(
        learning_rate=learning_rate, decay_rate=decay_rate,
        clipping_threshold=clipping_threshold, momentum=momentum,
        multiply_by_parameter_scale=multiply_by_parameter_scale, factored=factored,
        weight_decay_rate=weight_decay_rate,
    )


@gin.configurable
def adamw(
    learning_rate: optax.ScalarOrSchedule = gin.REQUIRED, b1: float = 0.9, b2: float = 0.999,
    eps: float = 1e-8, weight_decay: float = 0.01, max_grad_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """AdamW with optional global-norm gradient clipping."""
    adam = optax.adamw(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    if max_grad_norm is None:
        return adam
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), adam)


def on_unscanned_layout(tx: optax.GradientTransformation, config: LayerStacks) -> optax.GradientTransformation:
    """`tx` for a model that scans its layers, applied to the unscanned layout of its parameters.

    Per-array rules then see each layer's arrays, as in the plain model:
    Adafactor's factoring, update clipping and parameter scale would
    otherwise span all layers of a stacked array. The optimizer state is the
    plain model's, so scanning changes neither the updates nor the state.
    """

    def init(params):
        return tx.init(unscan(params, config))

    def update(updates, state, params=None):
        plain_params = None if params is None else unscan(params, config)
        plain_updates, state = tx.update(unscan(updates, config), state, plain_params)
        return scan(plain_updates, config), state

    return optax.GradientTransformation(init, update)
