"""XLNet's permuted language modelling: a random factorisation order, predicting its last 1/K.

Documents are concatenated and cut into pieces of `sequence_length['inputs']`
tokens (EOS included when 'targets' adds one). Each piece gets a uniformly
random factorisation order of its n tokens, given as 'permutation_rank'
(rank[i] = the step at which token i is predicted; 0..n-1), and the tokens
whose rank is at least n - round(n / K) form the prediction targets
('loss_mask' = 1; at least one, and never the first of the order, which has
no context to be predicted from). The text itself is not corrupted: 'inputs'
and 'targets' are the same tokens. The model (ptmjax.models.permutation_lm)
realises the order with attention masks and two-stream attention.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import gin
import seqio
import tensorflow as tf

from ptmjax.objectives import common

RANK_KEY = "permutation_rank"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PermutedLMOptions:
    """The setting of permuted LM, checked on construction.

    predict_fraction: 1/K, the fraction of each order that is predicted, in (0, 1] (XLNet: K = 6 or 7).
    """

    predict_fraction: float = 1 / 6

    def __post_init__(self) -> None:
        common.check_fraction("predict_fraction", self.predict_fraction, "permuted LM", allow_zero=False)


def permutation_rank(size: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """int32[size]: rank[i] = where position i falls in a uniformly random order."""
    order = common.random_permutation(size, seed)  # order[t] = the position predicted at step t
    return tf.scatter_nd(order[:, None], tf.range(size), [size])


@seqio.map_over_dataset(num_seeds=1)
def _permute(features: Mapping[str, tf.Tensor], seed: tf.Tensor, *, append_eos: bool,
             predict_fraction: float) -> dict[str, tf.Tensor]:
    tokens = features["targets"]
    if append_eos:
        tokens = tf.concat([tokens, tf.constant([common.EOS_ID], tokens.dtype)], axis=0)
    size = tf.size(tokens)
    rank = permutation_rank(size, seed)
    num_predicted = tf.minimum(common.count_to_rate(size, predict_fraction), size - 1)
    return {
        "inputs": tokens,
        "targets": tokens,
        "loss_mask": tf.cast(rank >= size - num_predicted, tf.int32),
        RANK_KEY: rank,
    }


@gin.configurable
def permuted_lm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: PermutedLMOptions | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 128,
) -> tf.data.Dataset:
    """The permuted-LM seqio preprocessor over tokenised 'targets' (see the module docstring).

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: must give 'inputs'; every output has at most this length.
      output_features: seqio features; EOS is appended when 'targets' adds one.
      options: the prediction's setting; None: `PermutedLMOptions()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before splitting.
    """
    append_eos = bool(common.eos_count(output_features, "targets"))
    raw_length = common.required_length(sequence_length, "inputs", "permuted_lm") - int(append_eos)
    dataset = common.token_stream(dataset, raw_length, max_chunk_tokens, documents_per_stream)
    return _permute(dataset, append_eos=append_eos, predict_fraction=(options or PermutedLMOptions()).predict_fraction)
