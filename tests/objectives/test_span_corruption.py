"""T5 span corruption: lengths, statistics, exact invertibility, sentinels, seeds."""

import itertools

import numpy as np
import pytest
import seqio
import tensorflow as tf
from objective_helpers import NUM_SENTINELS, VOCAB_SIZE, is_sentinel, reconstruct

from ptmjax.objectives import span_corruption as sc

T5 = sc.SpanCorruptionOptions(0.15, 3.0)
HALF = sc.SpanCorruptionOptions(0.5, 3.0)


def corrupt(examples: list[np.ndarray], seed: int) -> list[tuple[list[int], list[int]]]:
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": e} for e in examples),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )
    with seqio.utils.map_seed_manager(seed):
        ds = sc.corrupt_spans(ds, VOCAB_SIZE, T5)
    return [(x["inputs"].tolist(), x["targets"].tolist()) for x in ds.as_numpy_iterator()]


@pytest.fixture(scope="module")
def examples() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 600, size=300)
    return [rng.integers(3, VOCAB_SIZE - NUM_SENTINELS, size=n).astype(np.int32) for n in lengths]


@pytest.fixture(scope="module")
def corrupted(examples) -> list[tuple[list[int], list[int]]]:
    return corrupt(examples, seed=7)


def test_lengths_match_t5_for_512():
    assert sc.span_corruption_lengths(512, T5) == (568, 114)


def t5_random_spans_helper(inputs_length: int, noise_density: float, mean_noise_span_length: float):
    """T5's own arithmetic (t5.data.preprocessors.random_spans_helper, one sentinel per span), written out."""

    def lengths(tokens_length):
        num_noise_tokens = int(round(tokens_length * noise_density))
        num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
        return tokens_length - num_noise_tokens + num_noise_spans + 1, num_noise_tokens + num_noise_spans + 1

    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs, targets = lengths(tokens_length)
    if noise_density == 0.5 and targets > inputs:
        tokens_length -= 1
        targets -= 1
    return tokens_length, targets


@pytest.mark.parametrize("inputs_length", [64, 100, 128, 256, 512, 1024])
@pytest.mark.parametrize("noise_density,mean_noise_span_length", [(0.15, 3.0), (0.5, 3.0), (0.5, 8.0), (0.25, 5.0)])
def test_lengths_equal_t5s_random_spans_helper(inputs_length, noise_density, mean_noise_span_length):
    want = t5_random_spans_helper(inputs_length, noise_density, mean_noise_span_length)
    options = sc.SpanCorruptionOptions(noise_density, mean_noise_span_length)
    assert sc.span_corruption_lengths(inputs_length, options) == want


def test_noise_density_half_gives_targets_as_long_as_the_inputs():
    """T5's adjustment: raw 767 would need 513 targets; one token fewer needs exactly 512."""
    assert sc.span_corruption_lengths(512, HALF) == (766, 512)
    assert sc.corrupted_lengths(766, HALF) == (383 + 128, 383 + 128)


def test_lengths_hand_checked_for_64():
    # raw 70: noise round(10.5)=10 (half to even), spans round(3.33)=3 -> inputs 70-10+3+1=64.
    # raw 71: noise 11, spans 4 -> 65 > 64.   targets for 70: 10 + 3 + 1 = 14.
    assert sc.noise_counts(70, T5) == (10, 3)
    assert sc.noise_counts(71, T5) == (11, 4)
    assert sc.span_corruption_lengths(64, T5) == (70, 14)


@pytest.mark.parametrize("inputs_length", [3, 16, 64, 100, 512, 1024])
def test_raw_length_is_the_largest_that_fits(inputs_length):
    raw, targets = sc.span_corruption_lengths(inputs_length, T5)
    noise, spans = sc.noise_counts(raw, T5)
    assert raw - noise + spans + 1 <= inputs_length
    assert targets == noise + spans + 1
    noise1, spans1 = sc.noise_counts(raw + 1, T5)
    assert raw + 1 - noise1 + spans1 + 1 > inputs_length


def test_reconstruction_is_exact(examples, corrupted):
    for original, (inputs, targets) in zip(examples, corrupted, strict=True):
        assert reconstruct(inputs, targets) == original.tolist()


def test_sentinels_descend_from_the_top_of_the_vocabulary(corrupted):
    for inputs, targets in corrupted:
        in_sentinels = [t for t in inputs if is_sentinel(t)]
        out_sentinels = [t for t in targets if is_sentinel(t)]
        expected = list(range(VOCAB_SIZE - 1, VOCAB_SIZE - 1 - len(in_sentinels), -1))
        assert in_sentinels == out_sentinels == expected
        assert not is_sentinel(inputs[0]), "corruption starts with non-noise"
        assert is_sentinel(targets[0])
        assert all(not (is_sentinel(a) and is_sentinel(b)) for a, b in itertools.pairwise(targets)), "empty span"


def test_noise_density_and_mean_span_length(examples, corrupted):
    noise_tokens = spans = raw_tokens = 0
    for original, (_, targets) in zip(examples, corrupted, strict=True):
        num_spans = sum(map(is_sentinel, targets))
        noise_tokens += len(targets) - num_spans
        spans += num_spans
        raw_tokens += len(original)
    density, mean_span = noise_tokens / raw_tokens, noise_tokens / spans
    assert abs(density - 0.15) < 0.015, density
    assert abs(mean_span - 3.0) < 0.3, mean_span


@pytest.mark.slow
def test_noise_is_spread_uniformly_over_positions():
    length, n = 568, 400
    seeds = tf.random.experimental.stateless_split([1, 2], 2 * n).numpy()
    masks = np.stack(
        [
            sc.random_spans_noise_mask(tf.constant(length), (seeds[2 * i], seeds[2 * i + 1]), T5).numpy()
            for i in range(n)
        ]
    )
    assert masks.sum(axis=1).tolist() == [85] * n  # round(568 * 0.15)
    assert not masks[:, 0].any()
    for part in np.array_split(masks[:, 1:], 4, axis=1):  # each quarter of the sequence
        assert abs(part.mean() - 0.15) < 0.015


def test_short_sequences():
    for length in (1, 2, 3):
        mask = sc.random_spans_noise_mask(tf.constant(length), ([1, 1], [2, 2]), T5).numpy()
        assert mask.shape == (length,) and not mask[0]
    assert corrupt([np.array([5, 6], np.int32)], seed=0) == [([5, VOCAB_SIZE - 1], [VOCAB_SIZE - 1, 6])]


def test_deterministic_per_seed(examples, corrupted):
    assert corrupt(examples[:20], seed=7) == corrupted[:20]
    assert corrupt(examples[:20], seed=8) != corrupted[:20]


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="noise_density=1.5"):
        sc.SpanCorruptionOptions(noise_density=1.5)
    with pytest.raises(ValueError, match="inputs_length=2"):
        sc.span_corruption_lengths(2, T5)


class _FakeVocabulary:
    vocab_size = VOCAB_SIZE


def _chain(docs: list[list[int]], sequence_length: dict[str, int]) -> list[dict[str, list[int]]]:
    ds = tf.data.Dataset.from_generator(
        lambda: ({"targets": np.array(d, np.int32)} for d in docs),
        output_signature={"targets": tf.TensorSpec([None], tf.int32)},
    )
    features = {"targets": seqio.Feature(_FakeVocabulary())}  # only .vocabulary.vocab_size is read
    with seqio.utils.map_seed_manager(3):
        ds = sc.span_corruption(ds, sequence_length, features, documents_per_stream=4)
    return [{k: v.tolist() for k, v in x.items()} for x in ds.as_numpy_iterator()]


def test_full_chain_concatenates_splits_and_corrupts():
    rng = np.random.default_rng(1)
    docs = [rng.integers(3, 2000, size=n).tolist() for n in rng.integers(1, 150, size=30)]
    docs.append([])  # empty documents are dropped
    out = _chain(docs, {"inputs": 64, "targets": 16})
    raw = [reconstruct(x["inputs"], x["targets"]) for x in out]
    # Groups of 4 documents are concatenated, then cut in pieces of exactly 70 (the last: the rest).
    expected = []
    for start in range(0, len(docs), 4):
        stream = list(itertools.chain.from_iterable(docs[start : start + 4]))
        expected += [stream[i : i + 70] for i in range(0, len(stream), 70)]
    assert raw == expected
    for x in out:
        if len(reconstruct(x["inputs"], x["targets"])) == 70:
            assert (len(x["inputs"]), len(x["targets"])) == (63, 13)  # + EOS = 64, 14


def test_chain_rejects_too_short_targets():
    with pytest.raises(ValueError, match="targets need 14"):
        _chain([[5, 6, 7]], {"inputs": 64, "targets": 10})


def test_gin_file_configures_the_preprocessor():
    import pathlib

    import gin

    gin_file = pathlib.Path(__file__).parents[2] / "gin_configs" / "objectives" / "span_corruption.gin"
    with gin.unlock_config():
        gin.clear_config()
        gin.parse_config_file(str(gin_file))
        gin.bind_parameter("ptmjax.objectives.span_corruption.SpanCorruptionOptions.noise_density", 0.5)
    try:
        doc = list(range(3, 73))  # 70 tokens: shorter than the raw length at density 0.5
        (x,) = _chain([doc], {"inputs": 64})
        assert reconstruct(x["inputs"], x["targets"]) == doc
        noise = len(x["targets"]) - sum(map(is_sentinel, x["targets"]))
        assert noise == 35  # round(0.5 * 70): the gin binding, not the 0.15 default, was used
    finally:
        gin.clear_config()
