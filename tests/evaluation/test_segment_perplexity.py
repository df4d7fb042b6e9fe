"""Perplexity with and without Transformer-XL's memory, on documents that repeat one random segment: each
segment is its predecessor again, so only the memory can tell the segment's tokens, and a model trained to
copy from it must do better with it than without it on documents it has never seen."""

import jax
import numpy as np
import optax
import pytest

from ptmjax import partitioning
from ptmjax.evaluation.segment_perplexity import segment_perplexity
from ptmjax.families.token_loss import LossConfig, token_cross_entropy
from ptmjax.models.transformer_xl import TransformerXL, TransformerXLConfig
from ptmjax.partitioning import MeshConfig
from ptmjax.training.recurrent_memory import RecurrentMemory
from ptmjax.training.trainer import Trainer

VOCAB, SEGMENT, ROWS, REPEATS = 16, 6, 8, 4
CONFIG = TransformerXLConfig(vocab_size=VOCAB, d_model=32, num_heads=2, num_layers=1, d_ff=64,
                             memory_length=SEGMENT, dropout_rate=0.0, attention_dropout_rate=0.0)


def repeated_segment_batches(seed, steps):
    """`steps` batches of SegmentStreamFeatureConverter's form: each row's lane is documents of one random
    segment said REPEATS times, cut into segments that line up with the repeats."""
    rng = np.random.default_rng(seed)
    documents = steps // REPEATS + 1
    lanes = [np.concatenate([np.tile(rng.integers(0, VOCAB, SEGMENT), REPEATS) for _ in range(documents)])
             for _ in range(ROWS)]
    return [{"decoder_input_tokens": np.stack([lane[t * SEGMENT:(t + 1) * SEGMENT] for lane in lanes]),
             "decoder_target_tokens": np.stack([lane[t * SEGMENT + 1:(t + 1) * SEGMENT + 1] for lane in lanes]),
             "decoder_loss_weights": np.ones((ROWS, SEGMENT), np.int32)} for t in range(steps)]


def trained_params(steps=150):
    objective, model = RecurrentMemory(ROWS), TransformerXL(CONFIG)
    mesh = partitioning.make_mesh(MeshConfig(), jax.devices()[:1])
    trainer = Trainer(model, optax.adam(1e-2), lambda _: 1e-2, mesh, MeshConfig().rules, LossConfig(z_loss=0.0),
                      extra_state=objective.extra_state(model), objective=objective)
    state = trainer.init_state(jax.random.key(0))
    for batch in repeated_segment_batches(0, steps):
        state, _ = trainer.train_step(state, partitioning.global_batch(batch, mesh), jax.random.key(1))
    return jax.device_get(state.params)


@pytest.mark.slow  # 150 train steps: about 45 s on a loaded 2-core CPU
def test_memory_lowers_perplexity_where_each_segment_repeats_the_last():
    params = trained_params()
    unseen = repeated_segment_batches(1, 4 * REPEATS)
    model = TransformerXL(CONFIG)
    with_memory = segment_perplexity(model, params, unseen, with_memory=True)
    without = segment_perplexity(model, params, unseen, with_memory=False)
    assert with_memory["tokens"] == without["tokens"] == 4 * REPEATS * ROWS * SEGMENT
    # Without memory a segment's fresh tokens are a guess among VOCAB; with it, three repeats in four are copies.
    assert without["perplexity"] > VOCAB / 4
    assert with_memory["perplexity"] < without["perplexity"] / 2, (with_memory, without)


def test_without_memory_each_segment_is_scored_alone():
    model = TransformerXL(CONFIG)
    params = model.init(jax.random.key(3), np.ones((1, 1), np.int32))["params"]
    batches = repeated_segment_batches(2, 3)
    got = segment_perplexity(model, params, batches, with_memory=False)
    nll = [token_cross_entropy(model.apply({"params": params}, b["decoder_input_tokens"]),
                               b["decoder_target_tokens"])[0] for b in batches]
    np.testing.assert_allclose(got["nll"], np.mean(np.stack(nll)), rtol=1e-6)
