"""Evaluation of text-to-text models by rank classification.

A classification task cast as text to text has a label string as its
target. Rank classification (as T5 and T0 score multiple-choice tasks)
predicts the candidate label whose tokens, EOS included, have the highest
log-likelihood `sum_t log p(y_t | y_<t, inputs)` under the model; accuracy is
the fraction of examples whose gold label ranks first.

Scores come from the model API (`ModelApi.score`). Candidates are built as
seqio `EncDecFeatureConverter` fields, so this takes encoder-decoder models
(T5, BART): the decoder reads the targets shifted right with 0 first, and id 0
is padding.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import seqio
from flax import linen as nn

from ptmjax.data import pipeline
from ptmjax.training.model_api import model_api

Array = jax.Array


def candidate_batch(encoder_input_tokens: Array, candidate_tokens: Array) -> dict[str, Array]:
    """Every example with every candidate: row i * c + j pairs example i ([b, s]) with candidate j ([c, t]).

    Candidates are token ids, EOS included, padded with 0; returns the unpacked encoder-decoder fields.
    """
    num_examples, num_candidates = encoder_input_tokens.shape[0], candidate_tokens.shape[0]
    targets = jnp.tile(candidate_tokens, (num_examples, 1))
    return {
        "encoder_input_tokens": jnp.repeat(encoder_input_tokens, num_candidates, axis=0),
        "decoder_input_tokens": jnp.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": (targets != 0).astype(jnp.int32),
    }


def candidate_log_likelihoods(
    model: nn.Module, params: Any, encoder_input_tokens: Array, candidate_tokens: Array
) -> Array:
    """float32 [b, c]: log p(candidate j | example i) for inputs [b, s] and candidates [c, t]."""
    api = model_api(model)
    if api.family.feature_converter is not seqio.EncDecFeatureConverter:
        raise ValueError(
            f"rank classification scores encoder-decoder models (T5, BART); {type(model).__name__} is not one"
        )
    scores = api.score(params, candidate_batch(encoder_input_tokens, candidate_tokens))
    return scores.reshape(encoder_input_tokens.shape[0], candidate_tokens.shape[0])


def encode_candidates(vocabulary: seqio.Vocabulary, candidates: Sequence[str], length: int) -> np.ndarray:
    """int32 [c, length]: each candidate's token ids and EOS, padded with 0; raises if one does not fit."""
    rows = np.zeros([len(candidates), length], np.int32)
    for i, text in enumerate(candidates):
        ids = [*vocabulary.encode(text), vocabulary.eos_id]
        if len(ids) > length:
            raise ValueError(f"candidate {text!r} is {len(ids)} tokens with EOS, more than the targets length {length}")
        rows[i, : len(ids)] = ids
    return rows


@dataclasses.dataclass(frozen=True)
class RankClassification:
    """Rank-classification results over a split: accuracy, and per example the gold and predicted candidate."""

    accuracy: float
    labels: np.ndarray  # int [n], index of the gold candidate
    predictions: np.ndarray  # int [n], index of the highest-scoring candidate


def rank_classification(
    model: nn.Module,
    params: Any,
    task_name: str,
    split: str,
    candidates: Sequence[str],
    task_feature_lengths: Mapping[str, int],
    batch_size: int = 32,
) -> RankClassification:
    """Rank classification of every example of a registered seqio task's split (unshuffled, unpacked).

    Every example's target must be one of `candidates`. Params live on the default device or the host.
    """
    vocabulary = seqio.get_mixture_or_task(task_name).output_features["targets"].vocabulary
    candidate_tokens = encode_candidates(vocabulary, candidates, task_feature_lengths["targets"])
    score = jax.jit(functools.partial(candidate_log_likelihoods, model))
    dataset = pipeline.get_dataset(
        task_name, split, task_feature_lengths, batch_size, seed=0, shuffle=False, pack=False, num_epochs=1,
        pad_final_batch=True,
    )  # fmt: skip
    labels, predictions = [], []
    for batch in dataset.as_numpy_iterator():
        targets = batch["decoder_target_tokens"]
        real = targets.any(axis=1)  # pad_final_batch adds all-zero rows
        matches = np.all(targets[real, None, :] == candidate_tokens[None], axis=-1)  # [n, c]
        unknown = np.flatnonzero(~matches.any(axis=1))
        if unknown.size:
            text = vocabulary.decode(targets[real][unknown[0]].tolist())
            raise ValueError(f"{task_name!r} has target {text!r}, which is not among the candidates {list(candidates)}")
        scores = np.asarray(score(params, batch["encoder_input_tokens"], candidate_tokens))[real]
        labels.append(matches.argmax(axis=1))
        predictions.append(scores.argmax(axis=1))
    if not labels:
        raise ValueError(f"the {split!r} split of {task_name!r} is empty")
    labels_array, predictions_array = np.concatenate(labels), np.concatenate(predictions)
    return RankClassification(float(np.mean(labels_array == predictions_array)), labels_array, predictions_array)
