"""Evaluation of text-to-text models by rank classification.

A classification task cast as text to text has a label string as its
target. Rank classification (as T5 and T0 score multiple-choice tasks)
predicts the candidate label whose tokens, EOS included, have the highest
log-likelihood `sum_t log p(y_t | y_<t, inputs)` under the model; accuracy is
the fraction of examples whose gold label ranks first.

Each (example, candidate) pair becomes a row through the model family's own
seqio feature converter, and is scored by the model API (`ModelApi.score`):
encoder-decoder models (T5, BART) read the inputs in the encoder, decoder-only
ones (GPT-2) as a bidirectional prefix before the candidate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import seqio
import tensorflow as tf
from flax import linen as nn

from ptmjax.data import pipeline
from ptmjax.families.model_api import model_api

SCORED_TARGETS = "decoder_target_tokens"  # families whose targets are a decoder's: seq2seq and decoder-only


def candidate_rows(
    inputs: Sequence[Sequence[int]], candidate_tokens: np.ndarray, converter: seqio.FeatureConverter,
    task_feature_lengths: Mapping[str, int], batch_size: int,
) -> Iterator[dict[str, np.ndarray]]:
    """Batches of every example with every candidate, as `converter` builds them: row i * c + j pairs
    example i (token ids with EOS) with candidate j (a row of `candidate_tokens`, padded with 0)."""
    candidates = [row[row != 0] for row in np.asarray(candidate_tokens)]

    def pairs():
        for example in inputs:
            for candidate in candidates:
                yield {"inputs": np.asarray(example, np.int32), "targets": candidate.astype(np.int32)}

    spec = tf.TensorSpec([None], tf.int32)
    dataset = tf.data.Dataset.from_generator(pairs, output_signature={"inputs": spec, "targets": spec})
    batches = converter(dataset, dict(task_feature_lengths)).batch(batch_size)
    return pipeline.without_autotuning(batches).as_numpy_iterator()


def candidate_log_likelihoods(
    model: nn.Module, params: Any, inputs: Sequence[Sequence[int]], candidate_tokens: np.ndarray,
    task_feature_lengths: Mapping[str, int], batch_size: int = 32, causal_prompt: bool = False,
) -> np.ndarray:
    """float64 [n, c]: log p(candidate j | example i) for n examples and candidates [c, t] (padded with 0).

    A decoder-only model reads the example as a bidirectional prefix (prefix LM), or with `causal_prompt`
    causally, as a causal LM such as GPT-2 was trained to read its prompt."""
    api = model_api(model)
    if api.family.targets != SCORED_TARGETS:
        raise ValueError(
            f"rank classification scores encoder-decoder and decoder-only models (T5, BART, GPT-2); "
            f"{type(model).__name__} is neither"
        )
    score = jax.jit(api.score)
    converter = api.family.feature_converter(pack=False)
    num_candidates = len(candidate_tokens)
    rows = candidate_rows(inputs, candidate_tokens, converter, task_feature_lengths, batch_size * num_candidates)
    if causal_prompt:
        rows = ({k: v for k, v in batch.items() if k != "decoder_causal_attention"} for batch in rows)
    scores = [np.asarray(score(params, batch), np.float64) for batch in rows]
    return np.concatenate(scores).reshape(len(inputs), num_candidates)


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
    task = pipeline.get_task_or_mixture(task_name)
    vocabulary = task.output_features["targets"].vocabulary
    candidate_tokens = encode_candidates(vocabulary, candidates, task_feature_lengths["targets"])
    examples = list(task.get_dataset(dict(task_feature_lengths), split=split, shuffle=False, num_epochs=1, seed=0)
                    .as_numpy_iterator())
    if not examples:
        raise ValueError(f"the {split!r} split of {task_name!r} is empty")
    candidate_lists = [row[row != 0].tolist() for row in candidate_tokens]
    labels = []
    for example in examples:
        target = example["targets"].tolist()
        if target not in candidate_lists:
            raise ValueError(
                f"{task_name!r} has target {vocabulary.decode(target)!r}, which is not among the candidates "
                f"{list(candidates)}"
            )
        labels.append(candidate_lists.index(target))
    scores = candidate_log_likelihoods(
        model, params, [example["inputs"] for example in examples], candidate_tokens, task_feature_lengths, batch_size
    )
    labels_array, predictions_array = np.array(labels), scores.argmax(axis=1)
    return RankClassification(float(np.mean(labels_array == predictions_array)), labels_array, predictions_array)
