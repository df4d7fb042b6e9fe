"""Causal and prefix LM: stream lengths, split-point distribution, seqio converters, seeds."""

import itertools

import numpy as np
import pytest
import seqio
import tensorflow as tf
from objective_helpers import as_lists, features, random_examples, run

from ptmjax.objectives import language_modeling as lm


@pytest.fixture(scope="module")
def docs() -> list[np.ndarray]:
    return random_examples(60, 1, 120, seed=1)


def stream(docs, per_stream: int) -> list[list[int]]:
    return [list(itertools.chain.from_iterable(docs[i : i + per_stream])) for i in range(0, len(docs), per_stream)]


def test_causal_lm_fills_targets_and_keeps_every_token(docs):
    out = as_lists(
        run(
            lambda ds: lm.causal_lm(ds, {"targets": 33}, features(), documents_per_stream=4),
            docs,
            seed=0,
        )
    )
    assert all(set(x) == {"targets"} for x in out)
    expected = [s[i : i + 32] for s in stream(docs, 4) for i in range(0, len(s), 32)]  # 33 - EOS
    assert [x["targets"] for x in out] == expected


def test_prefix_lm_raw_length_fits_both_sides():
    assert lm.prefix_lm_raw_length({"inputs": 512, "targets": 512}, features()) == 512
    assert lm.prefix_lm_raw_length({"inputs": 64, "targets": 17}, features()) == 17
    assert lm.prefix_lm_raw_length({"inputs": 8, "targets": 8}, features(add_eos=False)) == 9
    with pytest.raises(ValueError, match="needs sequence_length\\['inputs'\\]"):
        lm.prefix_lm_raw_length({"targets": 8}, features())


def test_prefix_lm_splits_uniformly_and_losslessly(docs):
    seq = {"inputs": 21, "targets": 21}
    out = run(lambda ds: lm.prefix_lm(ds, seq, features(), documents_per_stream=4), docs * 5, seed=3)
    pieces = [s[i : i + 21] for s in stream(docs * 5, 4) for i in range(0, len(s), 21)]
    pieces = [p for p in pieces if len(p) >= 2]
    assert len(out) == len(pieces)
    splits = []
    for x, piece in zip(out, pieces, strict=True):
        assert x["inputs"].dtype == x["targets"].dtype == np.int32
        assert x["inputs"].tolist() + x["targets"].tolist() == piece
        assert 1 <= len(x["inputs"]) <= 20 and 1 <= len(x["targets"]) <= 20  # + EOS fits 21
        if len(piece) == 21:
            splits.append(len(x["inputs"]))
    counts = np.bincount(splits, minlength=21)[1:]
    assert len(splits) > 600 and counts.min() > 0  # every split point 1..20 occurs
    assert abs(np.mean(splits) - 10.5) < 0.6  # uniform on 1..20: mean 10.5, std of the mean ~0.23


def test_prefix_lm_works_with_seqio_converters(docs):
    seq = {"inputs": 16, "targets": 16}
    with seqio.utils.map_seed_manager(0):
        ds = lm.prefix_lm(
            tf.data.Dataset.from_generator(
                lambda: ({"targets": d} for d in docs),
                output_signature={"targets": tf.TensorSpec([None], tf.int32)},
            ),
            seq,
            features(),
        )
    ds = seqio.preprocessors.append_eos_after_trim(ds, output_features=features(), sequence_length=seq)
    decoder_only = seqio.PrefixLMFeatureConverter(pack=False)(ds, seq)
    x = next(decoder_only.as_numpy_iterator())
    assert x["decoder_target_tokens"].shape == (32,)
    num_inputs = int(x["decoder_causal_attention"].sum()) - 1  # the bidirectional prefix spans inputs + 1
    assert (x["decoder_loss_weights"][:num_inputs] == 0).all() and x["decoder_loss_weights"][num_inputs] == 1
    enc_dec = seqio.EncDecFeatureConverter(pack=False)(ds, seq)
    assert next(enc_dec.as_numpy_iterator())["encoder_input_tokens"].shape == (16,)


def test_prefix_lm_is_deterministic_per_seed(docs):
    def go(seed):
        return as_lists(run(lambda ds: lm.prefix_lm(ds, {"inputs": 21, "targets": 21}, features()), docs, seed))

    assert go(5) == go(5)
    assert go(5) != go(6)


def test_short_pieces_are_dropped():
    out = as_lists(run(lm.split_prefix, [[7], [7, 8], []], seed=0))
    assert out == [{"inputs": [7], "targets": [8]}]
