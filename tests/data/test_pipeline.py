"""The trainer-facing pipeline: shapes, packing, determinism, resumption, tasks."""

import functools
import itertools
import json
import logging

import numpy as np
import pytest
import seqio
import tensorflow as tf

from ptmjax.data import corpus, pipeline, vocabularies
from ptmjax.objectives import span_corruption
from ptmjax.tasks import pretraining, registry

LENGTHS = {"inputs": 64, "targets": 16}
PACKED = pipeline.ENCDEC_FEATURES + pipeline.PACKING_FEATURES


def batches(name, n, *, split="train", batch_size=4, seed=0, shuffle=True, **kwargs):
    ds = pipeline.get_dataset(name, split, LENGTHS, batch_size, seed=seed, shuffle=shuffle, **kwargs)
    return list(itertools.islice(ds.as_numpy_iterator(), n))


@pytest.fixture(scope="module")
def short_examples_task() -> str:
    """Documents not concatenated, so many examples are short and packing has work."""
    name = "test_ptmjax_stdlib_unconcatenated"
    preprocessors = pretraining.span_corruption_preprocessors("text")
    preprocessors[3] = functools.partial(span_corruption.span_corruption, documents_per_stream=1)
    source = seqio.FunctionDataSource(corpus.stdlib_dataset_fn, splits=corpus.SPLITS)
    registry.register_task(name, source, preprocessors, vocabularies.default_vocabulary())
    return name


@pytest.mark.slow
def test_shapes_and_dtypes():
    (packed,) = batches(pretraining.PRETRAIN_MIXTURE, 1)
    assert sorted(packed) == sorted(PACKED)
    for key, value in packed.items():
        assert value.dtype == np.int32
        assert value.shape == (4, LENGTHS["inputs"] if key.startswith("encoder") else LENGTHS["targets"])
    (unpacked,) = batches(pretraining.STDLIB_TASK, 1, pack=False)
    assert sorted(unpacked) == sorted(pipeline.ENCDEC_FEATURES)
    assert unpacked["encoder_input_tokens"].shape == (4, 64)


def check_segments(tokens, segments, positions):
    for row_tokens, row_segments, row_positions in zip(tokens, segments, positions, strict=True):
        assert ((row_tokens != 0) == (row_segments != 0)).all()  # padding is segment 0
        assert (row_positions[row_segments == 0] == 0).all()
        ids = [s for s in dict.fromkeys(row_segments.tolist()) if s]
        assert ids == list(range(1, len(ids) + 1))
        for s in ids:
            where = np.flatnonzero(row_segments == s)
            assert (np.diff(where) == 1).all()  # contiguous
            assert row_positions[where].tolist() == list(range(len(where)))  # restart at 0
            assert row_tokens[where][-1] == 1  # each packed example ends with EOS


@pytest.mark.slow
def test_packing_segments_and_positions(short_examples_task):
    multi_segment_rows = 0
    for b in batches(short_examples_task, 3, batch_size=8):
        check_segments(b["encoder_input_tokens"], b["encoder_segment_ids"], b["encoder_positions"])
        check_segments(b["decoder_target_tokens"], b["decoder_segment_ids"], b["decoder_positions"])
        assert (b["decoder_loss_weights"] == (b["decoder_target_tokens"] != 0)).all()
        # decoder inputs: targets shifted right by one inside each segment, 0 at segment starts.
        starts = b["decoder_positions"] == 0
        shifted = np.pad(b["decoder_target_tokens"][:, :-1], ((0, 0), (1, 0)))
        expected = np.where(starts, 0, shifted) * (b["decoder_segment_ids"] != 0)
        assert (b["decoder_input_tokens"] == expected).all()
        multi_segment_rows += int((b["encoder_segment_ids"].max(axis=1) > 1).sum())
    assert multi_segment_rows > 0


@pytest.mark.slow
def test_deterministic_per_seed():
    first = batches(pretraining.STDLIB_TASK, 2, seed=5)
    again = batches(pretraining.STDLIB_TASK, 2, seed=5)
    other = batches(pretraining.STDLIB_TASK, 2, seed=6)
    for a, b in zip(first, again, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    assert not np.array_equal(first[0]["encoder_input_tokens"], other[0]["encoder_input_tokens"])


@pytest.mark.slow
def test_no_autotune_thread_and_the_same_batches_as_with_one():
    """Deleting an iterator could wait out the autotuning thread's period (up to 60 s) at the end of a run."""
    make = functools.partial(pipeline.get_dataset, pretraining.STDLIB_TASK, "train", LENGTHS, 4, seed=3, shuffle=True)
    assert make().options().autotune.enabled is False
    autotuned = tf.data.Options()
    autotuned.autotune.enabled = True
    expected = list(itertools.islice(make().with_options(autotuned).as_numpy_iterator(), 3))
    for got, want in zip(itertools.islice(make().as_numpy_iterator(), 3), expected, strict=True):
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.slow
def test_seqio_advice_to_cache_a_shuffled_task_is_dropped_while_building_a_pipeline(caplog):
    """A restart skips to its position in the same seeded pipeline, so seqio's advice does not apply."""
    task = seqio.get_mixture_or_task(pretraining.STDLIB_TASK)
    with caplog.at_level(logging.WARNING):
        task.get_dataset(LENGTHS, split="train", shuffle=True, seed=0)
    assert pipeline.UNCACHED_SOURCE_ADVICE in caplog.text  # what seqio says
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        batches(pretraining.STDLIB_TASK, 1)
        batches(pretraining.PRETRAIN_MIXTURE, 1)
        assert pipeline.UNCACHED_SOURCE_ADVICE not in caplog.text
        task.get_dataset(LENGTHS, split="train", shuffle=True, seed=0)  # outside the pipeline: seqio's again
    assert pipeline.UNCACHED_SOURCE_ADVICE in caplog.text


def test_resumable_iterator_matches_a_fresh_one():
    make = functools.partial(
        pipeline.get_dataset, pretraining.PRETRAIN_MIXTURE, "train", LENGTHS, 2, seed=1, shuffle=True
    )
    fresh = pipeline.ResumableIterator(make)
    reference = [next(fresh) for _ in range(5)]
    state = json.loads(json.dumps(fresh.state()))
    assert state == {"batches_consumed": 5}
    resumed = pipeline.ResumableIterator(make, batches_consumed=3)
    for expected in reference[3:]:
        got = next(resumed)
        for k in expected:
            np.testing.assert_array_equal(got[k], expected[k])
    assert resumed.state() == state


def test_validation_is_finite_and_decodes_to_validation_text():
    ds = pipeline.get_dataset(pretraining.STDLIB_TASK, "validation", LENGTHS, 4, seed=0, shuffle=False, num_epochs=1)
    all_batches = list(ds.as_numpy_iterator())
    raw_tokens = 29_773 / 4  # characters / a generous 4 characters per token
    assert 0 < len(all_batches) < raw_tokens / 70
    vocab = vocabularies.default_vocabulary()
    text = vocab.decode([t for t in all_batches[0]["encoder_input_tokens"][0] if t < 2000])
    words = set(" ".join(corpus.stdlib_docstrings("validation")).split())
    assert sum(w in words for w in text.split()) > 0.5 * len(text.split())


@pytest.mark.slow
def test_byte_mixture_and_shards():
    (b,) = batches(pretraining.PRETRAIN_BYTE_MIXTURE, 1)
    assert b["encoder_input_tokens"].max() < 359 and b["decoder_target_tokens"].max() == 358  # <extra_id_0>
    (s0,) = batches(pretraining.STDLIB_TASK, 1, shuffle=False, shard_index=0, num_shards=2)
    (s1,) = batches(pretraining.STDLIB_TASK, 1, shuffle=False, shard_index=1, num_shards=2)
    assert not np.array_equal(s0["encoder_input_tokens"], s1["encoder_input_tokens"])


def test_text_files_task(tmp_path):
    lines = [f"Line {i} says that the quick brown fox jumps over the lazy dog number {i}." for i in range(200)]
    (tmp_path / "train.txt").write_text("\n".join(lines))
    pretraining.register_text_files_task("test_ptmjax_text_files", str(tmp_path / "train.txt"))
    pretraining.register_text_files_task("test_ptmjax_text_files", str(tmp_path / "train.txt"))  # again: replaces
    (b,) = batches("test_ptmjax_text_files", 1, shuffle=False, pack=False)
    text = vocabularies.default_vocabulary().decode([t for t in b["encoder_input_tokens"][0] if t < 2000])
    assert "quick brown fox" in text or "lazy dog" in text


def test_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="unknown split 'dev'.*train"):
        pipeline.get_dataset(pretraining.STDLIB_TASK, "dev", LENGTHS, 2, seed=0, shuffle=False)
    with pytest.raises(ValueError, match="unknown task or mixture 'ptmjax_nope'.*ptmjax_pretrain"):
        pipeline.get_dataset("ptmjax_nope", "train", LENGTHS, 2, seed=0, shuffle=False)


def test_registering_defaults_twice_is_fine():
    pretraining.register_defaults()
    assert seqio.get_mixture_or_task(pretraining.PRETRAIN_MIXTURE).tasks[0].name == pretraining.STDLIB_TASK


def test_padded_final_batch_keeps_every_example():
    """Evaluation batches cover the whole split: the remainder is padded, not dropped."""
    kwargs = dict(seed=0, shuffle=False, pack=False, num_epochs=1)
    every = list(pipeline.get_dataset(pretraining.STDLIB_TASK, "validation", LENGTHS, 1, **kwargs).as_numpy_iterator())
    padded = list(pipeline.get_dataset(
        pretraining.STDLIB_TASK, "validation", LENGTHS, 7, pad_final_batch=True, **kwargs
    ).as_numpy_iterator())
    assert len(every) % 7, "pick a batch size that leaves a remainder"
    assert all(b["encoder_input_tokens"].shape == (7, LENGTHS["inputs"]) for b in padded)
    rows = np.concatenate([b["decoder_target_tokens"] for b in padded])
    real = rows[rows.any(axis=1)]
    np.testing.assert_array_equal(real, np.concatenate([b["decoder_target_tokens"] for b in every]))
    weights = np.concatenate([b["decoder_loss_weights"] for b in padded])
    assert weights[len(every):].sum() == 0


def test_causal_lm_task_feeds_a_decoder_only_model():
    """Decoder-only features: inputs are the targets shifted right within each packed segment."""
    (batch,) = list(itertools.islice(pipeline.get_dataset(
        pretraining.STDLIB_LM_TASK, "train", {"targets": 32}, 4, seed=0, shuffle=True,
        feature_converter=seqio.DecoderFeatureConverter,
    ).as_numpy_iterator(), 1))
    assert set(batch) == {"decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights",
                          "decoder_segment_ids", "decoder_positions"}
    targets, inputs = batch["decoder_target_tokens"], batch["decoder_input_tokens"]
    segments = batch["decoder_segment_ids"]
    assert (batch["decoder_loss_weights"] == (targets > 0)).all() and targets.shape == (4, 32)
    continues = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    np.testing.assert_array_equal(inputs[:, 1:][continues], targets[:, :-1][continues])
    assert (targets == 1).any(), "examples end with EOS"
