"""MPNet's masked and permuted language modelling (Song et al., 2020), as a seqio preprocessor.

Documents are concatenated and cut into pieces of n tokens, n the longest text whose content stream fits:
n + round(n * predict_fraction) <= sequence_length['inputs'] and round(n * predict_fraction) <=
sequence_length['targets']. Each piece x_1..x_n is put in a uniformly
random order z, and its last b = round(n * predict_fraction) tokens (at least 1, at most n - 1) are
predicted, each from the tokens before it in the order and from mask tokens at the positions of all the
predicted ones (MPNet's position compensation: every prediction sees n positions). Outputs:
  'inputs' [n + b]: x_z1..x_zn, then the b predicted tokens corrupted as BERT's (80% mask_id, 10% a random
    regular id, 10% kept): the content stream, whose last b slots also start the query stream;
  'positions' [n + b]: z_1..z_n, then z_(n-b+1)..z_n: each slot's position in the text (0-based);
  'targets' [b]: x_z(n-b+1)..x_zn, the predicted tokens in order; 'loss_mask' [b]: ones.
The model (ptmjax.models.mpnet.MPNetPretraining) realises the order with two-stream attention. No EOS is
appended: Hugging Face's MPNet reads id 1 (seqio's EOS) as padding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin
import seqio
import tensorflow as tf

from ptmjax.objectives import common, masked_lm

POSITIONS_KEY = "positions"


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MaskedPermutedLMOptions:
    """The setting of MPNet's objective, checked on construction.

    predict_fraction: the fraction of each piece predicted, in (0, 1) (MPNet: 0.15).
    mask_rate, random_rate, mask_id: what the predicted tokens' mask slots hold (`masked_lm.MaskingRates`:
      80% mask_id, 10% a random regular id, the rest kept; mask_id None = `<extra_id_0>`).
    """

    predict_fraction: float = 0.15
    mask_rate: float = 0.8
    random_rate: float = 0.1
    mask_id: int | None = None

    def __post_init__(self) -> None:
        common.check_fraction("predict_fraction", self.predict_fraction, "MPNet", allow_zero=False, allow_one=False)
        self.rates()

    def rates(self) -> masked_lm.MaskingRates:
        """What the mask slots hold, as BERT's masking states it (checked there)."""
        return masked_lm.MaskingRates(mask_rate=self.mask_rate, random_rate=self.random_rate, mask_id=self.mask_id)

    def num_predicted(self, size: int) -> int:
        """b of a piece of `size` tokens, as `common.count_to_rate` rounds (half to even, at least 1), below size."""
        return min(max(1, round(size * self.predict_fraction)), size - 1) if size > 1 else 0

    def text_length(self, content_length: int, num_queries: int) -> int:
        """The longest n with n + b(n) <= content_length and b(n) <= num_queries; ValueError if none."""
        fits = [n for n in range(1, content_length + 1)
                if n + self.num_predicted(n) <= content_length and self.num_predicted(n) <= num_queries]
        if not fits or self.num_predicted(max(fits)) < 1:
            raise ValueError(
                f"MPNet: task_feature_lengths inputs={content_length}, targets={num_queries} leave no piece with a "
                f"prediction at predict_fraction={self.predict_fraction}; raise them (targets about inputs * "
                f"{self.predict_fraction / (1 + self.predict_fraction):.3f})"
            )
        return max(fits)


@seqio.map_over_dataset(num_seeds=3)
def _permute_and_mask(features: Mapping[str, tf.Tensor], seeds: Sequence[tf.Tensor], *, predict_fraction: float,
                      replace_kwargs: Mapping[str, object]) -> dict[str, tf.Tensor]:
    tokens = features["targets"]
    size = tf.size(tokens)
    num_predicted = tf.minimum(common.count_to_rate(size, predict_fraction), tf.maximum(size - 1, 0))
    order = common.random_permutation(size, seeds[0])  # order[t]: the position of the t-th token of the order
    permuted = tf.gather(tokens, order)
    predicted, predicted_positions = permuted[size - num_predicted:], order[size - num_predicted:]
    masks = masked_lm.replace_selected(
        predicted, tf.ones_like(predicted, tf.bool), seeds[1:], **replace_kwargs
    )
    return {
        "inputs": tf.concat([permuted, masks], 0),
        POSITIONS_KEY: tf.concat([order, predicted_positions], 0),
        "targets": predicted,
        "loss_mask": tf.ones_like(predicted),
    }


@gin.configurable
def masked_permuted_lm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: MaskedPermutedLMOptions | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 128,
) -> tf.data.Dataset:
    """MPNet's seqio preprocessor over tokenised 'targets' (see the module docstring).

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: 'inputs' (the content stream, n + b) and 'targets' (the queries, at least b).
      output_features: seqio features; 'targets' gives the vocabulary (no EOS is appended).
      options: the objective's setting; None: `MaskedPermutedLMOptions()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before splitting.
    """
    options = options or MaskedPermutedLMOptions()
    vocabulary = common.vocabulary_of(output_features, "masked_permuted_lm")
    size = options.text_length(common.required_length(sequence_length, "inputs", "masked_permuted_lm"),
                               common.required_length(sequence_length, "targets", "masked_permuted_lm"))
    dataset = common.token_stream(dataset, size, max_chunk_tokens, documents_per_stream)
    return _permute_and_mask(dataset, predict_fraction=options.predict_fraction,
                             replace_kwargs=masked_lm.replacement(vocabulary, options.rates()))
