"""GLM blank infilling: exact reconstruction, masked fraction, span lengths, uniform orders, row layout, seeds."""

import itertools
import math

import numpy as np
import pytest
import seqio
import tensorflow as tf
from objective_helpers import VOCAB_SIZE, features, random_examples, run, token_dataset

from ptmjax.objectives import blank_infilling as bi

GLM = bi.BlankInfillingOptions()
IDS = bi.blank_ids(VOCAB_SIZE)


def infilled(examples, seed: int = 5, options: bi.BlankInfillingOptions = GLM):
    return run(lambda ds: bi.blank_infill_dataset(ds, IDS, options), examples, seed)


def parts(row: dict) -> tuple[list[int], list[dict]]:
    """Part A, and part B's spans in their order, each with its [MASK]'s position, inputs and targets."""
    a = int((row["block_positions"] == 0).sum())
    spans, starts = [], [i for i in range(a, len(row["inputs"])) if row["block_positions"][i] == 1]
    for start, end in zip(starts, [*starts[1:], len(row["inputs"])], strict=True):
        spans.append({key: row[key][start:end].tolist() for key in bi.FEATURES})
    return row["inputs"][:a].tolist(), spans


def reconstruct(row: dict) -> list[int]:
    """Independent inverse: each [MASK] of part A replaced by the span whose position names it."""
    part_a, spans = parts(row)
    by_position = {}
    for span in spans:
        position, tokens = span["positions"][0], span["inputs"][1:]
        assert span["inputs"][0] == IDS.start and span["targets"] == [*tokens, IDS.end]
        assert span["positions"] == [position] * len(span["inputs"]), "one position per span"
        assert span["block_positions"] == list(range(1, len(tokens) + 2))
        assert span["loss_mask"] == [1] * len(span["inputs"])
        by_position[position] = tokens
    assert sorted(by_position) == [i for i, t in enumerate(part_a) if t == IDS.mask], "a span for each [MASK]"
    return list(itertools.chain.from_iterable(by_position.get(i, [t]) for i, t in enumerate(part_a)))


@pytest.fixture(scope="module")
def examples():
    return random_examples(300, 20, 200)


@pytest.fixture(scope="module")
def rows(examples):
    return infilled(examples)


def test_reconstruction_is_exact_and_part_a_is_laid_out(examples, rows):
    for original, row in zip(examples, rows, strict=True):
        assert set(row) == set(bi.FEATURES)
        assert all(v.dtype == np.int32 and v.shape == row["inputs"].shape for v in row.values())
        assert reconstruct(row) == original.tolist()
        a = int((row["block_positions"] == 0).sum())
        assert row["positions"][:a].tolist() == list(range(a))
        assert not row["targets"][:a].any() and not row["loss_mask"][:a].any()
        num_masked = bi.masked_count(len(original), GLM)
        assert len(row["inputs"]) == len(original) + 2 * len(parts(row)[1])
        assert int(row["loss_mask"].sum()) == num_masked + len(parts(row)[1])


def test_masked_fraction_is_exactly_the_density(examples, rows):
    masked = [sum(len(s["inputs"]) - 1 for s in parts(row)[1]) for row in rows]
    assert masked == [bi.masked_count(len(e), GLM) for e in examples]
    assert abs(sum(masked) / sum(map(len, examples)) - 0.15) < 0.005


def simulated_mean_span_length(num_masked: list[int], trials: int = 200, seed: int = 0) -> float:
    """The same scheme in NumPy: truncated-Poisson lengths drawn until they cover the count, the last cut."""
    rng, p = np.random.default_rng(seed), np.array(GLM.span_length_probabilities())
    counts = np.repeat(num_masked, trials)
    draws = rng.choice(len(p), size=(len(counts), max(num_masked)), p=p) + 1
    starts = np.cumsum(draws, axis=1) - draws  # where each drawn span would begin
    return counts.sum() / (starts < counts[:, None]).sum()


def test_mean_span_length_matches_the_sampling_scheme(examples, rows):
    spans = [len(s["inputs"]) - 1 for row in rows for s in parts(row)[1]]
    want = simulated_mean_span_length([bi.masked_count(len(e), GLM) for e in examples])
    assert abs(np.mean(spans) - want) < 0.15, (np.mean(spans), want)
    assert 2.2 < want < 3.2  # below the truncated Poisson's 3 / (1 - e^-3) = 3.16: the last span is cut


def test_span_lengths_follow_the_truncated_poisson():
    """Uncut lengths: chi-square against P(k) = 3^k / k! renormalised over 1..39 (lengths > 8 pooled)."""
    lengths = bi.span_lengths(tf.constant(30000), [tf.constant([1, 2]), tf.constant([3, 4])], GLM).numpy()
    assert lengths.sum() == 30000 and lengths.min() >= 1
    p = np.array(GLM.span_length_probabilities())
    uncut = np.sort(lengths)[1:]  # dropping one (the cut one may be any) barely moves the counts
    observed = np.bincount(np.minimum(uncut, 9), minlength=10)[1:]
    expected = len(uncut) * np.append(p[:8], p[8:].sum())
    chi2 = ((observed - expected) ** 2 / expected).sum()
    assert chi2 < 26.1, (observed, expected)  # 8 degrees of freedom, p ~ 0.001
    assert abs(uncut.mean() - 3 / (1 - math.exp(-3))) < 0.05


def test_part_b_order_and_span_placement_are_uniform():
    """Rows of 3 spans: all 3! part-B orders about equally often; masked tokens spread evenly over the text."""
    options = bi.BlankInfillingOptions(noise_density=0.3, span_length_lambda=1.0, max_span_length=1)
    out = infilled([np.arange(10, 20, dtype=np.int32)] * 3000, seed=2, options=options)  # 3 spans of 1
    counts = dict.fromkeys(itertools.permutations(range(3)), 0)
    hits = np.zeros(10)
    for row in out:
        positions = [s["positions"][0] for s in parts(row)[1]]
        counts[tuple(int(r) for r in np.argsort(np.argsort(positions)))] += 1
        masked = [s["inputs"][1] - 10 for s in parts(row)[1]]
        hits[masked] += 1
    expected = len(out) / 6
    assert sum((c - expected) ** 2 / expected for c in counts.values()) < 20.5, counts  # 5 dof, p ~ 0.001
    chi2 = ((hits - 900) ** 2 / 900).sum()  # each of the 10 tokens is masked with probability 0.3
    assert chi2 < 27.9, hits  # 9 degrees of freedom, p ~ 0.001


def test_rows_fit_the_row_length_and_the_chain_keeps_the_stream():
    docs = [d.tolist() for d in random_examples(30, 1, 150, seed=1)]
    out = run(lambda ds: bi.blank_infilling(ds, {"targets": 32}, features(), documents_per_stream=4), docs, 3)
    raw = bi.largest_raw_length(32, GLM)
    assert raw == 24 and raw + 2 * bi.masked_count(raw, GLM) <= 32 < raw + 1 + 2 * bi.masked_count(raw + 1, GLM)
    pieces = []
    for start in range(0, len(docs), 4):
        stream = list(itertools.chain.from_iterable(docs[start : start + 4]))
        pieces += [stream[i : i + raw] for i in range(0, len(stream), raw)]
    assert [reconstruct(row) for row in out] == pieces
    assert max(len(row["inputs"]) for row in out) <= 32


def test_deterministic_per_seed(examples, rows):
    again, other = infilled(examples[:20]), infilled(examples[:20], seed=6)
    assert all((a[k] == b[k]).all() for a, b in zip(again, rows[:20], strict=False) for k in a)
    assert any(a["inputs"].tolist() != b["inputs"].tolist() for a, b in zip(other, rows[:20], strict=False))


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="noise_density=1.0"):
        bi.BlankInfillingOptions(noise_density=1.0)
    with pytest.raises(ValueError, match="span_length_lambda=0"):
        bi.BlankInfillingOptions(span_length_lambda=0)
    with pytest.raises(ValueError, match="rows of at least 3 tokens, got 2"):
        bi.largest_raw_length(2, GLM)
    with pytest.raises(ValueError, match=r"sequence_length\['targets'\]"):
        run(lambda ds: bi.blank_infilling(ds, {"inputs": 32}, features()), [[5, 6]], 0)



def test_feature_converter_gives_part_a_as_the_prefix_and_pads():
    from ptmjax.data.blank_infilling_converter import BlankInfillingFeatureConverter

    with seqio.utils.map_seed_manager(1):
        ds = bi.blank_infill_dataset(token_dataset([list(range(10, 30)), [5, 6, 7]]), IDS, GLM)
    rows = [{k: v.tolist() for k, v in x.items()} for x in ds.as_numpy_iterator()]
    batches = list(BlankInfillingFeatureConverter()(ds, {"targets": 32}).as_numpy_iterator())
    for row, got in zip(rows, batches, strict=True):
        n, pad = len(row["inputs"]), [0] * (32 - len(row["inputs"]))
        assert got["decoder_input_tokens"].tolist() == row["inputs"] + pad
        assert got["decoder_target_tokens"].tolist() == row["targets"] + pad
        assert got["decoder_loss_weights"].tolist() == row["loss_mask"] + pad
        assert got["decoder_positions"].tolist() == row["positions"] + pad
        assert got["decoder_block_positions"].tolist() == row["block_positions"] + pad
        assert got["decoder_segment_ids"].tolist() == [1] * n + pad
        assert got["decoder_causal_attention"].tolist() == [int(b == 0) for b in row["block_positions"]] + pad
    with pytest.raises(ValueError, match="does not pack"):
        BlankInfillingFeatureConverter(pack=True)
