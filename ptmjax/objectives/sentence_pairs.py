"""Sentence pairs for next-sentence prediction (BERT) and sentence-order prediction (ALBERT), with MLM.

Each document is cut to a random chunk of at most `length - 3` tokens and
split in two at a random sentence end (after an id whose piece ends with '.',
'!' or '?'; at a random token where the chunk has no inner sentence end):
A = the part before, B = the part after. With probability `negative_rate`
the pair becomes a negative:
- 'nsp': B is replaced by as many tokens from the start of another document
  (the documents are grouped `documents_per_group` at a time and paired by a
  random rotation of the group, so the other document is never the same one);
- 'sop': A and B swap places.
The example is `[CLS] A [SEP] B [SEP]` with token types 0 up to the first
[SEP] and 1 after it, and 'sentence_label' 0 for a positive pair and 1 for a
negative one (Hugging Face's next_sentence_label / sentence_order_label).
Then BERT's masking (ptmjax.objectives.masked_lm: 15% selected, 80/10/10)
runs over the tokens of A and B; [CLS] (a sentinel) and [SEP] (EOS) are never
selected. Outputs: 'inputs', 'targets', 'loss_mask', 'token_type_ids' (int32,
one length) and the scalar 'sentence_label'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin
import numpy as np
import seqio
import tensorflow as tf

from ptmjax.objectives import bart_noising, common, masked_lm, token_streams

PAIR_KINDS = ("nsp", "sop")
SPECIAL_TOKENS_PER_PAIR = 3  # [CLS], [SEP], [SEP]


@gin.configurable
@dataclasses.dataclass(frozen=True)
class SentencePairOptions:
    """The settings of NSP / SOP pairs with masking, checked on construction.

    negative_rate: fraction of negative pairs (label 1).
    cls_id: the [CLS] id; None means `<extra_id_1>` (vocab_size - 2).
    rates: BERT's masking over both segments (`masked_lm.MaskingRates`).
    sentence_end_ids: ids after which a sentence ends; None reads them from the SentencePiece
      vocabulary (pieces ending with '.', '!' or '?').
    documents_per_group: NSP draws the other document from groups of this many, at least 2.
    """

    negative_rate: float = 0.5
    cls_id: int | None = None
    rates: masked_lm.MaskingRates = dataclasses.field(default_factory=masked_lm.MaskingRates)
    sentence_end_ids: Sequence[int] | None = None
    documents_per_group: int = 64

    def __post_init__(self) -> None:
        common.check_fraction("negative_rate", self.negative_rate, "sentence pairs")
        if self.documents_per_group < 2:
            raise ValueError(
                f"documents_per_group={self.documents_per_group} must be at least 2 (NSP needs another document)"
            )


def default_cls_id(vocabulary: seqio.Vocabulary, cls_id: int | None) -> int:
    """cls_id, or `<extra_id_1>` (vocab_size - 2) when None; checked to be a sentinel."""
    cls_id = vocabulary.vocab_size - 2 if cls_id is None else cls_id
    if not common.sentinel_start(vocabulary) <= cls_id < vocabulary.vocab_size:
        raise ValueError(
            f"sentence pairs: cls_id={cls_id} must be a sentinel id in [{common.sentinel_start(vocabulary)}, "
            f"{vocabulary.vocab_size}), so that masking never selects it"
        )
    return cls_id


def _pair_documents(dataset: tf.data.Dataset, documents_per_group: int) -> tf.data.Dataset:
    """{'targets'} -> {'targets', 'other'}: 'other' is a different document of the same group."""

    @seqio.map_over_dataset(num_seeds=1)
    def rotate(group: Mapping[str, tf.RaggedTensor], seed: tf.Tensor) -> dict[str, tf.RaggedTensor]:
        docs = group["targets"]
        size = docs.nrows(out_type=tf.int32)
        shift = tf.random.stateless_uniform([], seed, 1, tf.maximum(size, 2), dtype=tf.int32)
        return {"targets": docs, "other": tf.gather(docs, (tf.range(size) + shift) % size)}

    groups = dataset.map(lambda x: {"targets": x["targets"]}).ragged_batch(documents_per_group)
    return rotate(groups).unbatch()


def split_point(tokens: tf.Tensor, ends: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """A random cut 1..n-1 just after a sentence end of tokens[:-1]; any cut when there is none."""
    n = tf.size(tokens)
    after_end = tf.gather(ends, tokens[:-1])  # [n - 1]: cut k + 1 follows a sentence end at k
    candidates = tf.cast(tf.where(after_end)[:, 0], tf.int32) + 1
    candidates = tf.cond(tf.size(candidates) > 0, lambda: candidates, lambda: tf.range(1, n))
    pick = tf.random.stateless_uniform([], seed, 0, tf.size(candidates), dtype=tf.int32)
    return candidates[pick]


@seqio.map_over_dataset(num_seeds=5)
def _pair_and_mask(
    features: Mapping[str, tf.Tensor],
    seeds: Sequence[tf.Tensor],
    *,
    kind: str,
    negative_rate: float,
    cls_id: int,
    ends: np.ndarray,
    sentinel_start: int,
    select_rate: float,
    replace_kwargs: Mapping[str, object],
) -> dict[str, tf.Tensor]:
    tokens, other = features["targets"], features["other"]
    cut = split_point(tokens, tf.constant(ends), seeds[0])
    first, second = tokens[:cut], tokens[cut:]
    negative = tf.random.stateless_uniform([], seeds[1]) < negative_rate
    if kind == "nsp":
        second = tf.cond(negative, lambda: other[: tf.size(second)], lambda: second)
    else:
        first, second = tf.cond(negative, lambda: (second, first), lambda: (first, second))
    cls = tf.constant([cls_id], tokens.dtype)
    sep = tf.constant([common.EOS_ID], tokens.dtype)
    pair = tf.concat([cls, first, sep, second, sep], 0)
    token_types = tf.concat([tf.zeros([tf.size(first) + 2], tf.int32), tf.ones([tf.size(second) + 1], tf.int32)], 0)
    inputs, selected = masked_lm.mask_sequence(
        pair, seeds[2:], sentinel_start=sentinel_start, select_rate=select_rate, replace_kwargs=replace_kwargs
    )
    return {
        "inputs": inputs,
        "targets": pair,
        masked_lm.LOSS_MASK_KEY: tf.cast(selected, tf.int32),
        "token_type_ids": token_types,
        "sentence_label": tf.cast(negative, tf.int32),
    }


@gin.configurable
def sentence_pair_mlm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    kind: str = "nsp",
    options: SentencePairOptions | None = None,
) -> tf.data.Dataset:
    """The NSP / SOP + masked-LM seqio preprocessor over tokenised 'targets' (see the module docstring).

    Args:
      dataset: documents with an int32 'targets' feature.
      sequence_length: must give 'inputs', the length of the whole pair.
      output_features: seqio features; 'targets' gives the vocabulary.
      kind: 'nsp' (BERT) or 'sop' (ALBERT).
      options: the pairs' and the masking's settings; None: `SentencePairOptions()` as gin binds it.
    """
    if kind not in PAIR_KINDS:
        raise ValueError(f"unknown sentence-pair kind {kind!r}; known: {', '.join(PAIR_KINDS)}")
    options = options or SentencePairOptions()
    vocabulary = common.vocabulary_of(output_features, "sentence_pair_mlm")
    length = common.required_length(sequence_length, "inputs", "sentence_pair_mlm")
    budget = length - SPECIAL_TOKENS_PER_PAIR
    if budget < 2:
        raise ValueError(f"sentence_pair_mlm: inputs length {length} leaves no room for two segments; use >= 5")
    ends = bart_noising.sentence_end_ids_table(vocabulary, options.sentence_end_ids)
    dataset = token_streams.select_random_chunk(dataset, "targets", budget)
    dataset = dataset.filter(lambda x: tf.size(x["targets"]) >= 2)
    return _pair_and_mask(
        _pair_documents(dataset, options.documents_per_group),
        kind=kind,
        negative_rate=options.negative_rate,
        cls_id=default_cls_id(vocabulary, options.cls_id),
        ends=ends,
        sentinel_start=common.sentinel_start(vocabulary),
        select_rate=options.rates.select_rate,
        replace_kwargs=masked_lm.replacement(vocabulary, options.rates),
    )
