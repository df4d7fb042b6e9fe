"""PEGASUS gap-sentence generation (Zhang et al., 2020): mask whole sentences, generate them.

A piece of a document is split into sentences after every sentence-end token
(`bart_noising.sentence_ids`; by default the ids whose SentencePiece piece
ends in '.', '!' or '?'; a last sentence may lack one). With S sentences,
k = round(gap_sentences_ratio * S) (half to even, at least 1) of them are the
gap sentences:

* 'principal' (PEGASUS's Ind-Orig, the default): the k best scored, each
  sentence scored independently by ROUGE-1 F1 against the rest of the piece,
  on token ids with repeats counted (ties: the earlier sentence);
* 'random' or 'lead': k random sentences, or the first k (the paper's baselines).

ROUGE-1 F1 of a sentence s against the rest r: with
overlap = sum over ids w of min(count_s(w), count_r(w)), precision
P = overlap / |s|, recall R = overlap / |r|, and F1 = 2PR / (P + R), which
equals 2 overlap / (|s| + |r|).

Each gap sentence is replaced in the inputs by one `mask_id` ([MASK1]; default
`<extra_id_0>`); the targets are the gap sentences concatenated in document
order. `pegasus` cuts each document (sentences are scored within their own
document) into pieces of sequence_length['inputs'] tokens less EOS; the inputs
never grow. Add `seqio.preprocessors.append_eos_after_trim` after it: it cuts
targets longer than sequence_length['targets'].
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin
import numpy as np
import seqio
import tensorflow as tf

from ptmjax.objectives import bart_noising, common

STRATEGIES = ("principal", "random", "lead")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class GapSentenceOptions:
    """The settings of gap-sentence generation, checked on construction.

    gap_sentences_ratio: fraction of the sentences masked, in (0, 1] (PEGASUS: 0.3).
    strategy: 'principal' (top ROUGE-1, Ind-Orig), 'random' or 'lead'.
    mask_id: the [MASK1] id; None means `<extra_id_0>` (vocab_size - 1).
    sentence_end_ids: ids that end a sentence; None: pieces ending in '.', '!', '?'.
    """

    gap_sentences_ratio: float = 0.3
    strategy: str = "principal"
    mask_id: int | None = None
    sentence_end_ids: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown gap-sentence strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        common.check_fraction("gap_sentences_ratio", self.gap_sentences_ratio, "PEGASUS", allow_zero=False)


def sentence_rouge1_f1(tokens: tf.Tensor, sentence_id: tf.Tensor, num_sentences: tf.Tensor) -> tf.Tensor:
    """float32[num_sentences]: ROUGE-1 F1 of each sentence against the rest of `tokens` (0 without overlap)."""
    unique_tokens, token_index = tf.unique(tokens)
    num_unique = tf.size(unique_tokens)
    cells = num_sentences * num_unique
    counts = tf.math.bincount(sentence_id * num_unique + token_index, minlength=cells, maxlength=cells, dtype=tf.int32)
    counts = tf.reshape(counts, [num_sentences, num_unique])  # [sentence, id]: occurrences
    rest = tf.reduce_sum(counts, axis=0, keepdims=True) - counts
    overlap = tf.reduce_sum(tf.minimum(counts, rest), axis=1)
    lengths = tf.reduce_sum(counts, axis=1) + tf.reduce_sum(rest, axis=1)  # |s| + |r|
    return tf.math.divide_no_nan(2.0 * tf.cast(overlap, tf.float32), tf.cast(lengths, tf.float32))


def gap_sentence_order(
    tokens: tf.Tensor, sentence_id: tf.Tensor, num_sentences: tf.Tensor, seed: tf.Tensor, strategy: str
) -> tf.Tensor:
    """int32[num_sentences]: the sentences in the order they become gap sentences."""
    if strategy == "principal":
        return tf.argsort(-sentence_rouge1_f1(tokens, sentence_id, num_sentences), stable=True)
    if strategy == "random":
        return common.random_permutation(num_sentences, seed)
    return tf.range(num_sentences)


def mask_gap_sentences(
    tokens: tf.Tensor, sentence_id: tf.Tensor, is_gap: tf.Tensor, mask_id: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """(inputs: one mask_id per gap sentence, targets: the gap sentences in order); is_gap: bool per sentence."""
    gap = tf.gather(is_gap, sentence_id)
    starts = sentence_id != tf.concat([[-1], sentence_id], axis=0)[:-1]
    first = gap & starts
    inputs = tf.boolean_mask(tf.where(first, tf.constant(mask_id, tokens.dtype), tokens), ~gap | first)
    return inputs, tf.boolean_mask(tokens, gap)


@seqio.map_over_dataset(num_seeds=1)
def _generate_gap_sentences(
    features: Mapping[str, tf.Tensor],
    seed: tf.Tensor,
    *,
    sentence_ends: np.ndarray,
    ratio: float,
    strategy: str,
    mask_id: int,
) -> dict[str, tf.Tensor]:
    tokens = features["targets"]
    sentence_id, num_sentences = bart_noising.sentence_ids(tokens, tf.constant(sentence_ends))
    order = gap_sentence_order(tokens, sentence_id, num_sentences, seed, strategy)
    is_gap = common.first_in_order(order, common.count_to_rate(num_sentences, ratio))
    inputs, targets = mask_gap_sentences(tokens, sentence_id, is_gap, mask_id)
    return {"inputs": inputs, "targets": targets}


def gap_sentence_generation(
    dataset: tf.data.Dataset, vocabulary: seqio.Vocabulary, options: GapSentenceOptions
) -> tf.data.Dataset:
    """{'targets': tokens} -> {'inputs': tokens with gap sentences masked, 'targets': the gap sentences}."""
    return _generate_gap_sentences(
        dataset,
        sentence_ends=bart_noising.sentence_end_ids_table(vocabulary, options.sentence_end_ids),
        ratio=options.gap_sentences_ratio,
        strategy=options.strategy,
        mask_id=common.default_mask_id(vocabulary, options.mask_id, "PEGASUS"),
    )


@gin.configurable
def pegasus(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: GapSentenceOptions | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 1,
) -> tf.data.Dataset:
    """The PEGASUS gap-sentence-generation seqio preprocessor over tokenised 'targets' (see the module doc).

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: must give 'inputs' (the piece length, EOS included).
      output_features: seqio features; 'targets' gives the vocabulary.
      options: the gap sentences' settings; None: `GapSentenceOptions()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before cutting (1: each piece is from one document).
    """
    vocabulary = common.vocabulary_of(output_features, "pegasus")
    raw_length = common.length_less_eos(sequence_length, output_features, "inputs", "pegasus")
    dataset = common.token_stream(dataset, raw_length, max_chunk_tokens, documents_per_stream)
    return gap_sentence_generation(dataset, vocabulary, options or GapSentenceOptions())
