"""The BART encoder-decoder warm-started from a BERT encoder with XLM's language embedding: its encoder gives the
BERT encoder's final hidden states on hand-made padded rows read in the source language, its decoder's
self-attention, feed-forward and norms are the encoder layers' arrays, its position tables hold a float64 NumPy
sum of position, type-0 and language rows, the cross-attention is the fresh one, and bad settings are named."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import traverse_util

from ptmjax.models import Bert, BertConfig
from ptmjax.models.bart import Bart
from ptmjax.models.encoder_warm_start import COPIED_LAYER_PARTS, warm_start_config, warm_start_params

CONFIG = BertConfig(vocab_size=120, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=16, nsp_head=False,
                    num_languages=3, dropout_rate=0.0, attention_dropout_rate=0.0)
SOURCE, TARGET = 0, 2
TOKENS = np.array([[5, 17, 99, 3, 1, 0, 0, 0], [44, 8, 1, 0, 0, 0, 0, 0], [7, 7, 7, 7, 7, 7, 7, 1]], np.int32)


@pytest.fixture(scope="module")
def models():
    bert = Bert(CONFIG)
    encoder = nn.unbox(bert.init(jax.random.key(0), jnp.asarray(TOKENS))["params"])
    encoder = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(1), x.shape), encoder)  # no 0/1s
    bart = Bart(warm_start_config(CONFIG))
    fresh = nn.unbox(bart.init(jax.random.key(2), jnp.asarray(TOKENS), jnp.asarray(TOKENS))["params"])
    return bert, encoder, bart, fresh, warm_start_params(encoder, fresh, SOURCE, TARGET)


def test_the_encoder_gives_the_source_encoders_hidden_states(models):
    bert, encoder, bart, _, warm = models
    want = bert.apply({"params": encoder}, jnp.asarray(TOKENS), language_ids=jnp.full_like(TOKENS, SOURCE),
                      method=Bert.encode)
    got = bart.apply({"params": warm}, jnp.asarray(TOKENS), method=Bart.encode)
    real = TOKENS != 0
    assert float(jnp.max(jnp.abs(got - want)[real])) < 2e-5
    assert float(jnp.max(jnp.abs(want[real]))) > 0.5  # not trivially small


def test_the_decoder_holds_the_encoder_layers_and_a_fresh_cross_attention(models):
    _, encoder, _, fresh, warm = models
    flat = lambda tree: traverse_util.flatten_dict(tree, sep="/")  # noqa: E731
    warm_flat, encoder_flat, fresh_flat = flat(warm), flat(encoder), flat(fresh)
    copied = 0
    for path, value in warm_flat.items():
        stack, layer, part, *rest = [*path.split("/"), "", ""]
        if stack == "decoder" and layer.startswith("layers_") and part in COPIED_LAYER_PARTS:
            source = "/".join([layer, COPIED_LAYER_PARTS[part], *filter(None, rest)])
            np.testing.assert_array_equal(value, encoder_flat[source])
            copied += 1
        elif stack == "decoder" and part.startswith("encoder_decoder_attention"):
            np.testing.assert_array_equal(value, fresh_flat[path])
        elif stack == "encoder" and layer.startswith("layers_"):
            np.testing.assert_array_equal(value, encoder_flat[path.split("/", 1)[1]])
    assert copied == 2 * 16  # per layer: q, k, v, out (kernel, bias), 2 norms (scale, bias), wi, wo (kernel, bias)
    np.testing.assert_array_equal(warm["token_embedder"]["embedding"],
                                  encoder["embeddings"]["token_embedder"]["embedding"])
    np.testing.assert_array_equal(warm["final_logits_bias"], encoder["mlm_head"]["bias"])


@pytest.mark.parametrize(("stack", "language"), [("encoder", SOURCE), ("decoder", TARGET)])
def test_position_tables_add_type_zero_and_the_stacks_language(models, stack, language):
    _, encoder, _, fresh, warm = models
    rows = {name: np.asarray(encoder["embeddings"][name]["embedding"], np.float64)
            for name in ("position_embedder", "token_type_embedder", "language_embedder")}
    want = rows["position_embedder"] + rows["token_type_embedder"][0] + rows["language_embedder"][language]
    table = np.asarray(warm[stack]["position_embedder"]["embedding"])
    np.testing.assert_allclose(table[2:], want, atol=1e-6)
    np.testing.assert_array_equal(table[:2], fresh[stack]["position_embedder"]["embedding"][:2])


def test_bad_settings_are_named(models):
    _, encoder, _, fresh, _ = models
    with pytest.raises(ValueError, match="language id 5 is outside the encoder's 3 languages"):
        warm_start_params(encoder, fresh, 0, 5)
    with pytest.raises(ValueError, match="num_decoder_layers=3 must be 1 to the encoder's 2"):
        warm_start_config(CONFIG, num_decoder_layers=3)
    with pytest.raises(ValueError, match="'embedding_size': 16"):
        warm_start_config(BertConfig(120, 32, 4, 2, 64, nsp_head=False, embedding_size=16))
