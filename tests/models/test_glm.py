"""GLM: GPT-2 with 2D (block) positions and a bidirectional part A equals a float64 NumPy forward pass.

No transformers class implements GLM (Du et al., 2022): transformers' `glm` is GLM-4, a rotary-position
decoder without 2D positions or blank infilling. The reference here is written from the paper: token +
position + block-position embeddings, pre-LN blocks, part A attending to all of part A, part B to part A and
the earlier tokens of part B.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow as tf

from ptmjax.convert import hf_gpt2
from ptmjax.models import GPT2, GPT2Config
from ptmjax.objectives import blank_infilling

CONFIG = GPT2Config(
    vocab_size=64, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=32, dropout_rate=0.0,
    attention_dropout_rate=0.0, block_position_embeddings=True,
)


def glm_rows(lengths=(20, 13), seed: int = 0) -> dict[str, np.ndarray]:
    """Blank-infilling rows of random texts, right-padded with 0 to one length, as model inputs."""
    rng = np.random.default_rng(seed)
    ids = blank_infilling.blank_ids(CONFIG.vocab_size)
    rows = [
        blank_infilling.blank_infill(
            tf.constant(rng.integers(3, ids.end, n), tf.int32), [tf.constant([seed, i]) for i in range(4)],
            ids, blank_infilling.BlankInfillingOptions(noise_density=0.3),
        )
        for n in lengths
    ]
    width = max(len(r["inputs"]) for r in rows)
    pad = lambda x: np.pad(x.numpy(), (0, width - len(x)))  # noqa: E731
    fields = {key: np.stack([pad(r[key]) for r in rows]) for key in blank_infilling.FEATURES}
    valid = np.stack([pad(tf.ones_like(r["inputs"])) for r in rows])
    return {
        "decoder_input_tokens": fields["inputs"], "decoder_positions": fields["positions"],
        "decoder_block_positions": fields["block_positions"], "decoder_segment_ids": valid,
        "decoder_causal_attention": valid * (fields["block_positions"] == 0),
    }


def perturbed_params(seed: int = 0) -> dict:
    """Initialised parameters with LayerNorms and biases moved off (1, 0), so a wrong mapping shows."""
    params = jax.jit(GPT2(CONFIG).init)(jax.random.key(seed), jnp.ones((1, 1), jnp.int32))["params"]
    rng = np.random.default_rng(seed)

    def perturb(path, x):
        name = jax.tree_util.keystr(path)
        x = np.asarray(jax.device_get(x.value if hasattr(x, "value") else x), np.float32)
        if name.endswith("['bias']") or name.endswith("['scale']"):
            x = x + 0.2 * rng.standard_normal(x.shape).astype(np.float32)
        elif name.endswith("['embedding']"):
            x = x / x.std() * 0.5
        return x

    return jax.tree_util.tree_map_with_path(perturb, params, is_leaf=lambda x: hasattr(x, "names"))


def layer_norm(x, p, eps=1e-5):
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def glm_mask(block_positions, valid):
    """[b, q, k]: part A (block position 0) sees all of part A; part B sees part A and itself and before."""
    length = valid.shape[1]
    part_a = (block_positions == 0) & (valid > 0)
    earlier = np.arange(length)[None, :, None] >= np.arange(length)[None, None, :]
    mask = (part_a[:, :, None] & part_a[:, None, :]) | (~part_a[:, :, None] & earlier)
    return mask & (valid[:, None, :] > 0)


def numpy_glm(params, batch) -> np.ndarray:
    """float64 logits [b, t, vocab]."""
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    h = (p["token_embedder"]["embedding"][batch["decoder_input_tokens"]]
         + p["position_embedder"]["embedding"][batch["decoder_positions"]]
         + p["block_position_embedder"]["embedding"][batch["decoder_block_positions"]])
    mask = glm_mask(batch["decoder_block_positions"], batch["decoder_segment_ids"])[:, None]
    for i in range(CONFIG.num_layers):
        layer = p[f"layers_{i}"]
        a, att = layer_norm(h, layer["pre_attention_layer_norm"]), layer["attention"]
        q, k, v = (np.einsum("bte,ehd->bthd", a, att[n]["kernel"]) + att[n]["bias"] for n in ("query", "key", "value"))
        logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(CONFIG.head_dim)
        logits = np.where(mask, logits, -1e30)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        h = h + np.einsum("bhqk,bkhd,hde->bqe", weights, v, att["out"]["kernel"]) + att["out"]["bias"]
        m, mlp = layer_norm(h, layer["pre_mlp_layer_norm"]), layer["mlp"]
        h = h + gelu(m @ mlp["wi"]["kernel"] + mlp["wi"]["bias"]) @ mlp["wo"]["kernel"] + mlp["wo"]["bias"]
    return layer_norm(h, p["decoder_norm"]) @ p["token_embedder"]["embedding"].T


def test_logits_equal_a_float64_numpy_glm():
    batch, params = glm_rows(), perturbed_params()
    logits = np.asarray(jax.jit(lambda p, b: GPT2(CONFIG).apply({"params": p}, **b))(params, batch))
    want = numpy_glm(params, batch)
    real = batch["decoder_segment_ids"] > 0
    diff = np.abs(logits - want)[real].max()
    print(f"GLM vs float64 NumPy: max |logit diff| {diff:.2e} (logits' scale {np.abs(want).max():.1f})")
    assert diff < 2e-4
    # The block positions and part A's bidirectional mask both matter.
    no_blocks = numpy_glm(params, {**batch, "decoder_block_positions": 0 * batch["decoder_block_positions"]})
    part_b = real & (batch["decoder_block_positions"] > 0)
    assert np.abs(no_blocks - want).max(axis=-1)[part_b].min() > 1e-3
    causal = np.asarray(GPT2(CONFIG).apply({"params": params}, **{**batch, "decoder_causal_attention": None}))
    part_a = real & (batch["decoder_block_positions"] == 0)
    assert np.abs(causal - logits)[part_a].max() > 1e-2


def test_gpt2_without_the_table_is_unchanged_and_refuses_block_positions():
    gpt2 = dataclasses.replace(CONFIG, block_position_embeddings=False)
    params = perturbed_params()
    plain = {k: v for k, v in params.items() if k != "block_position_embedder"}
    batch = glm_rows()
    fields = {k: v for k, v in batch.items() if k != "decoder_block_positions"}
    zero_table = {**params, "block_position_embedder": jax.tree.map(np.zeros_like, params["block_position_embedder"])}
    np.testing.assert_array_equal(
        GPT2(gpt2).apply({"params": plain}, **fields), GPT2(CONFIG).apply({"params": zero_table}, **batch)
    )
    with pytest.raises(ValueError, match="block_position_embeddings is False"):
        GPT2(gpt2).apply({"params": plain}, **batch)
    with pytest.raises(ValueError, match="block_position_embeddings=True"):
        hf_gpt2.to_hf_config(CONFIG)
