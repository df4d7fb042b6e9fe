"""attention_kernel='xla' (jax.nn.dot_product_attention) equals the einsum reference: T5 packed (relative
position bias, segment masks, cross-attention) and unpacked with padding (sequence lengths and the bias),
GPT-2 causal (packed and not) and prefix LM (packed), BERT with padding; outputs and gradients, and greedy
decoding with the key/value cache (T5, GPT-2). Outputs at padding are not compared: unpacked batches give
the kernel their padding as sequence lengths, and it writes zeros there where einsum attends uniformly."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.decoding import DecodeConfig, GenerationIds
from ptmjax.families.model_api import model_api
from ptmjax.models import GPT2, Bert, BertConfig, EncoderDecoder, GPT2Config, T5Config

VOCAB, ROWS, LENGTH = 40, 3, 6
T5 = T5Config(
    vocab_size=VOCAB, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
GPT = GPT2Config(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16, dropout_rate=0.0,
                 attention_dropout_rate=0.0)
BERT = BertConfig(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=2, d_ff=32, max_length=16, dropout_rate=0.0,
                  attention_dropout_rate=0.0)
SEGMENTS = np.array([[1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 2, 2], [1, 1, 1, 0, 0, 0]])
POSITIONS = np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 0, 1], [0, 1, 2, 0, 0, 0]])
UNPADDED = np.array([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])


def tokens(seed: int, valid: np.ndarray) -> jnp.ndarray:
    return jnp.asarray(np.random.default_rng(seed).integers(2, VOCAB, valid.shape) * (valid > 0), jnp.int32)


def packed(**fields) -> dict[str, jnp.ndarray]:
    return {name: jnp.asarray(value, jnp.int32) for name, value in fields.items()}


EVERYWHERE = np.ones_like(SEGMENTS)
CASES = {  # the model's config, its batch, and the output positions that are not padding
    "t5_packed": (T5, packed(
        encoder_input_tokens=tokens(0, SEGMENTS), decoder_input_tokens=tokens(1, SEGMENTS),
        encoder_segment_ids=SEGMENTS, decoder_segment_ids=SEGMENTS, encoder_positions=POSITIONS,
        decoder_positions=POSITIONS,
    ), EVERYWHERE),
    "t5_padding": (T5, packed(
        encoder_input_tokens=tokens(0, UNPADDED), decoder_input_tokens=tokens(1, EVERYWHERE),
    ), EVERYWHERE),
    "gpt2_causal": (GPT, packed(decoder_input_tokens=tokens(2, EVERYWHERE)), EVERYWHERE),
    "gpt2_causal_packed": (GPT, packed(
        decoder_input_tokens=tokens(2, SEGMENTS), decoder_segment_ids=SEGMENTS, decoder_positions=POSITIONS,
    ), EVERYWHERE),
    "gpt2_prefix_lm": (GPT, packed(
        decoder_input_tokens=tokens(3, SEGMENTS), decoder_segment_ids=SEGMENTS, decoder_positions=POSITIONS,
        decoder_causal_attention=(POSITIONS < 2) * (SEGMENTS > 0),
    ), EVERYWHERE),
    "bert_padding": (BERT, packed(input_tokens=tokens(4, UNPADDED)), UNPADDED),
}
MODELS = {T5Config: EncoderDecoder, GPT2Config: GPT2, BertConfig: Bert}


def outputs_and_grads(config, batch, real: np.ndarray, kernel: str):
    """The model's output logits where `real` [b, l] is 1 (zeros elsewhere), and the parameters' gradients of
    a random projection of them."""
    model = MODELS[type(config)](dataclasses.replace(config, attention_kernel=kernel))
    api = model_api(model)
    params = nn.unbox(jax.jit(api.init)(jax.random.key(0)))  # compiled: eager ops compile one by one on a GPU

    def forward(params):
        outputs = api.family.target_logits(model.apply({"params": params}, **batch)) * real[..., None]
        weights = jnp.asarray(np.random.default_rng(5).standard_normal(outputs.shape), outputs.dtype)
        return jnp.sum(outputs * weights), outputs

    (_, outputs), grads = jax.jit(jax.value_and_grad(forward, has_aux=True))(params)
    return outputs, grads


@pytest.mark.parametrize("case", sorted(CASES))
def test_dot_product_attention_equals_einsum(case):
    want, want_grads = outputs_and_grads(*CASES[case], "einsum")
    got, got_grads = outputs_and_grads(*CASES[case], "xla")
    np.testing.assert_allclose(got, want, atol=2e-5 * float(jnp.max(jnp.abs(want))))
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5 * scale), got_grads, want_grads)


@pytest.mark.parametrize("case", ["t5", "gpt2"])
@pytest.mark.slow
def test_cached_greedy_decoding_equals_einsum(case):
    config, batch, ids = {
        "t5": (T5, {"encoder_input_tokens": tokens(6, SEGMENTS)}, GenerationIds(1, 0, decoder_start_token_id=0)),
        "gpt2": (GPT, {"decoder_input_tokens": tokens(7, np.ones((ROWS, 3)))}, GenerationIds(1, 0, bos_token_id=0)),
    }[case]
    decoded = {}
    for kernel in ("einsum", "xla"):
        api = model_api(MODELS[type(config)](dataclasses.replace(config, attention_kernel=kernel)))
        params = nn.unbox(api.init(jax.random.key(0)))
        decoded[kernel] = api.predict(params, batch, DecodeConfig(max_decode_length=5), ids)
    np.testing.assert_array_equal(decoded["xla"].tokens, decoded["einsum"].tokens)
    np.testing.assert_allclose(decoded["xla"].scores, decoded["einsum"].scores, rtol=1e-5)


def test_the_fused_kernel_refuses_attention_dropout_and_unknown_kernels():
    config, batch, _ = CASES["gpt2_causal_packed"]
    model = GPT2(dataclasses.replace(config, attention_kernel="xla", attention_dropout_rate=0.1))
    params = model.init(jax.random.key(0), batch["decoder_input_tokens"])
    with pytest.raises(ValueError, match="attention_kernel='xla' has no dropout on attention probabilities"):
        model.apply(params, **batch, enable_dropout=True, rngs={"dropout": jax.random.key(1)})
    with pytest.raises(ValueError, match="GPT2Config.attention_kernel='flash' is unknown; use one of"):
        dataclasses.replace(config, attention_kernel="flash")


def test_cudnn_outside_a_gpu_or_in_float32_is_refused_with_the_fix(monkeypatch):
    config, batch, _ = CASES["gpt2_causal"]
    model = GPT2(dataclasses.replace(config, attention_kernel="cudnn", dtype="bfloat16"))
    params = model.init(jax.random.key(0), batch["decoder_input_tokens"])  # initialises through the einsum path
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with pytest.raises(ValueError, match="kernel='cudnn' runs on an NVIDIA GPU, not on 'tpu'; use attention_kernel="):
        model.apply(params, **batch)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    model = GPT2(dataclasses.replace(config, attention_kernel="cudnn"))
    with pytest.raises(ValueError, match="needs bfloat16 or float16 activations, got float32; set the model config's"):
        model.apply(params, **batch)


def relative_error(got, want, floor: float = 0.0) -> float:
    """||got - want|| / ||want||, the denominator at least `floor`."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), floor))


def worst_gradient_error(grads, want_grads) -> float:
    """The largest relative error of a parameter's gradient; norms below 1e-3 of the whole gradient's count as
    that (the attention key biases' gradients are zero but for rounding)."""
    floor = 1e-3 * np.sqrt(sum(np.sum(np.square(np.asarray(w, np.float64))) for w in jax.tree.leaves(want_grads)))
    return max(jax.tree.leaves(jax.tree.map(lambda g, w: relative_error(g, w, floor), grads, want_grads)))


def gpu_cases() -> dict:
    """Sizes cuDNN's flash attention takes (head_dim 64): T5 unpacked with trailing padding and packed, GPT-2."""
    t5 = T5Config(vocab_size=128, d_model=256, num_heads=4, head_dim=64, d_ff=512, num_encoder_layers=2,
                  num_decoder_layers=2, ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0)
    gpt = GPT2Config(vocab_size=128, d_model=256, num_heads=4, num_layers=2, d_ff=512, max_length=128,
                     dropout_rate=0.0, attention_dropout_rate=0.0)
    rng = np.random.default_rng(8)
    ids = lambda valid: jnp.asarray(rng.integers(2, 128, valid.shape) * (valid > 0), jnp.int32)  # noqa: E731
    lengths = np.array([128, 100, 64, 17])
    unpadded = (np.arange(128)[None] < lengths[:, None]).astype(np.int32)
    segments = np.where(np.arange(128)[None] < lengths[:, None] // 2, 1, 2) * unpadded
    starts = np.where(segments == 2, lengths[:, None] // 2, 0)
    decoder_segments = np.repeat([[1] * 30 + [2] * 34], 4, axis=0)
    return {
        "t5_padding": (t5, {"encoder_input_tokens": ids(unpadded), "decoder_input_tokens": ids(np.ones((4, 64)))},
                       np.ones((4, 64))),
        "t5_packed": (t5, packed(
            encoder_input_tokens=ids(unpadded), decoder_input_tokens=ids(decoder_segments),
            encoder_segment_ids=segments, decoder_segment_ids=decoder_segments,
            encoder_positions=(np.arange(128)[None] - starts) * unpadded,
            decoder_positions=np.arange(64)[None] - np.where(decoder_segments == 2, 30, 0),
        ), np.ones((4, 64))),
        "gpt2_causal": (gpt, {"decoder_input_tokens": ids(np.ones((4, 128)))}, np.ones((4, 128))),
    }


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN's fused attention runs on an NVIDIA GPU")
@pytest.mark.parametrize("case", ["t5_padding", "t5_packed", "gpt2_causal"])
def test_cudnn_in_bfloat16_is_as_close_to_float32_as_einsum_in_bfloat16(case):
    config, batch, real = gpu_cases()[case]
    want, want_grads = outputs_and_grads(config, batch, real, "einsum")  # float32
    errors = {}
    for kernel in ("einsum", "cudnn"):
        got, grads = outputs_and_grads(dataclasses.replace(config, dtype="bfloat16"), batch, real, kernel)
        errors[kernel] = (relative_error(got, want), worst_gradient_error(grads, want_grads))
    print(f"{case}: relative error against float32 einsum (outputs, worst gradient): {errors}")
    for kernel_error, einsum_error in zip(errors["cudnn"], errors["einsum"], strict=True):
        assert kernel_error <= 2 * einsum_error + 1e-3
