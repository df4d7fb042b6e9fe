"""Head importance (Michel et al., 2019) and the greedy choice of the heads to prune.

The importance of head h is I_h = E |dL/dξ_h| at ξ = 1, ξ the head masks of ptmjax/compress/head_masks.py and L
the family's own loss as the train step minimises it (the token loss per weighted token, plus any per-batch loss).
The expectation is over batches: the mean of |dL/dξ_h| of each batch's loss (as Hugging Face's bertology script
takes it), not over single examples. `normalised` divides each attention's scores by their L2 norm, as the paper
does, so that layers compare; `least_important` then picks the heads to prune, lowest first over all attentions,
never an attention's last head.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from ptmjax.compress.head_masks import MASK, head_masked, masks_of, with_masks
from ptmjax.families.model_api import Batch, ModelApi, model_api
from ptmjax.families.token_loss import LossConfig

Array = jax.Array


def head_importance(
    model: Any, params: Any, batches: Iterable[Batch], loss_config: LossConfig | None = None
) -> dict[str, np.ndarray]:
    """{attention module path: float32 [heads]}: the mean over `batches` of |dL/dξ| of `model` (a float model,
    unscanned) with `params` (unboxed; sharded or not: the step is jitted on their shardings)."""
    masked = head_masked(model)
    masked_params = jax.jit(functools.partial(with_masks, masked))(params)
    step = jax.jit(functools.partial(mask_gradient_magnitude, model_api(masked), loss_config or LossConfig()))
    total, count = None, 0
    for batch in batches:
        magnitude = step(masked_params, batch)
        total = magnitude if total is None else jax.tree.map(jnp.add, total, magnitude)
        count += 1
    if total is None:
        raise ValueError("head importance needs at least one batch; the task's split gave none")
    return {path: np.asarray(value) / count for path, value in total.items()}


def mask_gradient_magnitude(api: ModelApi, loss_config: LossConfig, params: Any, batch: Batch) -> dict[str, Array]:
    """{attention path: |dL/dξ| [heads]} of one batch, the head-masked model's `params` holding ξ."""
    flat = traverse_util.flatten_dict(params, sep="/")
    masks = {key: value for key, value in flat.items() if key.endswith(f"/{MASK}")}

    def loss(masks: dict[str, Array]) -> Array:
        token_loss, batch_loss, stats = api.loss(traverse_util.unflatten_dict({**flat, **masks}, sep="/"), batch,
                                                 loss_config)
        return token_loss / jnp.maximum(stats.counts["token_loss"], 1.0) + batch_loss

    gradient = jax.grad(loss)(masks)
    return {path: jnp.abs(value) for path, value in masks_of(traverse_util.unflatten_dict(gradient, sep="/")).items()}


def normalised(importance: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each attention's scores divided by their L2 norm (an all-zero attention stays zero)."""
    out = {}
    for path, scores in importance.items():
        norm = np.linalg.norm(np.asarray(scores, np.float64))
        out[path] = np.asarray(scores, np.float64) / norm if norm > 0 else np.zeros(np.shape(scores))
    return out


def least_important(scores: Mapping[str, np.ndarray], fraction: float) -> dict[str, tuple[int, ...]]:
    """{attention path: heads to prune}: round(fraction * all heads) of them, the lowest `scores` first over every
    attention (ties: the earlier attention, then the lower head), skipping an attention's last head."""
    total = sum(np.size(s) for s in scores.values())
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"head pruning fraction={fraction!r} must be in [0, 1) (e.g. 0.5 prunes half the heads)")
    count, most = round(fraction * total), total - len(scores)
    if count > most:
        raise ValueError(f"head pruning fraction={fraction} would prune {count} of {total} heads, but each of the "
                         f"{len(scores)} attentions keeps one: give a fraction of at most "
                         f"{math.floor(most / total * 100) / 100}")
    order = sorted((float(score), rank, head) for rank, path in enumerate(scores)
                   for head, score in enumerate(np.ravel(scores[path])))
    paths, left, pruned = list(scores), {path: np.size(s) for path, s in scores.items()}, {}
    for _, rank, head in order:
        if sum(len(heads) for heads in pruned.values()) == count:
            break
        path = paths[rank]
        if left[path] > 1:
            left[path] -= 1
            pruned.setdefault(path, []).append(head)
    return {path: tuple(sorted(pruned[path])) for path in paths if path in pruned}
