"""UL2: per-denoiser density and span length, mode-token rates, exact reconstruction, lengths, seeds."""

import pathlib
from collections import Counter

import gin
import numpy as np
import pytest
from objective_helpers import FakeVocabulary, as_lists, features, is_sentinel, random_examples, reconstruct, run

from ptmjax.objectives import span_corruption, ul2

LENGTHS = {"inputs": 128, "targets": 64}
NLU, NLG, S2S = 2000, 2001, 2002  # the three lowest sentinels of the 2100-id test vocabulary


class WideVocabulary(FakeVocabulary):
    """1000 sentinels, so that long pieces of many spans fit; regular ids as in FakeVocabulary."""

    vocab_size = 3000
    extra_ids = 1000


@pytest.fixture(scope="module")
def documents() -> list[np.ndarray]:
    return random_examples(500, 20, 600, seed=0)


def mix(
    documents, seed: int = 1, lengths=LENGTHS, vocabulary=None, documents_per_stream: int = 8, **options
) -> list[dict[str, list[int]]]:
    options = ul2.Ul2Options(**options)
    output_features = features(vocabulary=vocabulary)
    return as_lists(
        run(lambda ds: ul2.ul2(ds, lengths, output_features, options, documents_per_stream=documents_per_stream),
            documents, seed)
    )


@pytest.fixture(scope="module")
def mixed(documents) -> list[dict[str, list[int]]]:
    return mix(documents)


def original(example: dict[str, list[int]]) -> list[int]:
    """The raw piece: S concatenates inputs and targets, R and X put the spans back."""
    mode, inputs = example["inputs"][0], example["inputs"][1:]
    return inputs + example["targets"] if mode == S2S else reconstruct(inputs, example["targets"])


def test_mode_tokens_are_the_lowest_sentinels():
    assert ul2.mode_token_ids(FakeVocabulary()) == {"R": NLU, "X": NLG, "S": S2S}


def test_reconstruction_gives_back_every_token_in_order(documents, mixed):
    assert [t for x in mixed for t in original(x)] == [t for d in documents for t in d.tolist()]


def test_mode_token_frequencies_match_the_default_rates(mixed):
    counts = Counter(x["inputs"][0] for x in mixed)
    assert set(counts) == {NLU, NLG, S2S}
    for mode, expected in ((NLU, 2 / 7), (NLG, 4 / 7), (S2S, 1 / 7)):  # 7 denoisers, equally likely
        assert abs(counts[mode] / len(mixed) - expected) < 0.04, (mode, counts[mode] / len(mixed))


def test_configured_rates_and_unused_denoisers(documents):
    out = mix(documents[:300], rates=(2, 0, 1, 0, 0, 0, 1))  # R(3, 0.15): 0.5, X(3, 0.5): 0.25, S: 0.25
    counts = Counter(x["inputs"][0] for x in out)
    for mode, expected in ((NLU, 0.5), (NLG, 0.25), (S2S, 0.25)):
        assert abs(counts[mode] / len(out) - expected) < 0.05, (mode, counts[mode] / len(out))
    raw_lengths = ul2.denoiser_raw_lengths([ul2.Denoiser.parse(("R", 3.0, 0.15))], LENGTHS, features(), 97)
    assert max(len(original(x)) for x in out if x["inputs"][0] == NLU) == raw_lengths[0] == 140


def test_pieces_fill_the_lengths_exactly(mixed):
    denoisers = ul2.Ul2Options().denoisers
    raw_lengths = ul2.denoiser_raw_lengths(denoisers, LENGTHS, features(), 97)
    assert raw_lengths == [140, 145, 94, 113, 147, 125, 64]
    for denoiser, raw in zip(denoisers[:-1], raw_lengths[:-1], strict=True):
        inputs, targets = span_corruption.corrupted_lengths(raw, denoiser.spans)
        assert inputs + 2 <= LENGTHS["inputs"] and targets + 1 <= LENGTHS["targets"]  # + mode token and EOS
        inputs, targets = span_corruption.corrupted_lengths(raw + 1, denoiser.spans)
        assert inputs + 2 > LENGTHS["inputs"] or targets + 1 > LENGTHS["targets"]


def test_pieces_have_their_denoisers_length_but_at_the_end_of_a_stream(documents, mixed):
    full = {NLU: {140, 145}, NLG: {94, 113, 147, 125}, S2S: {64}}
    stream_ends = set(np.cumsum([sum(map(len, documents[i : i + 8])) for i in range(0, len(documents), 8)]).tolist())
    position = 0
    for x in mixed:
        assert set(x) == {"inputs", "targets"}
        assert len(x["inputs"]) + 1 <= LENGTHS["inputs"] and len(x["targets"]) + 1 <= LENGTHS["targets"]
        size = len(original(x))
        position += size
        assert size in full[x["inputs"][0]] or (position in stream_ends and size < max(full[x["inputs"][0]]))
    assert position == max(stream_ends)


# (mode, mean span, density) -> inputs = targets length giving pieces of many spans (with 1000 sentinels)
SPAN_DENOISERS = {
    ("R", 3.0, 0.15): 512,
    ("R", 8.0, 0.15): 512,
    ("X", 3.0, 0.5): 512,
    ("X", 8.0, 0.5): 512,
    ("X", 64.0, 0.15): 4096,
    ("X", 64.0, 0.5): 4096,
}


@pytest.mark.parametrize("spec", sorted(SPAN_DENOISERS))
def test_each_span_denoiser_has_its_density_and_mean_span_length(documents, spec):
    length = SPAN_DENOISERS[spec]
    lengths = {"inputs": length, "targets": length}
    out = mix(documents[:300], lengths=lengths, vocabulary=WideVocabulary(), documents_per_stream=128, denoisers=[spec])
    mode, mean_span, density = spec
    noise = spans = raw = 0
    for x in out:
        assert x["inputs"][0] == (NLU if mode == "R" else NLG)
        piece_spans = sum(map(is_sentinel, x["targets"]))
        piece_noise, piece_raw = len(x["targets"]) - piece_spans, len(original(x))
        assert (piece_noise, piece_spans) == span_corruption.noise_counts(
            piece_raw, span_corruption.SpanCorruptionOptions(density, mean_span)
        )
        noise, spans, raw = noise + piece_noise, spans + piece_spans, raw + piece_raw
    assert abs(noise / raw - density) < 0.01 * density, noise / raw
    assert abs(noise / spans - mean_span) < 0.05 * mean_span, noise / spans


def test_deterministic_per_seed(documents, mixed):
    first = mix(documents[:40])
    assert first == mixed[: len(first)]
    assert first != mix(documents[:40], seed=2)


def test_bad_configurations_are_named(documents):
    with pytest.raises(ValueError, match="more than the 97 sentinels"):
        mix(documents[:1], lengths={"inputs": 2048, "targets": 2048}, denoisers=[("X", 3.0, 0.5)])
    with pytest.raises(ValueError, match="unknown UL2 denoiser mode 'Q'"):
        mix(documents[:1], denoisers=[("Q", 3.0, 0.15)])
    with pytest.raises(ValueError, match=r"needs \(mode, mean_noise_span_length, noise_density\)"):
        mix(documents[:1], denoisers=[("R",)])
    with pytest.raises(ValueError, match="noise_density=1.5"):
        mix(documents[:1], denoisers=[("X", 3.0, 1.5)])
    with pytest.raises(ValueError, match="2 rates"):
        mix(documents[:1], rates=(1, 2))
    with pytest.raises(ValueError, match="needs sequence_length\\['targets'\\]"):
        mix(documents[:1], lengths={"inputs": 128})


def test_gin_file_configures_the_denoisers(documents):
    gin_file = pathlib.Path(__file__).parents[2] / "gin_configs" / "objectives" / "ul2.gin"
    with gin.unlock_config():
        gin.clear_config()
        gin.parse_config_file(str(gin_file))
        gin.bind_parameter("ptmjax.objectives.ul2.Ul2Options.rates", (0, 0, 0, 0, 0, 0, 1))
    try:
        out = as_lists(run(lambda ds: ul2.ul2(ds, LENGTHS, features()), documents[:20], 0))
    finally:
        gin.clear_config()
    assert {x["inputs"][0] for x in out} == {S2S}  # the gin binding, not the equal default, was used
