"""attention_kernel='xla' (jax.nn.dot_product_attention) equals the einsum reference: T5 packed (relative
position bias, segment masks, cross-attention), GPT-2 causal and prefix LM (packed), BERT with padding;
outputs and gradients, and greedy decoding with the key/value cache (T5, GPT-2)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.models import GPT2, Bert, BertConfig, EncoderDecoder, GPT2Config, T5Config
from ptmjax.training.model_api import model_api

VOCAB, ROWS, LENGTH = 40, 3, 6
T5 = T5Config(
    vocab_size=VOCAB, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
GPT = GPT2Config(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16, dropout_rate=0.0,
                 attention_dropout_rate=0.0)  # fmt: skip
BERT = BertConfig(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16, dropout_rate=0.0,
                  attention_dropout_rate=0.0)  # fmt: skip
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 2, 2], [1, 1, 1, 0, 0, 0]])
POSITIONS = np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 0, 0]])


def tokens(seed: int, valid: np.ndarray) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(2, VOCAB, valid.shape) * (valid > 0), jnp.int32)


def packed(**fields) -> dict[str, jnp.ndarray]:
    return {name: jnp.asarray(value, jnp.int32) for name, value in fields.items()}


CASES = {
    "t5_packed": (T5, packed(
        encoder_input_tokens=tokens(0, SEGMENTS), decoder_input_tokens=tokens(1, SEGMENTS),
        encoder_segment_ids=SEGMENTS, decoder_segment_ids=SEGMENTS, encoder_positions=POSITIONS,
        decoder_positions=POSITIONS,
    )),
    "gpt2_causal_packed": (GPT, packed(
        decoder_input_tokens=tokens(2, SEGMENTS), decoder_segment_ids=SEGMENTS, decoder_positions=POSITIONS,
    )),
    "gpt2_prefix_lm": (GPT, packed(
        decoder_input_tokens=tokens(3, SEGMENTS), decoder_segment_ids=SEGMENTS, decoder_positions=POSITIONS,
        decoder_causal_attention=(POSITIONS < 2) * (SEGMENTS > 0),
    )),
    "bert_padding": (BERT, packed(input_tokens=tokens(4, np.array([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])))),
}  # fmt: skip
MODELS = {T5Config: EncoderDecoder, GPT2Config: GPT2, BertConfig: Bert}


def outputs_and_grads(config, batch, kernel: str):
    model = MODELS[type(config)](dataclasses.replace(config, attention_kernel=kernel))
    api = model_api(model)
    params = jax.tree.map(lambda box: box.value, api.init(jax.random.key(0)), is_leaf=lambda x: hasattr(x, "value"))

    def forward(params):
        outputs = api.family.target_logits(model.apply({"params": params}, **batch))
        weights = jnp.asarray(np.random.default_rng(5).standard_normal(outputs.shape), outputs.dtype)
        return jnp.sum(outputs * weights), outputs

    (_, outputs), grads = jax.jit(jax.value_and_grad(forward, has_aux=True))(params)
    return outputs, grads


@pytest.mark.parametrize("case", sorted(CASES))
def test_dot_product_attention_equals_einsum(case):
    config, batch = CASES[case]
    want, want_grads = outputs_and_grads(config, batch, "einsum")
    got, got_grads = outputs_and_grads(config, batch, "xla")
    np.testing.assert_allclose(got, want, atol=2e-5 * float(jnp.max(jnp.abs(want))))
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5 * scale), got_grads, want_grads)


@pytest.mark.parametrize("case", ["t5", "gpt2"])
def test_cached_greedy_decoding_equals_einsum(case):
    config, batch, ids = {
        "t5": (T5, {"encoder_input_tokens": tokens(6, SEGMENTS)}, GenerationIds(1, 0, decoder_start_token_id=0)),
        "gpt2": (GPT, {"decoder_input_tokens": tokens(7, np.ones((ROWS, 3)))}, GenerationIds(1, 0, bos_token_id=0)),
    }[case]  # fmt: skip
    decoded = {}
    for kernel in ("einsum", "xla"):
        api = model_api(MODELS[type(config)](dataclasses.replace(config, attention_kernel=kernel)))
        params = jax.tree.map(lambda b: b.value, api.init(jax.random.key(0)), is_leaf=lambda x: hasattr(x, "value"))
        decoded[kernel] = api.predict(params, batch, DecodeConfig(max_decode_length=5), ids)
    np.testing.assert_array_equal(decoded["xla"].tokens, decoded["einsum"].tokens)
    np.testing.assert_allclose(decoded["xla"].scores, decoded["einsum"].scores, rtol=1e-5)


def test_the_fused_kernel_refuses_attention_dropout_and_unknown_kernels():
    config, batch = CASES["gpt2_causal_packed"]
    model = GPT2(dataclasses.replace(config, attention_kernel="xla", attention_dropout_rate=0.1))
    params = model.init(jax.random.key(0), batch["decoder_input_tokens"])
    with pytest.raises(ValueError, match="attention_kernel='xla' has no dropout on attention probabilities"):
        model.apply(params, **batch, enable_dropout=True, rngs={"dropout": jax.random.key(1)})
    with pytest.raises(ValueError, match="GPT2Config.attention_kernel='flash' is unknown; use one of"):
        dataclasses.replace(config, attention_kernel="flash")
