"""Perplexity of a Transformer-XL over a split read segment by segment, with its memory or without.

The batches are SegmentStreamFeatureConverter's (ptmjax/data/segment_stream_converter.py): row r of each
continues row r of the one before. With memory, each batch is read after the memory the batches before it
left (`TransformerXL.with_memory`), as in training; without, each segment is read alone. The perplexity
is exp of the mean negative log-likelihood over the weighted target tokens. `folder_segment_perplexity`
scores a `ptmjax train` run's folder both ways on a split of its task, with its rows and segments.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.data import pipeline
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import token_cross_entropy
from ptmjax.gin_files import parse_gin
from ptmjax.models.transformer_xl import Memory, empty_memory
from ptmjax.storage.model_dir import ModelDir


@functools.partial(jax.jit, static_argnums=(0,))
def _segment_nll(module: nn.Module, params: Any, batch: Mapping[str, jax.Array],
                 memory: Memory) -> tuple[jax.Array, jax.Array, Memory]:
    """(summed weighted NLL, summed weights, the memory after the batch) of one batch read after `memory`."""
    logits, memory = module.apply({"params": params}, batch["decoder_input_tokens"], memory, method="with_memory")
    loss, _ = token_cross_entropy(logits, batch["decoder_target_tokens"])
    weights = batch["decoder_loss_weights"].astype(jnp.float32)
    return jnp.sum(loss * weights), jnp.sum(weights), memory


def segment_perplexity(
    module: nn.Module, params: Any, batches: Iterable[Mapping[str, np.ndarray]], with_memory: bool = True
) -> dict[str, float]:
    """{'nll': mean NLL per target token, 'perplexity': exp(nll), 'tokens': their count} of `module` (a
    TransformerXL) over `batches` in order, each read after the memory of those before it, or alone."""
    total, count, memory = 0.0, 0.0, None
    for batch in batches:
        rows = batch["decoder_input_tokens"].shape[0]
        if memory is None or not with_memory:
            memory = empty_memory(module.config, rows)
        nll, weight, memory = _segment_nll(module, params, dict(batch), memory)
        total, count = total + float(nll), count + float(weight)
    if count == 0:
        raise ValueError("segment_perplexity got no target tokens; give it at least one batch with loss weights")
    return {"nll": total / count, "perplexity": math.exp(total / count), "tokens": count}


def folder_segment_perplexity(
    path: str, split: str = "validation", num_batches: int | None = None, step: int | None = None
) -> dict[str, dict[str, float]]:
    """{'with_memory': ..., 'without_memory': ...} `segment_perplexity` of the Transformer-XL run at `path`
    (checkpoint `step`, default the newest) on the first `num_batches` batches (None: all) of `split` of its
    task, in the rows and segments its config.gin binds."""
    folder = ModelDir(path)
    gin.clear_config()
    try:
        parse_gin([folder.config_path])  # the run's bindings, the converter's rows and segment length among them
        bindings = gin.get_bindings("train")
        module = bindings["model"]
        api = model_api(module)
        dataset = pipeline.get_dataset(
            bindings["mixture_or_task_name"], split, bindings["task_feature_lengths"], bindings["batch_size"],
            seed=0, shuffle=False, pack=False, num_epochs=1, feature_converter=api.family.feature_converter,
        )
        batches = list(itertools.islice(dataset.as_numpy_iterator(), num_batches))
        if not batches:
            raise pipeline.empty_split_error(api.family.feature_converter, split, bindings["mixture_or_task_name"])
    finally:
        gin.clear_config()
    params = folder.read_params(api.abstract_params, step=step)
    return {name: segment_perplexity(module, params, batches, with_memory=memory)
            for name, memory in (("with_memory", True), ("without_memory", False))}
