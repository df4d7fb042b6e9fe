"""UL2's mixture of denoisers (Tay et al., 2022): R-, X- and S-denoisers behind mode tokens.

Each example is made by one denoiser, drawn per example with probabilities
proportional to `rates`. The default is the paper's seven denoisers, drawn
equally often (as its reference code `ul2_objective` does without rates):

| denoiser | mode token | mean span length | noise density |
|----------|------------|------------------|---------------|
| R        | [NLU]      | 3, 8             | 0.15          |
| X        | [NLG]      | 3, 8, 64         | 0.5           |
| X        | [NLG]      | 64               | 0.15          |
| S        | [S2S]      | -                | -             |

* R and X corrupt spans exactly as T5 (`span_corruption.random_spans_noise_mask`
  and `corrupt_with_mask`): inputs keep the non-noise tokens with one sentinel
  per span, `<extra_id_0>` first; targets are the sentinels and the spans.
* S is a prefix LM (`language_modeling.split_at_random_point`): a split point
  uniform in 1..n-1; the prefix is the input, the rest the target.
* Each prepends its mode token to the inputs. The mode tokens are the three
  lowest sentinels: [NLU] = vocab_size - extra_ids (`<extra_id_{extra_ids-1}>`),
  [NLG] the next id and [S2S] the one after (2000, 2001, 2002 in the stdlib
  vocabulary of 2100 ids, see `mode_token_ids`). Spans use the other
  extra_ids - 3 sentinels; a denoiser whose pieces need more raises an error.

Lengths: documents are cut to a random chunk, concatenated
(`documents_per_stream` at a time) and cut into pieces. The denoiser of each
piece is drawn first and fixes its raw length: the largest whose output, mode
token and EOS included, fits sequence_length['inputs'] and ['targets']
(`denoiser_raw_lengths`); the last piece of a stream is what is left. So no
token is dropped. Add `seqio.preprocessors.append_eos_after_trim` after `ul2`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import gin
import numpy as np
import seqio
import tensorflow as tf

from ptmjax.objectives import common, language_modeling, span_corruption, token_streams

MODE_TOKENS = {"R": "[NLU]", "X": "[NLG]", "S": "[S2S]"}  # in id order, from the lowest sentinel up
# (mode, mean_noise_span_length, noise_density), or ('S',): UL2's seven denoisers.
UL2_DENOISERS = (
    ("R", 3.0, 0.15),
    ("R", 8.0, 0.15),
    ("X", 3.0, 0.5),
    ("X", 8.0, 0.5),
    ("X", 64.0, 0.15),
    ("X", 64.0, 0.5),
    ("S",),
)
_DENOISER_KEY = "denoiser"
_LENGTHS_KEY = "piece_lengths"


@dataclasses.dataclass(frozen=True)
class Denoiser:
    """One denoiser: 'R' or 'X' (span corruption with `spans`) or 'S' (prefix LM, no spans)."""

    mode: str
    spans: span_corruption.SpanCorruptionOptions | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODE_TOKENS:
            raise ValueError(f"unknown UL2 denoiser mode {self.mode!r}; known: {', '.join(MODE_TOKENS)}")
        if self.mode == "S" and self.spans is not None:
            raise ValueError(f"the S-denoiser takes no span parameters, got {self.spans}; write ('S',)")
        if self.mode != "S" and self.spans is None:
            raise ValueError(
                f"the {self.mode}-denoiser needs (mode, mean_noise_span_length, noise_density), "
                f"e.g. ('{self.mode}', 3.0, 0.15)"
            )

    @classmethod
    def parse(cls, spec: Denoiser | Sequence) -> Denoiser:
        """A `Denoiser` from (mode, mean_noise_span_length, noise_density) for 'R' and 'X', or ('S',)."""
        if isinstance(spec, Denoiser):
            return spec
        mode, *spans = spec
        if len(spans) not in (0, 2):
            raise ValueError(
                f"UL2 denoiser {tuple(spec)}: write (mode, mean_noise_span_length, noise_density), or ('S',)"
            )
        mean_span, density = spans or (None, None)
        options = None if mean_span is None else span_corruption.SpanCorruptionOptions(density, mean_span)
        return cls(mode, options)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class Ul2Options:
    """The settings of UL2's mixture, checked on construction.

    denoisers: `Denoiser`s, or (mode, mean_noise_span_length, noise_density) for 'R' and 'X' and ('S',)
      for the prefix LM (default: the paper's seven, in the module doc's table).
    rates: relative probability of each denoiser per example, one per denoiser; None: all equal.
    """

    denoisers: Sequence = UL2_DENOISERS
    rates: Sequence[float] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "denoisers", tuple(Denoiser.parse(spec) for spec in self.denoisers))
        denoiser_probabilities(self.rates, len(self.denoisers))


def mode_token_ids(vocabulary: seqio.Vocabulary) -> dict[str, int]:
    """{'R': id of [NLU], 'X': id of [NLG], 'S': id of [S2S]}: the three lowest sentinels."""
    start = common.sentinel_start(vocabulary)
    if vocabulary.vocab_size - start < len(MODE_TOKENS) + 1:
        raise ValueError(
            f"UL2 needs at least {len(MODE_TOKENS) + 1} sentinels (3 mode tokens and 1 for spans); "
            f"{vocabulary} has {vocabulary.vocab_size - start}; use a vocabulary with more extra_ids"
        )
    return {mode: start + i for i, mode in enumerate(MODE_TOKENS)}


def denoiser_raw_lengths(
    denoisers: Sequence[Denoiser],
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    num_span_sentinels: int,
) -> list[int]:
    """Raw tokens per piece of each denoiser: the most whose output (mode token and EOS included) fits.

    Raises when a span denoiser's pieces would need more than `num_span_sentinels` spans.
    """
    inputs_limit = common.length_less_eos(sequence_length, output_features, "inputs", "ul2") - 1  # the mode token
    targets_limit = common.length_less_eos(sequence_length, output_features, "targets", "ul2")
    if min(inputs_limit, targets_limit) < 1:
        raise ValueError(
            f"ul2 needs room for the mode token and one token on each side; got sequence_length={dict(sequence_length)}"
        )
    lengths = []
    for denoiser in denoisers:
        if denoiser.mode == "S":  # any split of n tokens leaves at most n - 1 on each side
            lengths.append(min(inputs_limit, targets_limit) + 1)
            continue
        raw = span_corruption.largest_raw_length(inputs_limit, targets_limit, denoiser.spans)
        num_spans = span_corruption.noise_counts(raw, denoiser.spans)[1]
        if num_spans > num_span_sentinels:
            raise ValueError(
                f"UL2 denoiser {denoiser} cuts pieces of {raw} tokens into {num_spans} spans, more than the "
                f"{num_span_sentinels} sentinels left beside the mode tokens; shorten task_feature_lengths "
                "or use a vocabulary with more extra_ids"
            )
        lengths.append(raw)
    return lengths


def denoiser_probabilities(rates: Sequence[float] | None, num_denoisers: int) -> np.ndarray:
    """rates normalised to sum to 1 (None: all equal); checked to be one non-negative rate per denoiser."""
    if rates is None:
        return np.full([num_denoisers], 1.0 / num_denoisers)
    array = np.asarray(rates, np.float64)
    if array.shape != (num_denoisers,):
        raise ValueError(f"ul2: {len(rates)} rates {list(rates)} for {num_denoisers} denoisers; give one per denoiser")
    if not (np.isfinite(array).all() and (array >= 0).all() and array.sum() > 0):
        raise ValueError(f"ul2: rates {list(rates)} must be finite, non-negative and not all zero")
    return array / array.sum()


@seqio.map_over_dataset(num_seeds=1)
def _draw_pieces(
    features: Mapping[str, tf.Tensor], seed: tf.Tensor, *, raw_lengths: np.ndarray, log_probabilities: np.ndarray
) -> dict[str, tf.Tensor]:
    """Draws the denoiser of each piece of a stream, and so the pieces' lengths."""
    tokens = features["targets"]
    size = tf.size(tokens)
    max_pieces = size // int(raw_lengths.min()) + 1
    denoiser = tf.random.stateless_categorical(log_probabilities[None, :], max_pieces, seed, dtype=tf.int32)[0]
    lengths = tf.gather(raw_lengths, denoiser)
    starts = tf.cumsum(lengths, exclusive=True)
    num_pieces = tf.reduce_sum(tf.cast(starts < size, tf.int32))  # piece i exists if it starts inside the stream
    return {
        "targets": tokens,
        _DENOISER_KEY: denoiser[:num_pieces],
        _LENGTHS_KEY: tf.minimum(lengths, size - starts)[:num_pieces],
    }


def _split_pieces(features: Mapping[str, tf.Tensor]) -> tf.data.Dataset:
    pieces = tf.RaggedTensor.from_row_lengths(features["targets"], tf.cast(features[_LENGTHS_KEY], tf.int64))
    return tf.data.Dataset.from_tensor_slices({"targets": pieces, _DENOISER_KEY: features[_DENOISER_KEY]})


@seqio.map_over_dataset(num_seeds=2)
def _denoise(
    features: Mapping[str, tf.Tensor],
    seeds: Sequence[tf.Tensor],
    *,
    denoisers: tuple[Denoiser, ...],
    mode_ids: tuple[int, ...],
    vocab_size: int,
) -> dict[str, tf.Tensor]:
    tokens = features["targets"]

    def branch(denoiser: Denoiser):
        if denoiser.mode == "S":
            return lambda: language_modeling.split_at_random_point(tokens, seeds[0])

        def corrupt() -> tuple[tf.Tensor, tf.Tensor]:
            mask = span_corruption.random_spans_noise_mask(tf.size(tokens), seeds, denoiser.spans)
            return span_corruption.corrupt_with_mask(tokens, mask, vocab_size)

        return corrupt

    inputs, targets = tf.switch_case(features[_DENOISER_KEY], [branch(d) for d in denoisers])
    mode = tf.gather(tf.constant(mode_ids, tokens.dtype), features[_DENOISER_KEY])
    return {"inputs": tf.concat([mode[None], inputs], axis=0), "targets": targets}


@gin.configurable
def ul2(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    options: Ul2Options | None = None,
    max_chunk_tokens: int = 65536,
    documents_per_stream: int = 128,
) -> tf.data.Dataset:
    """The UL2 mixture-of-denoisers seqio preprocessor over tokenised 'targets' (see the module doc).

    Args:
      dataset: examples with an int32 'targets' feature (the tokenised text).
      sequence_length: must give 'inputs' and 'targets'; they fix each denoiser's piece length.
      output_features: seqio features; 'targets' gives the vocabulary (sentinels and mode tokens).
      options: the denoisers and their rates; None: `Ul2Options()` as gin binds it.
      max_chunk_tokens: each document is first cut to a random chunk of this size.
      documents_per_stream: documents concatenated before cutting pieces.
    """
    vocabulary = common.vocabulary_of(output_features, "ul2")
    options = options or Ul2Options()
    probabilities = denoiser_probabilities(options.rates, len(options.denoisers))
    used = [i for i, p in enumerate(probabilities) if p > 0]
    parsed, probabilities = [options.denoisers[i] for i in used], probabilities[used]
    mode_ids = mode_token_ids(vocabulary)
    num_span_sentinels = vocabulary.vocab_size - common.sentinel_start(vocabulary) - len(MODE_TOKENS)
    raw_lengths = denoiser_raw_lengths(parsed, sequence_length, output_features, num_span_sentinels)
    dataset = token_streams.select_random_chunk(dataset, "targets", max_chunk_tokens)
    dataset = token_streams.concatenate_token_streams(dataset, "targets", documents_per_stream)
    dataset = _draw_pieces(
        dataset, raw_lengths=np.asarray(raw_lengths, np.int32), log_probabilities=np.log(probabilities)
    ).flat_map(_split_pieces)
    return _denoise(
        dataset,
        denoisers=tuple(parsed),
        mode_ids=tuple(mode_ids[d.mode] for d in parsed),
        vocab_size=vocabulary.vocab_size,
    )
