"""Head importance (Michel et al., 2019) and the greedy choice of the heads to prune, in one shot or in rounds.

The importance of head h is I_h = E |dL/dξ_h| at ξ = 1, ξ the head masks of ptmjax/compress/head_masks.py and L
the family's own loss as the train step minimises it (the token loss per weighted token, plus any per-batch loss).
The expectation is over batches: the mean of |dL/dξ_h| of each batch's loss (as Hugging Face's bertology script
takes it), not over single examples. A scanned model is scored as its unscanned twin (`layer_stack.unscanned`),
by its layers' own paths. `normalised` divides each attention's scores by their L2 norm, as the paper does, so
that layers compare; `least_important` then picks the heads to prune, lowest first over all attentions, never an
attention's last head.

`iterative_pruning` is the paper's greedy loop: each round scores the heads with those pruned in earlier rounds
masked (ξ = 0), normalises each attention over the heads it still has, and prunes the lowest of those, until the
fraction is reached (the paper takes 10% of the heads a round: `fraction` 0.5 in 5 rounds). One round is
`least_important` of the one-shot scores.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from ptmjax.compress.head_masks import MASK, head_masked, masks_of, with_masks
from ptmjax.families.model_api import Batch, ModelApi, model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers import layer_stack

Array = jax.Array
Pruned = dict[str, tuple[int, ...]]  # {attention module path: heads pruned}
Scorer = Callable[[Any, Iterable[Batch], Mapping[str, Any] | None], dict[str, np.ndarray]]


@dataclasses.dataclass(frozen=True)
class PruningRound:
    """One round of `iterative_pruning`: the `importance` of every head with the heads of earlier rounds masked,
    its `scores` normalised over the heads left (NaN at the masked ones), and the heads it `pruned`."""

    importance: dict[str, np.ndarray]
    scores: dict[str, np.ndarray]
    pruned: Pruned


def head_importance(
    model: Any, params: Any, batches: Iterable[Batch], loss_config: LossConfig | None = None,
    masks: Mapping[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """{attention module path: float32 [heads]}: the mean over `batches` of |dL/dξ| of `model` (a float model)
    with `params` (unboxed; sharded or not: the step is jitted on their shardings), at ξ = `masks` ({attention
    path: [heads]}, as `with_masks` takes them; ones elsewhere)."""
    return importance_scorer(model, loss_config)(params, batches, masks)


def importance_scorer(model: Any, loss_config: LossConfig | None = None) -> Scorer:
    """`head_importance` of `model` as a function of (params, batches, masks), compiled once for all calls whose
    masks name the same attentions."""
    config = layer_stack.scanning_config(model)
    masked = head_masked(model if config is None else layer_stack.with_scan_layers(model, False))
    put_masks = jax.jit(lambda params, masks: with_masks(
        masked, params if config is None else layer_stack.unscan(params, config), masks))
    step = jax.jit(functools.partial(mask_gradient_magnitude, model_api(masked), loss_config or LossConfig()))

    def score(params: Any, batches: Iterable[Batch], masks: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
        masked_params = put_masks(params, masks)
        total, count = None, 0
        for batch in batches:
            magnitude = step(masked_params, batch)
            total = magnitude if total is None else jax.tree.map(jnp.add, total, magnitude)
            count += 1
        if total is None:
            raise ValueError("head importance needs at least one batch; the task's split gave none")
        return {path: np.asarray(value) / count for path, value in total.items()}

    return score


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


def normalised(importance: Mapping[str, np.ndarray], pruned: Mapping[str, tuple[int, ...]] | None = None,
               ) -> dict[str, np.ndarray]:
    """Each attention's scores divided by the L2 norm of those of its heads not in `pruned` (an all-zero attention
    stays zero); NaN at the `pruned` heads."""
    out = {}
    for path, scores in importance.items():
        scores = np.array(scores, np.float64)
        scores[list((pruned or {}).get(path, ()))] = np.nan
        norm = np.linalg.norm(scores[~np.isnan(scores)])
        out[path] = scores / norm if norm > 0 else np.where(np.isnan(scores), np.nan, 0.0)
    return out


def least_important(scores: Mapping[str, np.ndarray], fraction: float) -> Pruned:
    """{attention path: heads to prune}: round(fraction * all heads) of them, the lowest `scores` first over every
    attention (ties: the earlier attention, then the lower head), skipping an attention's last head."""
    return lowest(scores, pruned_count(scores, fraction))


def pruned_count(scores: Mapping[str, np.ndarray], fraction: float) -> int:
    """round(fraction * all heads of `scores`); refuses a fraction outside [0, 1) or one that would need an
    attention's last head."""
    total = sum(np.size(s) for s in scores.values())
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"head pruning fraction={fraction!r} must be in [0, 1) (e.g. 0.5 prunes half the heads)")
    count, most = round(fraction * total), total - len(scores)
    if count > most:
        raise ValueError(f"head pruning fraction={fraction} would prune {count} of {total} heads, but each of the "
                         f"{len(scores)} attentions keeps one: give a fraction of at most "
                         f"{math.floor(most / total * 100) / 100}")
    return count


def lowest(scores: Mapping[str, np.ndarray], count: int, pruned: Mapping[str, tuple[int, ...]] | None = None,
           ) -> Pruned:
    """{attention path: heads pruned}: `pruned`, then the lowest `scores` of the other heads first over every
    attention (ties: the earlier attention, then the lower head), skipping an attention's last head, until `count`
    heads are pruned in all."""
    paths = list(scores)
    chosen = {path: list(heads) for path, heads in (pruned or {}).items()}
    left = {path: np.size(s) - len(chosen.get(path, ())) for path, s in scores.items()}
    order = sorted((float(score), rank, head) for rank, path in enumerate(paths)
                   for head, score in enumerate(np.ravel(scores[path])) if head not in chosen.get(path, ()))
    for _, rank, head in order:
        if sum(map(len, chosen.values())) >= count:
            break
        path = paths[rank]
        if left[path] > 1:
            left[path] -= 1
            chosen.setdefault(path, []).append(head)
    return {path: tuple(sorted(chosen[path])) for path in paths if chosen.get(path)}


def iterative_pruning(
    model: Any, params: Any, batches: Iterable[Batch], fraction: float, rounds: int = 1,
    loss_config: LossConfig | None = None,
) -> tuple[Pruned, list[PruningRound]]:
    """Michel et al.'s greedy pruning of `model` (arguments as `head_importance`'s; `batches` are held, and scored
    in every round): round r of `rounds` scores the heads with those pruned so far masked and prunes the lowest
    normalised scores of the others until floor(r / rounds * round(fraction * all heads)) are pruned. Returns the
    pruned heads ({attention path: heads}; `least_important(normalised(head_importance(...)), fraction)` for one
    round) and the rounds."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"head pruning rounds={rounds!r} must be an integer >= 1 (1 prunes in one shot)")
    score, batches = importance_scorer(model, loss_config), list(batches)
    importance = score(params, batches, None)
    count = pruned_count(importance, fraction)
    if rounds > max(count, 1):
        raise ValueError(f"head pruning rounds={rounds} with fraction={fraction}, which prunes {count} heads: give "
                         f"at most {max(count, 1)} rounds (each prunes one head at least)")
    pruned: Pruned = {}
    done: list[PruningRound] = []
    for r in range(1, rounds + 1):
        if r > 1:
            importance = score(params, batches, zero_one_masks(importance, pruned))
        scores = normalised(importance, pruned)
        now = lowest(scores, count * r // rounds, pruned)
        step = {path: tuple(h for h in heads if h not in pruned.get(path, ())) for path, heads in now.items()}
        done.append(PruningRound(importance, scores, {path: heads for path, heads in step.items() if heads}))
        pruned = now
    return pruned, done


def zero_one_masks(importance: Mapping[str, np.ndarray], pruned: Mapping[str, tuple[int, ...]]) -> dict:
    """{attention path: float32 [heads]} for every attention of `importance`: 0 at the `pruned` heads, else 1."""
    return {path: np.isin(np.arange(np.size(scores)), pruned.get(path, ()), invert=True).astype(np.float32)
            for path, scores in importance.items()}
