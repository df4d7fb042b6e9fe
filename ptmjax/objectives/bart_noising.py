"""BART denoising (Lewis et al., 2020): corrupt 'inputs', targets = the original sequence.

The transformations, applied in this order (each off when its rate is 0):

1. sentence permutation: the sequence is split after every sentence-end token
   (given ids, or by default the vocabulary's pieces ending in '.', '!' or
   '?'); round(permute_sentence_ratio * num_sentences) sentences chosen at
   random are shuffled among their places (1.0: all, as in BART).
2. token masking: exactly round(mask_ratio * n) random tokens become `mask_id`.
3. token deletion: exactly round(delete_ratio * n) random tokens are removed.
4. text infilling: span lengths are drawn from Poisson(poisson_lambda) until
   they add up to round(infill_ratio * n) tokens (the last one is cut to fit);
   the spans are placed at random, without overlap, and each is replaced by ONE
   `mask_id`; a zero-length span inserts a `mask_id`.

Token counts round half to even and are at least 1 when the rate is positive.
5. document rotation: with probability rotate_probability the sequence is
   rotated to start at a token drawn uniformly from positions 1..n-1.

Each transformation is also a function over one token sequence (`permute_sentences`,
`mask_random_tokens`, `delete_random_tokens`, `infill_text`, `rotate`) for use and
testing on its own. The seqio preprocessor is `bart_noising`; add
`seqio.preprocessors.append_eos_after_trim` after it in the task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin
import numpy as np
import seqio
import tensorflow as tf

from ptmjax.objectives import common

SENTENCE_END_CHARS = ".!?"
_RATES = ("permute_sentence_ratio", "mask_ratio", "delete_ratio", "infill_ratio", "rotate_probability")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class BartNoiseOptions:
    """The settings of BART's noising, checked on construction; a rate of 0 turns its transformation off.

    The defaults are BART-large's: sentence permutation and text infilling of 30% of the tokens
    with Poisson(3) spans.

    permute_sentence_ratio: fraction of sentences shuffled among their places.
    mask_ratio: fraction of tokens replaced by mask_id, one for one.
    delete_ratio: fraction of tokens deleted.
    infill_ratio: fraction of tokens covered by infilled spans.
    poisson_lambda: mean infill span length, positive.
    rotate_probability: probability of rotating the document.
    mask_id: the mask id; None means `<extra_id_0>` (vocab_size - 1).
    sentence_end_ids: ids that end a sentence; None: pieces ending in '.', '!', '?'.
    """

    permute_sentence_ratio: float = 1.0
    mask_ratio: float = 0.0
    delete_ratio: float = 0.0
    infill_ratio: float = 0.3
    poisson_lambda: float = 3.0
    rotate_probability: float = 0.0
    mask_id: int | None = None
    sentence_end_ids: Sequence[int] | None = None

    def __post_init__(self) -> None:
        for name in _RATES:
            common.check_fraction(name, getattr(self, name), "BART noising")
        if not self.poisson_lambda > 0.0:
            raise ValueError(f"BART noising: poisson_lambda={self.poisson_lambda} must be positive (BART: 3.0)")


def sentence_end_table(vocabulary: seqio.Vocabulary, end_chars: str = SENTENCE_END_CHARS) -> np.ndarray:
    """bool[vocab_size]: True on ids whose SentencePiece piece ends with one of `end_chars`."""
    tokenizer = getattr(vocabulary, "tokenizer", None)
    if tokenizer is None or not hasattr(tokenizer, "id_to_piece"):
        raise ValueError(
            f"finding sentence ends from pieces needs a SentencePiece vocabulary; got {vocabulary}; "
            "pass sentence_end_ids explicitly"
        )
    table = np.zeros([vocabulary.vocab_size], bool)
    for i in range(min(tokenizer.get_piece_size(), vocabulary.vocab_size)):
        if not (tokenizer.is_control(i) or tokenizer.is_unknown(i)):
            piece = tokenizer.id_to_piece(i)
            table[i] = bool(piece) and piece[-1] in end_chars
    return table


def ids_table(ids: Sequence[int], vocab_size: int) -> np.ndarray:
    """bool[vocab_size], True on `ids`."""
    table = np.zeros([vocab_size], bool)
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"sentence_end_ids {bad} lie outside the vocabulary of {vocab_size} ids")
    table[list(ids)] = True
    return table


def sentence_end_ids_table(vocabulary: seqio.Vocabulary, sentence_end_ids: Sequence[int] | None) -> np.ndarray:
    """bool[vocab_size] on `sentence_end_ids`, or when None on the pieces ending in '.', '!' or '?'."""
    if sentence_end_ids is None:
        return sentence_end_table(vocabulary)
    return ids_table(sentence_end_ids, vocabulary.vocab_size)


def _random_subset(size: tf.Tensor, count: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """bool[size] with exactly `count` True at uniformly random places."""
    return common.first_in_order(common.random_permutation(size, seed), count)


def sentence_ids(tokens: tf.Tensor, ends: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(int32[n] sentence index of each token, number of sentences); a sentence ends after an end token.

    ends: bool[vocab_size], True on sentence-end ids (`sentence_end_table` or `ids_table`).
    """
    sentence_id = tf.cumsum(tf.cast(tf.gather(ends, tokens), tf.int32), exclusive=True)
    return sentence_id, tf.reduce_max(tf.concat([[-1], sentence_id], 0)) + 1


def permute_sentences(tokens: tf.Tensor, seed: tf.Tensor, ends: tf.Tensor, ratio: float = 1.0) -> tf.Tensor:
    """Shuffles round(ratio * num_sentences) random sentences among their places.

    ends: bool[vocab_size], True on sentence-end ids (a sentence ends after one).
    """
    sentence_id, num_sentences = sentence_ids(tokens, ends)
    sentences = tf.RaggedTensor.from_value_rowids(tokens, sentence_id, nrows=num_sentences)
    seeds = tf.random.experimental.stateless_split(seed, 2)
    chosen = _random_subset(num_sentences, common.count_to_rate(num_sentences, ratio), seeds[0])
    places = tf.boolean_mask(tf.range(num_sentences), chosen)
    shuffled = tf.gather(places, common.random_permutation(tf.size(places), seeds[1]))
    order = tf.tensor_scatter_nd_update(tf.range(num_sentences), places[:, None], shuffled)
    return tf.gather(sentences, order).flat_values


def mask_random_tokens(tokens: tf.Tensor, seed: tf.Tensor, ratio: float, mask_id: int) -> tf.Tensor:
    """Exactly round(ratio * n) random tokens become mask_id."""
    size = tf.size(tokens)
    masked = _random_subset(size, common.count_to_rate(size, ratio), seed)
    return tf.where(masked, tf.constant(mask_id, tokens.dtype), tokens)


def delete_random_tokens(tokens: tf.Tensor, seed: tf.Tensor, ratio: float) -> tf.Tensor:
    """Exactly round(ratio * n) random tokens are removed."""
    size = tf.size(tokens)
    return tf.boolean_mask(tokens, ~_random_subset(size, common.count_to_rate(size, ratio), seed))


def infill_span_lengths(num_tokens: tf.Tensor, seed: tf.Tensor, poisson_lambda: float) -> tf.Tensor:
    """Poisson(lambda) span lengths drawn until they reach num_tokens; the last is cut to fit.

    int32[num_spans] summing to num_tokens (zero lengths are insertions). The
    draw is bounded (2 * num_tokens / min(lambda, 1) + 8 spans), which all but
    never binds.
    """
    max_spans = tf.cast(tf.math.ceil(2.0 * tf.cast(num_tokens, tf.float32) / min(poisson_lambda, 1.0)), tf.int32) + 8
    lengths = tf.random.stateless_poisson([max_spans], seed, poisson_lambda, dtype=tf.int32)
    total = tf.cumsum(lengths)
    reached = total >= num_tokens
    num_spans = tf.where(
        num_tokens > 0,
        tf.where(tf.reduce_any(reached), tf.cast(tf.argmax(tf.cast(reached, tf.int32)), tf.int32) + 1, max_spans),
        0,
    )
    excess = tf.maximum(tf.gather(total, tf.maximum(num_spans - 1, 0)) - num_tokens, 0)
    lengths = lengths[:num_spans]
    return lengths - excess * tf.cast(tf.range(num_spans) == num_spans - 1, tf.int32)


def infill_text(
    tokens: tf.Tensor, seeds: Sequence[tf.Tensor], ratio: float, poisson_lambda: float, mask_id: int
) -> tf.Tensor:
    """BART text infilling: non-overlapping Poisson spans, each replaced by one mask_id."""
    size = tf.size(tokens)
    num_noise = common.count_to_rate(size, ratio)
    span_lengths = infill_span_lengths(num_noise, seeds[0], poisson_lambda)
    num_spans = tf.size(span_lengths)
    num_slots = size - tf.reduce_sum(span_lengths) + num_spans  # kept tokens and spans, interleaved at random
    is_span = _random_subset(num_slots, num_spans, seeds[1])
    span_index = tf.maximum(tf.cumsum(tf.cast(is_span, tf.int32)) - 1, 0)
    slot_lengths = tf.where(is_span, tf.gather(tf.concat([span_lengths, [0]], 0), span_index), 1)
    starts = tf.cumsum(slot_lengths, exclusive=True)
    kept = tf.gather(tokens, tf.minimum(starts, tf.maximum(size - 1, 0)))
    return tf.where(is_span, tf.constant(mask_id, tokens.dtype), kept)


def rotate(tokens: tf.Tensor, seed: tf.Tensor, probability: float = 1.0) -> tf.Tensor:
    """With `probability`, rotates to start at a uniform position in 1..n-1 (n >= 2)."""
    size = tf.size(tokens)
    draws = tf.random.experimental.stateless_split(seed, 2)
    apply = (tf.random.stateless_uniform([], draws[0]) < probability) & (size >= 2)
    start = tf.random.stateless_uniform([], draws[1], minval=1, maxval=tf.maximum(size, 2), dtype=tf.int32)
    start = tf.where(apply, start, 0)
    return tf.concat([tokens[start:], tokens[:start]], axis=0)


@seqio.map_over_dataset(num_seeds=5)
def _noise(
    features: Mapping[str, tf.Tensor],
    seeds: Sequence[tf.Tensor],
    *,
    sentence_ends: np.ndarray | None,
    options: BartNoiseOptions,
    mask_id: int,
) -> dict[str, tf.Tensor]:
    targets = features["targets"]
    inputs = targets
    if options.permute_sentence_ratio > 0.0:
        inputs = permute_sentences(inputs, seeds[0], tf.constant(sentence_ends), options.permute_sentence_ratio)
    if options.mask_ratio > 0.0:
        inputs = mask_random_tokens(inputs, seeds[1], options.mask_ratio, mask_id)
    if options.delete_ratio > 0.0:
        inputs = delete_random_tokens(inputs, seeds[2], options.delete_ratio)
    if options.infill_ratio > 0.0:
        inputs = infill_text(
            inputs,
            tf.random.experimental.stateless_split(seeds[3], 2),
            options.infill_ratio,
            options.poisson_lambda,
            mask_id,
        )
    if options.rotate_probability > 0.0:
        inputs = rotate(inputs, seeds[4], options.rotate_probability)
    return {"inputs": inputs, "targets": targets}


def noise_tokens(dataset: tf.data.Dataset, vocabulary: seqio.Vocabulary, options: BartNoiseOptions) -> tf.data.Dataset:
    """{'targets': tokens} -> {'inputs': noised tokens, 'targets': tokens} (see the module doc)."""
    permutes = options.permute_sentence_ratio > 0.0
    return _noise(
        dataset,
        sentence_ends=sentence_end_ids_table(vocabulary, options.sentence_end_ids) if permutes else None,
        options=options,
        mask_id=common.default_mask_id(vocabulary, options.mask_id, "BART noising"),
    )


@gin.configurable
def bart_noising(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: BartNoiseOptions | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 128,
) -> tf.data.Dataset:
    """The BART denoising seqio preprocessor over tokenised 'targets'.

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: must give 'inputs' and 'targets'; pieces of
        min(inputs, targets) tokens (less EOS) are noised. Zero-length infill
        spans can lengthen the inputs; `append_eos_after_trim` trims them.
      output_features: seqio features; 'targets' gives the vocabulary.
      options: the noising's settings; None: `BartNoiseOptions()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before splitting.
    """
    vocabulary = common.vocabulary_of(output_features, "bart_noising")
    raw_length = min(
        common.length_less_eos(sequence_length, output_features, "inputs", "bart_noising"),
        common.length_less_eos(sequence_length, output_features, "targets", "bart_noising"),
    )
    dataset = common.token_stream(dataset, raw_length, max_chunk_tokens, documents_per_stream)
    return noise_tokens(dataset, vocabulary, options or BartNoiseOptions())
