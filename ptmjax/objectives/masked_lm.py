"""BERT masked language modelling: token, whole-word and SpanBERT span masking.

Of the eligible tokens of an example (all but pad 0, EOS 1 and the sentinels)
a budget of round(select_rate * num_eligible) (at least 1) is selected:

* 'token': exactly that many tokens, uniformly at random (BERT).
* 'whole_word': whole words in a random order until the budget is reached; a
  word starts at a SentencePiece piece beginning with '▁' (see
  `word_start_table`). The last word is kept if at least half of it fits, so
  the expected count is the budget.
* 'span' (SpanBERT): spans of L units (words with a vocabulary, else tokens),
  L drawn from Geometric(span_p) restricted to 1..max_span_length and
  renormalised (mean 3.80 for p=0.2, max 10, as in SpanBERT's code; or
  `span_length_tail='clip'`: L = min(Geometric, max), mean 4.46), starting at a
  random unit, until the budget is reached (the last span is cut to fit, by
  the same half-fits rule). A start inside an already selected unit is skipped.

Each selected token then becomes `mask_id` with probability mask_rate (0.8), a
uniformly random regular token with probability random_rate (0.1), and stays
unchanged otherwise. Outputs: 'inputs' (corrupted), 'targets' (original) and
'loss_mask' (int32, 1 on the selected positions), all of the same length; with
`span_boundaries`, also SpanBERT's 'span_left', 'span_right' and 'span_position'
(ptmjax/objectives/span_boundaries.py), which its span boundary objective reads. The
masks are drawn from seqio's per-example seeds, so every epoch (every pass of a
repeated dataset) masks differently (dynamic masking).

`bert_mlm` appends EOS itself (when 'targets' adds one) so the three features
stay aligned: do not add `append_eos_after_trim` after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin
import numpy as np
import seqio
import tensorflow as tf

from ptmjax.objectives import common, span_boundaries

MASKING_KINDS = ("token", "whole_word", "span")
SPAN_LENGTH_TAILS = ("renormalize", "clip")
LOSS_MASK_KEY = "loss_mask"
WORD_BOUNDARY = "\u2581"  # '▁', SentencePiece's word-boundary marker


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MaskingRates:
    """BERT's selection and replacement rates, checked on construction.

    select_rate: fraction of the eligible tokens selected for prediction, in (0, 1] (BERT: 0.15).
    mask_rate: fraction of the selected tokens replaced by `mask_id` (BERT: 0.8).
    random_rate: fraction of the selected tokens replaced by a random regular id (BERT: 0.1); the
      rest stay unchanged, so mask_rate + random_rate is at most 1.
    mask_id: the [MASK] id; None means `<extra_id_0>` (vocab_size - 1).
    """

    select_rate: float = 0.15
    mask_rate: float = 0.8
    random_rate: float = 0.1
    mask_id: int | None = None

    def __post_init__(self) -> None:
        common.check_fraction("select_rate", self.select_rate, "masked LM", allow_zero=False)
        common.check_fraction("mask_rate", self.mask_rate, "masked LM")
        common.check_fraction("random_rate", self.random_rate, "masked LM")
        if self.mask_rate + self.random_rate > 1.0:
            raise ValueError(
                f"masked LM: mask_rate + random_rate = {self.mask_rate + self.random_rate} must be at most 1"
            )


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MaskedLMOptions:
    """The settings of BERT / whole-word / SpanBERT masking, checked on construction.

    masking: 'token' (BERT), 'whole_word' or 'span' (SpanBERT).
    rates: what is selected and what it becomes (`MaskingRates`).
    span_p: parameter of the geometric span-length distribution ('span'; SpanBERT: 0.2).
    max_span_length: longest span, in units ('span'; SpanBERT: 10).
    span_length_tail: 'renormalize' (SpanBERT's code) or 'clip' the geometric at max_span_length.
    whole_word_spans: spans count words (SpanBERT) rather than tokens ('span').
    span_boundaries: also emit each selected token's span boundaries and position in its span, the features
      of SpanBERT's span boundary objective (ptmjax/objectives/span_boundaries.py).
    """

    masking: str = "token"
    rates: MaskingRates = dataclasses.field(default_factory=MaskingRates)
    span_p: float = 0.2
    max_span_length: int = 10
    span_length_tail: str = "renormalize"
    whole_word_spans: bool = True
    span_boundaries: bool = False

    def __post_init__(self) -> None:
        if self.masking not in MASKING_KINDS:
            raise ValueError(f"unknown masking {self.masking!r}; known: {', '.join(MASKING_KINDS)}")
        self.span_probabilities()

    def uses_words(self) -> bool:
        """Whether the units are words (which needs a SentencePiece vocabulary)."""
        return self.masking == "whole_word" or (self.masking == "span" and self.whole_word_spans)

    def span_probabilities(self) -> np.ndarray:
        """Probabilities of span lengths 1..max_span_length."""
        return span_length_probabilities(self.span_p, self.max_span_length, self.span_length_tail)


def word_start_table(vocabulary: seqio.Vocabulary) -> np.ndarray:
    """bool[vocab_size]: True where the id's piece starts a word ('▁...'), is special or is a sentinel.

    Decodes every piece once with the vocabulary's SentencePiece processor
    (`vocabulary.tokenizer`), so it needs a `seqio.SentencePieceVocabulary`.
    """
    tokenizer = getattr(vocabulary, "tokenizer", None)
    if tokenizer is None or not hasattr(tokenizer, "id_to_piece"):
        raise ValueError(
            f"whole-word masking needs a SentencePiece vocabulary (with .tokenizer.id_to_piece); got {vocabulary}; "
            "use masking='token' for other vocabularies"
        )
    table = np.ones([vocabulary.vocab_size], bool)
    for i in range(min(tokenizer.get_piece_size(), common.sentinel_start(vocabulary))):
        if not (tokenizer.is_control(i) or tokenizer.is_unknown(i)):
            table[i] = tokenizer.id_to_piece(i).startswith(WORD_BOUNDARY)
    return table


def span_length_probabilities(p: float, max_length: int, tail: str = "renormalize") -> np.ndarray:
    """Probabilities of span lengths 1..max_length under Geometric(p) truncated or clipped at max_length."""
    if not 0.0 < p <= 1.0:
        raise ValueError(f"span_p={p} must lie in (0, 1] (SpanBERT: 0.2)")
    if max_length < 1:
        raise ValueError(f"max_span_length={max_length} must be at least 1 (SpanBERT: 10)")
    lengths = np.arange(1, max_length + 1)
    probs = p * (1.0 - p) ** (lengths - 1)
    if tail == "renormalize":
        return probs / probs.sum()
    if tail == "clip":
        probs[-1] += 1.0 - probs.sum()
        return probs
    raise ValueError(f"unknown span_length_tail {tail!r}; known: {', '.join(SPAN_LENGTH_TAILS)}")


def sample_span_lengths(num: tf.Tensor, seed: tf.Tensor, probabilities: np.ndarray) -> tf.Tensor:
    """int32[num] span lengths, length l (1-based) drawn with probabilities[l - 1]."""
    logits = tf.math.log(tf.constant(probabilities[None, :], tf.float32))
    return tf.cast(tf.random.stateless_categorical(logits, num, seed)[0], tf.int32) + 1


def _units(eligible: tf.Tensor, starts_unit: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(unit id per token (-1 if not eligible), number of units, tokens per unit)."""
    previous_eligible = tf.concat([[False], eligible[:-1]], axis=0)
    opens = eligible & (starts_unit | ~previous_eligible)
    unit_id = tf.cumsum(tf.cast(opens, tf.int32)) - 1
    unit_id = tf.where(eligible, unit_id, -1)
    num_units = tf.reduce_sum(tf.cast(opens, tf.int32))
    unit_lengths = tf.math.bincount(
        tf.boolean_mask(unit_id, eligible), minlength=num_units, maxlength=num_units, dtype=tf.int32
    )
    return unit_id, num_units, unit_lengths


def _fits(lengths_in_order: tf.Tensor, budget: tf.Tensor) -> tf.Tensor:
    """Prefix of units (taken in order) kept: at least half of each kept unit fits in `budget`."""
    before = tf.cumsum(lengths_in_order, exclusive=True)
    return 2 * before + lengths_in_order <= 2 * budget


def _select_units_in_random_order(unit_lengths: tf.Tensor, budget: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    order = common.random_permutation(tf.size(unit_lengths), seed)
    taken_in_order = _fits(tf.gather(unit_lengths, order), budget)
    return tf.gather(taken_in_order, tf.argsort(order))  # back to unit order


def _select_spans(unit_lengths: tf.Tensor, budget: tf.Tensor, seed: tf.Tensor, probabilities: np.ndarray) -> tf.Tensor:
    """SpanBERT: random spans of units until `budget` tokens; bool per unit."""
    num_units = tf.size(unit_lengths)
    positions = tf.range(num_units)
    max_iterations = 4 * budget + 8

    def body(i: tf.Tensor, selected: tf.Tensor, count: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        step_seeds = tf.random.experimental.stateless_split(tf.random.experimental.stateless_fold_in(seed, i), 2)
        start = tf.random.stateless_uniform([], step_seeds[0], maxval=tf.maximum(num_units, 1), dtype=tf.int32)
        length = sample_span_lengths(1, step_seeds[1], probabilities)[0]
        start_taken = tf.gather(selected, tf.minimum(start, num_units - 1))
        new = (positions >= start) & (positions < start + length) & ~selected & ~start_taken
        new_lengths = tf.where(new, unit_lengths, 0)
        kept = new & _fits(new_lengths, budget - count)  # zero-length (old) units never block the prefix
        kept_count = tf.reduce_sum(tf.where(kept, unit_lengths, 0))
        return i + 1, selected | kept, count + kept_count

    def cond(i: tf.Tensor, selected: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
        return (count < budget) & (i < max_iterations)

    _, selected, _ = tf.while_loop(
        cond, body, (tf.constant(0), tf.zeros([num_units], tf.bool), tf.constant(0)), parallel_iterations=1
    )
    return selected


def select_positions(
    seed: tf.Tensor,
    *,
    eligible: tf.Tensor,
    starts_word: tf.Tensor | None,
    select_rate: float,
    masking: str,
    span_probabilities: np.ndarray | None = None,
) -> tf.Tensor:
    """bool[n]: the positions selected for prediction (only eligible ones).

    eligible: bool[n], the tokens that may be selected.
    starts_word: bool[n], True where a word starts (whole words / word spans), or None (units are tokens).
    """
    starts_unit = tf.ones_like(eligible) if starts_word is None else starts_word
    unit_id, _, unit_lengths = _units(eligible, starts_unit)
    budget = common.count_to_rate(tf.reduce_sum(tf.cast(eligible, tf.int32)), select_rate)
    if masking == "span":
        unit_selected = _select_spans(unit_lengths, budget, seed, span_probabilities)
    else:
        unit_selected = _select_units_in_random_order(unit_lengths, budget, seed)
    padded = tf.concat([unit_selected, [False]], 0)  # index num_units: not eligible
    return eligible & tf.gather(padded, tf.where(unit_id < 0, tf.size(unit_lengths), unit_id))


def replace_selected(
    tokens: tf.Tensor,
    selected: tf.Tensor,
    seeds: Sequence[tf.Tensor],
    *,
    mask_id: int,
    mask_rate: float,
    random_rate: float,
    random_id_range: tuple[int, int],
) -> tf.Tensor:
    """BERT's 80/10/10: selected tokens -> mask_id / a random regular id / unchanged."""
    draw = tf.random.stateless_uniform(tf.shape(tokens), seeds[0])
    random_ids = tf.random.stateless_uniform(
        tf.shape(tokens), seeds[1], minval=random_id_range[0], maxval=random_id_range[1], dtype=tokens.dtype
    )
    replaced = tf.where(draw < mask_rate + random_rate, random_ids, tokens)
    replaced = tf.where(draw < mask_rate, tf.constant(mask_id, tokens.dtype), replaced)
    return tf.where(selected, replaced, tokens)


def mask_sequence(
    tokens: tf.Tensor,
    seeds: Sequence[tf.Tensor],
    *,
    sentinel_start: int,
    select_rate: float,
    replace_kwargs: Mapping[str, object],
    masking: str = "token",
    word_starts: np.ndarray | None = None,
    span_probabilities: np.ndarray | None = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """(inputs, selected) of BERT masking one sequence with 3 seeds; pad, EOS and sentinels are never selected.

    replace_kwargs: from `replacement`; word_starts: `word_start_table` for whole words / word spans.
    """
    eligible = (tokens > common.EOS_ID) & (tokens < sentinel_start)
    starts_word = None if word_starts is None else tf.gather(tf.constant(word_starts), tokens)
    selected = select_positions(
        seeds[0],
        eligible=eligible,
        starts_word=starts_word,
        select_rate=select_rate,
        masking=masking,
        span_probabilities=span_probabilities,
    )
    return replace_selected(tokens, selected, seeds[1:], **replace_kwargs), selected


@seqio.map_over_dataset(num_seeds=3)
def _mask(
    features: Mapping[str, tf.Tensor], seeds: Sequence[tf.Tensor], *, append_eos: bool, with_boundaries: bool,
    **options,
) -> dict[str, tf.Tensor]:
    tokens = features["targets"]
    if append_eos:
        tokens = tf.concat([tokens, tf.constant([common.EOS_ID], tokens.dtype)], axis=0)
    inputs, selected = mask_sequence(tokens, seeds, **options)
    boundaries = span_boundaries.span_boundaries(selected) if with_boundaries else {}
    return {"inputs": inputs, "targets": tokens, LOSS_MASK_KEY: tf.cast(selected, tf.int32), **boundaries}


def mask_tokens(
    dataset: tf.data.Dataset, vocabulary: seqio.Vocabulary, options: MaskedLMOptions, append_eos: bool = False
) -> tf.data.Dataset:
    """{'targets': tokens} -> {'inputs', 'targets', 'loss_mask'} (and the span boundaries if asked; module doc)."""
    return _mask(
        dataset,
        word_starts=word_start_table(vocabulary) if options.uses_words() else None,
        sentinel_start=common.sentinel_start(vocabulary),
        append_eos=append_eos,
        with_boundaries=options.span_boundaries,
        select_rate=options.rates.select_rate,
        masking=options.masking,
        span_probabilities=options.span_probabilities() if options.masking == "span" else None,
        replace_kwargs=replacement(vocabulary, options.rates),
    )


def replacement(vocabulary: seqio.Vocabulary, rates: MaskingRates) -> dict[str, object]:
    """The keyword arguments of `replace_selected` for `rates` over `vocabulary`."""
    sentinel_start = common.sentinel_start(vocabulary)
    if sentinel_start <= common.FIRST_REGULAR_ID:
        raise ValueError(f"vocabulary {vocabulary} has no regular ids to select or draw")
    return {
        "mask_id": common.default_mask_id(vocabulary, rates.mask_id, "masked LM"),
        "mask_rate": rates.mask_rate,
        "random_rate": rates.random_rate,
        "random_id_range": (common.FIRST_REGULAR_ID, sentinel_start),
    }


@gin.configurable
def bert_mlm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: MaskedLMOptions | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 128,
) -> tf.data.Dataset:
    """The BERT / whole-word / SpanBERT masked-LM seqio preprocessor over tokenised 'targets'.

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: must give 'inputs'; every output has this length (EOS
        included if 'targets' adds one), the last piece of a stream may be shorter.
      output_features: seqio features; 'targets' gives the vocabulary.
      options: the masking's settings; None: `MaskedLMOptions()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before splitting.
    """
    vocabulary = common.vocabulary_of(output_features, "bert_mlm")
    append_eos = bool(common.eos_count(output_features, "targets"))
    raw_length = common.required_length(sequence_length, "inputs", "bert_mlm") - int(append_eos)
    dataset = common.token_stream(dataset, raw_length, max_chunk_tokens, documents_per_stream)
    return mask_tokens(dataset, vocabulary, options or MaskedLMOptions(), append_eos)
