"""UniLM's cloze objectives (Dong et al., 2019): BERT's masked LM read under one of four self-attention masks.

Every example is `masked_lm.bert_mlm`'s ('inputs', 'targets', 'loss_mask': 15% of the tokens selected,
80/10/10), and carries which mask the model applies to it (`unified_lm_mask` in ptmjax/models/unilm.py):

* 'bidirectional': every token attends to every token (BERT);
* 'left_to_right': each token attends to itself and the tokens before it;
* 'right_to_left': each token attends to itself and the tokens after it;
* 'sequence_to_sequence': the piece is split at a point k drawn uniformly from 1..n-1; the source
  tokens[:k] ('token_type_ids' 0) attend to the source, the target tokens[k:] ('token_type_ids' 1) to the
  source and to the target up to themselves. Tokens of both segments are masked, as in the paper.

Added features, int32 and as long as 'inputs': 'token_type_ids' (all 0 but the seq2seq target) and
'lm_mask_kind' (the mask's index in `UNILM_MASKS`, at every position: each query is read under its own, so
the feature pads, trims and batches as the others do; evaluation needs no scalar features).
"""

from __future__ import annotations

from collections.abc import Mapping

import gin
import seqio
import tensorflow as tf

from ptmjax.models.unilm import UNILM_MASKS
from ptmjax.objectives import masked_lm

SEQUENCE_TO_SEQUENCE = UNILM_MASKS.index("sequence_to_sequence")
MASK_KIND_KEY = "lm_mask_kind"


def mask_kind(name: str) -> int:
    """The index of UniLM mask `name` in `UNILM_MASKS`; names the known ones otherwise."""
    if name not in UNILM_MASKS:
        raise ValueError(f"unknown UniLM mask {name!r}; known: {', '.join(UNILM_MASKS)}")
    return UNILM_MASKS.index(name)


def segment_types(length: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """int32 [length]: 0 on the source tokens[:k], 1 on the target tokens[k:], k uniform in 1..length-1."""
    split = tf.random.stateless_uniform([], seed, minval=1, maxval=tf.maximum(length, 2), dtype=tf.int32)
    return tf.cast(tf.range(length) >= split, tf.int32)


@seqio.map_over_dataset(num_seeds=1)
def _add_mask_kind(features: Mapping[str, tf.Tensor], seed: tf.Tensor, *, kind: int) -> dict[str, tf.Tensor]:
    length = tf.size(features["inputs"])
    if kind == SEQUENCE_TO_SEQUENCE:
        types = segment_types(length, seed)
    else:
        types = tf.zeros([length], tf.int32)
    return {**features, "token_type_ids": types, MASK_KIND_KEY: tf.fill([length], kind)}


@gin.configurable
def unilm_cloze(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    mask: str = "bidirectional",
    options: masked_lm.MaskedLMOptions | None = None,
) -> tf.data.Dataset:
    """UniLM's cloze task under `mask` (one of `UNILM_MASKS`) over tokenised 'targets' (see the module doc).

    options: the masking (`masked_lm.MaskedLMOptions`; None: as gin binds it). Other arguments as `bert_mlm`'s.
    """
    kind = mask_kind(mask)
    dataset = masked_lm.bert_mlm(dataset, sequence_length, output_features, options=options)
    return _add_mask_kind(dataset, kind=kind)
