"""XLM's translation language modelling (Lample & Conneau, 2019) over parallel text.

A parallel example, source tokens under `source_key` and target tokens under
`target_key` (by default the tokenised 'inputs' and 'targets' of a parallel
task), becomes one sequence `[source </s> target </s>]`, </s> being EOS (id 1):

* 'positions' count from 0 on the source and again from 0 where the target
  starts (XLM resets them, which helps align the two languages);
* 'language_ids' is `source_language_id` on the source and its </s>,
  `target_language_id` on the target and its </s>;
* BERT masking over both halves (`masked_lm.mask_sequence`: 15% of the tokens
  selected, then 80% [MASK], 10% a random id, 10% unchanged; </s> is never
  selected) gives 'inputs' (masked), 'targets' (the sequence) and 'loss_mask'
  (1 on the selected tokens).

The five outputs are int32 of one length, at most sequence_length['inputs'];
a pair that does not fit is cut, the longer side first (`pair_lengths`). The
sequence ends with EOS already: add no `append_eos_after_trim` after it.

XLM trains TLM alongside MLM on streams of one language, which carry the same
two fields: `with_language_ids` adds 'positions' (0, 1, ... over the stream)
and 'language_ids' (one id throughout) to masked-LM examples, so that one
feature converter reads both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin
import seqio
import tensorflow as tf

from ptmjax.objectives import common, masked_lm

POSITIONS_KEY = "positions"
LANGUAGE_IDS_KEY = "language_ids"
SEPARATORS_PER_PAIR = 2  # the </s> after each side


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TranslationLMOptions:
    """The settings of translation LM, checked on construction.

    source_key / target_key: the features holding the two sides (two different names).
    source_language_id / target_language_id: the language ids of the two sides, non-negative.
    rates: BERT's masking over both sides (`masked_lm.MaskingRates`).
    """

    source_key: str = "inputs"
    target_key: str = "targets"
    source_language_id: int = 0
    target_language_id: int = 1
    rates: masked_lm.MaskingRates = dataclasses.field(default_factory=masked_lm.MaskingRates)

    def __post_init__(self) -> None:
        if self.source_key == self.target_key:
            raise ValueError(
                f"translation_lm: source_key and target_key are both {self.source_key!r}; name two features"
            )
        if min(self.source_language_id, self.target_language_id) < 0:
            raise ValueError(
                f"translation_lm: language ids ({self.source_language_id}, {self.target_language_id}) "
                "must be non-negative"
            )


def pair_lengths(source_length: tf.Tensor, target_length: tf.Tensor, budget: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Tokens kept of each side so that both fit in `budget`: each keeps all it has or at least half the budget."""
    source_kept = tf.minimum(source_length, tf.maximum(budget - target_length, budget // 2))
    return source_kept, tf.minimum(target_length, budget - source_kept)


@seqio.map_over_dataset(num_seeds=3)
def _translation_lm(
    features: Mapping[str, tf.Tensor],
    seeds: Sequence[tf.Tensor],
    *,
    source_key: str,
    target_key: str,
    budget: int,
    language_ids: tuple[int, int],
    masking: Mapping[str, object],
) -> dict[str, tf.Tensor]:
    source, target = features[source_key], features[target_key]
    source_kept, target_kept = pair_lengths(tf.size(source), tf.size(target), budget)
    eos = tf.constant([common.EOS_ID], source.dtype)
    halves = (tf.concat([source[:source_kept], eos], 0), tf.concat([target[:target_kept], eos], 0))
    tokens = tf.concat(halves, axis=0)
    inputs, selected = masked_lm.mask_sequence(tokens, seeds, **masking)
    return {
        "inputs": inputs,
        "targets": tokens,
        masked_lm.LOSS_MASK_KEY: tf.cast(selected, tf.int32),
        POSITIONS_KEY: tf.concat([tf.range(tf.size(half)) for half in halves], axis=0),
        LANGUAGE_IDS_KEY: tf.concat(
            [tf.fill([tf.size(half)], language) for half, language in zip(halves, language_ids, strict=True)], axis=0
        ),
    }


@gin.configurable
def translation_lm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: TranslationLMOptions | None = None,
) -> tf.data.Dataset:
    """The XLM translation-LM seqio preprocessor over tokenised parallel text (see the module doc).

    Args:
      dataset: examples with int32 token features `options.source_key` and `options.target_key`.
      sequence_length: must give 'inputs', the length of the whole pair with both </s>.
      output_features: seqio features; 'targets' gives the vocabulary.
      options: the sides and the masking's settings; None: `TranslationLMOptions()` as gin binds it.
    """
    options = options or TranslationLMOptions()
    vocabulary = common.vocabulary_of(output_features, "translation_lm")
    length = common.required_length(sequence_length, "inputs", "translation_lm")
    if length < SEPARATORS_PER_PAIR + 2:
        raise ValueError(
            f"translation_lm: inputs length {length} leaves no room for [source </s> target </s>]; use >= 4"
        )
    missing = sorted({options.source_key, options.target_key} - set(dataset.element_spec))
    if missing:
        raise ValueError(
            f"translation_lm: the examples lack {missing} (they have {sorted(dataset.element_spec)}); "
            "set TranslationLMOptions.source_key and target_key"
        )
    masking = {
        "sentinel_start": common.sentinel_start(vocabulary),
        "select_rate": options.rates.select_rate,
        "replace_kwargs": masked_lm.replacement(vocabulary, options.rates),
    }
    return _translation_lm(
        dataset,
        source_key=options.source_key,
        target_key=options.target_key,
        budget=length - SEPARATORS_PER_PAIR,
        language_ids=(options.source_language_id, options.target_language_id),
        masking=masking,
    )


@seqio.map_over_dataset
def _with_language_ids(features: Mapping[str, tf.Tensor], language_id: int) -> dict[str, tf.Tensor]:
    length = tf.size(features["targets"])
    return {**features, POSITIONS_KEY: tf.range(length), LANGUAGE_IDS_KEY: tf.fill([length], language_id)}


@gin.configurable
def with_language_ids(dataset: tf.data.Dataset, language_id: int) -> tf.data.Dataset:
    """Adds XLM's 'positions' (0..n-1) and 'language_ids' (`language_id`) of one language to examples of
    int32 'targets' (a masked-LM stream), aligned with 'targets'."""
    if language_id < 0:
        raise ValueError(f"with_language_ids: language_id={language_id} must be non-negative")
    return _with_language_ids(dataset, language_id=language_id)
