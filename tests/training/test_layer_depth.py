"""Layer depths, layer-wise learning-rate decay, gradual unfreezing and the slanted triangular schedule,
against hand-computed values."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ptmjax.families.model_api import model_api
from ptmjax.models import Bert, BertConfig, EncoderDecoder, T5Config
from ptmjax.training.layer_depth import by_layer_depth, depths, gradual_unfreezing, layerwise_lr_decay
from ptmjax.training.schedules import slanted_triangular
from ptmjax.tree_paths import leaves_by_path

BERT = Bert(BertConfig(vocab_size=64, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16))
T5 = EncoderDecoder(T5Config(vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2,
                             num_decoder_layers=3, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0))
# A tree with one leaf per depth of a 2-layer encoder: embeddings 0, layers 1 and 2, head 3.
TREE = {"embeddings": {"w": jnp.ones(2)}, "layers_0": {"w": jnp.ones(2)}, "layers_1": {"w": jnp.ones(2)},
        "head": {"w": jnp.ones(2)}}


def depth_by_path(module) -> dict[str, int]:
    return dict(leaves_by_path(depths(model_api(module).abstract_params)))


def test_depths_of_an_encoder_and_an_encoder_decoder():
    bert = depth_by_path(BERT)
    assert bert["embeddings/token_embedder/embedding"] == 0
    assert bert["layers_0/attention/query/kernel"] == 1
    assert bert["layers_1/mlp/wo/bias"] == 2
    assert bert["mlm_head/transform/kernel"] == bert["pair_head/pooler/kernel"] == 3
    t5 = depth_by_path(T5)
    assert t5["token_embedder/embedding"] == 0
    assert t5["encoder/layers_1/attention/query/kernel"] == 2
    assert t5["decoder/layers_0/self_attention/query/kernel"] == 3  # the decoder's layers follow the encoder's
    assert t5["decoder/layers_2/mlp/wo/kernel"] == 5
    assert t5["encoder/encoder_norm/scale"] == t5["decoder/decoder_norm/scale"] == 6


def test_layerwise_decay_scales_each_depth():
    tx = optax.chain(optax.sgd(1.0), layerwise_lr_decay(0.5))
    updates, _ = tx.update(TREE, tx.init(TREE), TREE)
    got = {path: float(value[0]) for path, value in leaves_by_path(updates)}
    assert got == {"embeddings/w": -0.125, "layers_0/w": -0.25, "layers_1/w": -0.5, "head/w": -1.0}


def test_gradual_unfreezing_opens_one_depth_every_n_steps():
    tx = gradual_unfreezing(optax.sgd(1.0), every_steps=2)
    state = tx.init(TREE)
    moved = []
    for _ in range(8):
        updates, state = tx.update(TREE, state, TREE)
        moved.append(sorted(path.split("/")[0] for path, u in leaves_by_path(updates) if np.any(u != 0)))
    assert moved == [["head"]] * 2 + [["head", "layers_1"]] * 2 + [["head", "layers_0", "layers_1"]] * 2 + [
        ["embeddings", "head", "layers_0", "layers_1"]] * 2


def test_frozen_depths_keep_adamw_from_decaying_them():
    """AdamW's weight decay would move a parameter with a zero gradient: a frozen depth gets no update at all."""
    tx = by_layer_depth(0.1, optimizer=lambda lr: optax.adamw(lr, weight_decay=0.5), unfreeze_every_steps=10)
    updates, _ = tx.update(TREE, tx.init(TREE), TREE)
    assert [path for path, u in leaves_by_path(updates) if np.any(u != 0)] == ["head/w"]


@pytest.mark.parametrize(("step", "rate"), [(0, 1 / 32), (5, 16.5 / 32), (10, 1.0), (55, 16.5 / 32), (100, 1 / 32),
                                            (150, 1 / 32)])
def test_slanted_triangular_schedule(step, rate):
    """ULMFiT's formula with T = 100, cut_frac = 0.1, ratio = 32: p = t / 10, then 1 - (t - 10) / 90."""
    schedule = slanted_triangular(peak_learning_rate=1.0, total_steps=100, cut_fraction=0.1, ratio=32.0)
    np.testing.assert_allclose(float(jax.jit(schedule)(step)), rate, rtol=1e-6)
