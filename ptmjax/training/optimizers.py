"""Optimizers from optax: Adafactor (the T5 default), AdamW, and the large-batch LAMB and LARS.

Scanned layers see them unscanned (`on_unscanned_layout`), so LAMB's and
LARS's trust ratios are per layer's tensor, never over a stacked one.
"""

from __future__ import annotations

from typing import Any

import gin
import jax
import optax

from ptmjax.layers.layer_stack import LayerStacks, scan, unscan
from ptmjax.tree_paths import leaves_by_path


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
    decay_biases_and_norms: bool = True,
) -> optax.GradientTransformation:
    """AdamW with optional global-norm gradient clipping. `decay_biases_and_norms=False` decays the
    weights alone (`weights_not_biases_or_norms`), as BERT and Hugging Face's fine-tuning scripts do."""
    mask = None if decay_biases_and_norms else weights_not_biases_or_norms
    adam = optax.adamw(learning_rate=learning_rate, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask)
    return clipped(adam, max_grad_norm)


def clipped(tx: optax.GradientTransformation, max_grad_norm: float | None) -> optax.GradientTransformation:
    """`tx` after global-norm gradient clipping to `max_grad_norm` (None: no clipping)."""
    return tx if max_grad_norm is None else optax.chain(optax.clip_by_global_norm(max_grad_norm), tx)


def weights_not_biases_or_norms(params: Any) -> Any:
    """True for each weight (kernel, embedding), False for biases and normalization parameters.

    By path: a leaf named 'bias', or any leaf under a module whose name holds
    'norm' (layer_norm/scale, decoder_norm/bias). LAMB and LARS exclude these
    from weight decay and the trust ratio, as both papers do.
    """
    def is_weight(path: str) -> bool:
        *modules, name = path.split("/")
        return name != "bias" and not any("norm" in module for module in modules)

    flags = [is_weight(path) for path, _ in leaves_by_path(params)]
    return jax.tree.unflatten(jax.tree.structure(params), flags)


@gin.configurable
def lamb(
    learning_rate: optax.ScalarOrSchedule = gin.REQUIRED, b1: float = 0.9, b2: float = 0.999,
    eps: float = 1e-6, weight_decay: float = 0.01, max_grad_norm: float | None = 1.0,
) -> optax.GradientTransformation:
    """LAMB (You et al. 2020): the Adam direction plus decoupled weight decay, u = m / (sqrt(v) + eps) + wd w,
    scaled per tensor by the trust ratio ||w|| / ||u|| (1 where either norm is 0), times the learning rate.

    Biases and norms get neither decay nor trust ratio (`weights_not_biases_or_norms`); optax.lamb
    would apply its trust ratio to them too, so the chain is built here from its parts.
    """
    return clipped(optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay, mask=weights_not_biases_or_norms),
        optax.masked(optax.scale_by_trust_ratio(), weights_not_biases_or_norms),
        optax.scale_by_learning_rate(learning_rate),
    ), max_grad_norm)


@gin.configurable
def lars(
    learning_rate: optax.ScalarOrSchedule = gin.REQUIRED, momentum: float = 0.9, weight_decay: float = 0.0,
    trust_coefficient: float = 0.001, eps: float = 0.0, nesterov: bool = False,
) -> optax.GradientTransformation:
    """LARS (You et al. 2017): u = g + wd w, scaled per tensor by trust_coefficient ||w|| / (||u|| + eps)
    (1 where either norm is 0), times the learning rate, into heavy-ball momentum.

    Biases and norms get neither decay nor trust ratio (`weights_not_biases_or_norms`).
    """
    return optax.lars(
        learning_rate, weight_decay=weight_decay, weight_decay_mask=weights_not_biases_or_norms,
        trust_coefficient=trust_coefficient, eps=eps, trust_ratio_mask=weights_not_biases_or_norms,
        momentum=momentum, nesterov=nesterov,
    )


def on_unscanned_layout(tx: optax.GradientTransformation, config: LayerStacks,
                        shardings: Any = None) -> optax.GradientTransformation:
    """`tx` for a model that scans its layers, applied to the unscanned layout of its parameters.

    Per-array rules then see each layer's arrays, as in the plain model:
    Adafactor's factoring, update clipping and parameter scale would
    otherwise span all layers of a stacked array. The optimizer state is the
    plain model's, so scanning changes neither the updates nor the state.
    `shardings` (the scanned tree's, None: as they come) are what the scanned
    updates and parameters are laid out as around the unscanning: with pipeline
    stages, the stage axis moved off the layers' axis
    (`partitioning.optimizer_rules`), so that cutting out a layer is local, not
    a stage-sized padded copy per layer.
    """
    lay_out = (lambda tree: tree) if shardings is None else (  # noqa: E731
        lambda tree: jax.lax.with_sharding_constraint(tree, shardings))

    def init(params):
        return tx.init(unscan(lay_out(params), config))

    def update(updates, state, params=None):
        plain_params = None if params is None else unscan(lay_out(params), config)
        plain_updates, state = tx.update(unscan(lay_out(updates), config), state, plain_params)
        return lay_out(scan(plain_updates, config)), state

    return optax.GradientTransformation(init, update)
