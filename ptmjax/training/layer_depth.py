"""Fine-tuning by layer depth: layer-wise learning-rate decay and gradual unfreezing.

A parameter's depth: 0 for the embeddings (a path whose first part names an
embedding: 'embeddings', 'token_embedder', 'embedding_projection'), i + 1 for
`layers_i` (an encoder-decoder's decoder layers follow its encoder's), and
L + 1 for everything above the L layers: heads and final norms. Both
transforms read the paths of the unscanned parameters, which is what the
optimizer sees (ptmjax/training/optimizers.py `on_unscanned_layout`).

- Layer-wise learning-rate decay (ELECTRA's and BERT fine-tuning recipes):
  the update at depth k is scaled by `decay ** (L + 1 - k)`; the head keeps
  the full rate, the embeddings get `decay ** (L + 1)`.
- Gradual unfreezing (ULMFiT): for the first `every_steps` steps only depth
  L + 1 trains, then one more depth every `every_steps` steps; a depth not
  yet unfrozen gets zero gradients into the optimizer and a zero update.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import gin
import jax
import jax.numpy as jnp
import optax

from ptmjax.training.optimizers import adamw
from ptmjax.tree_paths import leaves_by_path

LAYER = re.compile(r"^(.*?)layers_(\d+)/")


def depths(tree: Any) -> Any:
    """The depth of each leaf of a parameter-shaped tree (see the module docstring)."""
    paths = [path for path, _ in leaves_by_path(tree)]
    layers: dict[str, int] = {}  # stack prefix ('encoder/', 'decoder/', '') -> its number of layers
    for path in paths:
        if match := LAYER.match(path):
            layers[match.group(1)] = max(layers.get(match.group(1), 0), int(match.group(2)) + 1)
    offsets, total = {}, 0
    for prefix in sorted(layers, key=lambda p: ("decoder" in p, p)):
        offsets[prefix], total = total, total + layers[prefix]

    def depth(path: str) -> int:
        if match := LAYER.match(path):
            return offsets[match.group(1)] + int(match.group(2)) + 1
        return 0 if "embed" in path.split("/")[0] else total + 1

    return jax.tree.unflatten(jax.tree.structure(tree), [depth(path) for path in paths])


def layerwise_lr_decay(decay: float) -> optax.GradientTransformation:
    """Scales the update at depth k by `decay ** (top - k)`, top being the deepest depth (the head's)."""
    if not 0 < decay <= 1:
        raise ValueError(f"layer-wise learning-rate decay must be in (0, 1], got {decay}")

    def update(updates, state, params=None):
        del params
        by_depth = depths(updates)
        top = max(jax.tree.leaves(by_depth), default=0)
        return jax.tree.map(lambda u, k: u * decay ** (top - k), updates, by_depth), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class UnfreezingState(NamedTuple):
    count: jax.Array
    inner: optax.OptState


def gradual_unfreezing(tx: optax.GradientTransformation, every_steps: int) -> optax.GradientTransformation:
    """`tx` on the depths unfrozen so far: the top one at first, one more every `every_steps` steps."""
    if every_steps < 1:
        raise ValueError(f"gradual unfreezing needs every_steps >= 1, got {every_steps}")

    def init(params):
        return UnfreezingState(jnp.zeros((), jnp.int32), tx.init(params))

    def update(updates, state, params=None):
        by_depth = depths(updates)
        lowest = max(jax.tree.leaves(by_depth), default=0) - state.count // every_steps

        def only_unfrozen(tree):
            return jax.tree.map(lambda x, k: jnp.where(k >= lowest, x, jnp.zeros_like(x)), tree, by_depth)

        new_updates, inner = tx.update(only_unfrozen(updates), state.inner, params)
        return only_unfrozen(new_updates), UnfreezingState(state.count + 1, inner)

    return optax.GradientTransformation(init, update)


@gin.configurable
def by_layer_depth(
    learning_rate: optax.ScalarOrSchedule = gin.REQUIRED,
    optimizer: Callable[[optax.Schedule], optax.GradientTransformation] = adamw,
    lr_decay: float | None = None, unfreeze_every_steps: int | None = None,
) -> optax.GradientTransformation:
    """`optimizer` with layer-wise learning-rate decay and/or gradual unfreezing (None: off), for fine-tuning:
    `train.optimizer = @by_layer_depth`, `by_layer_depth.lr_decay = 0.8`."""
    tx = optimizer(learning_rate)
    if lr_decay is not None:
        tx = optax.chain(tx, layerwise_lr_decay(lr_decay))
    if unfreeze_every_steps is not None:
        tx = gradual_unfreezing(tx, unfreeze_every_steps)
    return tx
