"""Shared helpers for the model tests: configs from the gin files, cheap random weights, parameter checks."""

from __future__ import annotations

import importlib
import json
import math
import os
import pathlib
from collections.abc import Callable

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.layers.attention import MultiHeadAttention
from ptmjax.layers.attention_mask import AttentionMask
from ptmjax.models import EncoderDecoder, GPT2Config, T5Config

GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin_configs" / "models"


def load_t5_config(name: str, **overrides: object) -> T5Config:
    """Parse gin_configs/models/{name}.gin and build T5Config(**overrides); leaves gin cleared."""
    return load_gin_config(name, T5Config, **overrides)


def random_variables(config: T5Config, seed: int = 0) -> dict:
    """Random unboxed variables with the model's tree, drawn in numpy (much faster than eager `init` on CPU).

    Kernels ~ N(0, 1/fan_in), embedding ~ N(0, 1), norm scales ~ 1 + N(0, 0.1^2).
    """
    tokens = jnp.ones((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: EncoderDecoder(config).init(jax.random.PRNGKey(0), tokens, tokens))
    rng = np.random.default_rng(seed)

    def draw(box: nn.Partitioned) -> np.ndarray:
        shape, names = box.value.shape, box.names
        if names == ("embed",):
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if names == ("vocab", "embed") or names == ("relpos_buckets", "heads"):
            return rng.standard_normal(shape).astype(np.float32)
        fan_in = math.prod(shape[:2]) if names[:2] == ("heads", "kv") else shape[0]
        return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)

    return jax.tree.map(draw, shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned))


@pytest.fixture
def t5_config() -> Callable[..., T5Config]:
    return load_t5_config


@pytest.fixture
def t5_variables() -> Callable[..., dict]:
    return random_variables


def load_gin_config(name: str, config_class: type, **overrides: object) -> object:
    """Parse gin_configs/models/{name}.gin and build config_class(**overrides); leaves gin cleared."""
    from ptmjax import gin_files  # imports seqio, which the GPU tests here need not (a GPU image may lack it)

    gin.clear_config()
    try:
        gin_files.parse_gin([str(GIN_DIR / f"{name}.gin")])  # resolves `include 'models/...'` under gin_configs/
        return config_class(**overrides)
    finally:
        gin.clear_config()


@pytest.fixture
def gin_config() -> Callable[..., object]:
    return load_gin_config


def boxed_param_table(init: Callable[[], dict]) -> list[dict]:
    """Path, shape, dtype and logical axes of every parameter of `init()` (traced with eval_shape, never run)."""
    shapes = jax.eval_shape(init)
    leaves = jax.tree_util.tree_leaves_with_path(shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    table = []
    for path, leaf in leaves:
        assert isinstance(leaf, nn.Partitioned), f"{jax.tree_util.keystr(path)} is not logically partitioned"
        table.append({
            "path": "/".join(str(k.key) for k in path), "shape": list(leaf.value.shape),
            "dtype": str(leaf.value.dtype), "axes": list(leaf.names),
        })
    return sorted(table, key=lambda row: row["path"])


def assert_matches_golden(table: list[dict], golden: pathlib.Path) -> None:
    """Assert `table` equals the JSON in `golden`; with PTMJAX_UPDATE_GOLDEN=1, (re)write `golden` first."""
    if os.environ.get("PTMJAX_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text("[\n" + ",\n".join(json.dumps(row) for row in table) + "\n]\n")
    assert golden.exists(), f"missing {golden}; create it with PTMJAX_UPDATE_GOLDEN=1"
    assert table == json.loads(golden.read_text())


def numpy_boxed_variables(init: Callable[[], dict], seed: int = 0) -> dict:
    """`init()`'s boxed variables with values drawn in numpy (traced with eval_shape: compiling `init` is slower).

    Norm scales ~ 1 + N(0, 0.3^2), every other array ~ N(0, 0.3^2).
    """
    rng = np.random.default_rng(seed)

    def draw(path: tuple, box: nn.Partitioned) -> nn.Partitioned:
        value = float(path[-1].key == "scale") + 0.3 * rng.standard_normal(box.value.shape)
        return box.replace_boxed(jnp.asarray(value, box.value.dtype))

    shapes = jax.eval_shape(init)
    return jax.tree_util.tree_map_with_path(draw, shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def count_params(init: Callable[[], dict]) -> int:
    """Number of parameters `init()` creates (traced with eval_shape, never run)."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(jax.eval_shape(init)))


def hf_meta_param_count(converter: str, config: object) -> int:
    """Parameter count of ptmjax.convert.{converter}.build_hf_model(config) on torch's 'meta' device.

    Skips the calling test when torch or transformers is missing.
    """
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    build_hf_model = importlib.import_module(f"ptmjax.convert.{converter}").build_hf_model
    with torch.device("meta"):
        hf = build_hf_model(config)
    return sum(p.numel() for p in hf.parameters())


def assert_same_state_dict(back: dict[str, np.ndarray], state: dict[str, np.ndarray]) -> None:
    """Assert `back` has exactly the keys of `state` and bit-identical arrays under them."""
    assert set(back) == set(state)
    for key, value in state.items():
        np.testing.assert_array_equal(back[key], value, err_msg=key)


def perturbed_hf_model(build: Callable[[], object]) -> object:
    """`build()` under torch seed 0, in eval mode, with LayerNorms and biases perturbed by N(0, 0.2^2)
    and the other weights scaled from std 0.02 to 0.1.

    HF initialises LayerNorms to (1, 0) and biases to 0, which would hide a wrong mapping of them, and
    its std-0.02 weights give logits so small that an absolute tolerance would hide a wrong activation.
    """
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("bias"):
                param.add_(0.2 * torch.randn_like(param))
            else:
                param.mul_(5.0)
    return model


def padded_encoder_batch(config: object) -> tuple[np.ndarray, np.ndarray]:
    """Tokens [3, max_sequence_length - 2] (rows 1 and 2 padded from 11 and 4) and two token types (halves)."""
    rng = np.random.default_rng(0)
    length = config.max_sequence_length - 2
    tokens = rng.integers(3, config.vocab_size, (3, length))
    types = np.zeros_like(tokens)
    types[:, length // 2 :] = 1 if config.type_vocab_size > 1 else 0
    tokens[1, 11:] = config.pad_token_id
    tokens[2, 4:] = config.pad_token_id
    return tokens, types


def compare_with_hf_encoder(
    module: nn.Module, params: dict, hf_model: object, config: object,
    outputs: Callable[[object, object], dict[str, tuple[jax.Array, object, bool]]],
) -> dict[str, float]:
    """Max |difference| per output of `module` and `hf_model` on `padded_encoder_batch(config)`.

    'hidden' (the final hidden states) is always compared; `outputs(ours, hf_out)` names the others as
    (ours: float32, HF tensor, per_token). Per-token outputs are compared on non-padding positions only.
    """
    torch = pytest.importorskip("torch")
    tokens, types = padded_encoder_batch(config)
    valid = tokens != config.pad_token_id
    with torch.no_grad():
        hf_out = hf_model(
            torch.tensor(tokens), attention_mask=torch.tensor(valid.astype(np.int64)),
            token_type_ids=torch.tensor(types), output_hidden_states=True,
        )

    def run(p, t, tt):
        return module.apply(p, t, tt), module.apply(p, t, tt, method=module.encode)

    ours, hidden = jax.jit(run)(params, jnp.asarray(tokens), jnp.asarray(types))
    diffs = {"hidden": _max_abs_diff(hidden, hf_out.hidden_states[-1], valid)}
    for name, (mine, reference, per_token) in outputs(ours, hf_out).items():
        assert mine.dtype == jnp.float32, name
        diffs[name] = _max_abs_diff(mine, reference, valid if per_token else None)
    return diffs


def perturbed_t5_hf_model(build: Callable[[], object], relative_bias_std: float | None = None) -> object:
    """`build()` (a transformers T5 or LongT5) under torch seed 0, in eval mode, its layer norms perturbed by
    N(0, 0.2^2) (HF initialises them to 1, which would hide a wrong mapping) and, with `relative_bias_std`, its
    relative attention biases redrawn from N(0, relative_bias_std^2)."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = build().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.add_(0.2 * torch.randn_like(param))
            if relative_bias_std is not None and "relative_attention_bias" in name:
                param.normal_(0.0, relative_bias_std)
    return model


def t5_padded_batch(
    vocab_size: int, encoder_lengths: tuple[int, ...], decoder_lengths: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random ids in [1, vocab_size): encoder rows padded (0) from `encoder_lengths`, decoder inputs starting
    with 0, and which decoder positions are valid (up to `decoder_lengths`)."""
    rng = np.random.default_rng(0)
    enc = rng.integers(1, vocab_size, (len(encoder_lengths), max(encoder_lengths)))
    enc = np.where(np.arange(enc.shape[1]) < np.array(encoder_lengths)[:, None], enc, 0)
    dec = rng.integers(1, vocab_size, (len(decoder_lengths), max(decoder_lengths)))
    dec[:, 0] = 0  # T5 decoder inputs start with id 0
    dec_valid = (np.arange(dec.shape[1]) < np.array(decoder_lengths)[:, None]).astype(np.int64)
    return enc, dec, dec_valid


def t5_logit_diff(module: nn.Module, params: dict, hf_model: object, batch: tuple[np.ndarray, ...]) -> float:
    """Max |logit difference| of `module` and `hf_model` (a transformers T5 or LongT5) at the valid decoder
    positions of `batch` (`t5_padded_batch`'s)."""
    torch = pytest.importorskip("torch")
    enc, dec, dec_valid = batch
    with torch.no_grad():
        ref = hf_model(
            input_ids=torch.tensor(enc), attention_mask=torch.tensor(enc > 0, dtype=torch.long),
            decoder_input_ids=torch.tensor(dec), decoder_attention_mask=torch.tensor(dec_valid),
        ).logits.numpy()
    ours = np.asarray(jax.jit(module.apply)(params, jnp.asarray(enc), jnp.asarray(dec)))
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    diff = float(np.abs(ours - ref)[dec_valid.astype(bool)].max())
    print(f"max |logit diff| = {diff:.2e} (max |logit| {np.abs(ref).max():.1f})")
    return diff


def mlm_outputs(pair_head: bool, hf_pair_logits: str) -> Callable[[object, object], dict]:
    """`outputs` for `compare_with_hf_encoder` on an MLM model: its MLM logits and, with the head, the
    sentence-pair logits (HF output field `hf_pair_logits`)."""

    def outputs(ours: object, hf_out: object) -> dict:
        if not pair_head:
            assert ours.sentence_pair_logits is None
            return {"MLM logits": (ours.mlm_logits, hf_out.logits, True)}
        return {
            "MLM logits": (ours.mlm_logits, hf_out.prediction_logits, True),
            "sentence-pair logits": (ours.sentence_pair_logits, getattr(hf_out, hf_pair_logits), False),
        }

    return outputs


def _max_abs_diff(ours: jax.Array, reference: object, valid: np.ndarray | None) -> float:
    ref = reference.numpy()
    assert ours.shape == ref.shape
    diff = np.abs(np.asarray(ours) - ref)
    return float((diff if valid is None else diff[valid]).max())


def attention_outputs_and_grads(kernel: str, inputs_q, inputs_kv, mask: AttentionMask, real, shape, **layer):
    """A MultiHeadAttention's (`shape`: heads, head_dim) output and the gradients of a weighted sum of it over
    the query positions where `real` [b, q] is True, by params, inputs and the mask's bias."""
    module = MultiHeadAttention(*shape, attention_kernel=kernel, **layer)
    params = module.init(jax.random.key(0), inputs_q, inputs_kv, mask)
    weights = jnp.asarray(np.random.default_rng(9).standard_normal(inputs_q.shape), jnp.float32)

    def forward(params, inputs_q, inputs_kv, bias):
        out = module.apply(params, inputs_q, inputs_kv, mask.replace(bias=bias))
        return jnp.sum(out * weights * real[:, :, None]), out

    (_, out), grads = jax.jit(jax.value_and_grad(forward, argnums=(0, 1, 2, 3), has_aux=True))(
        params, inputs_q, inputs_kv, mask.bias
    )
    return out, grads


def assert_attention_close_to_einsum(kernel: str, inputs_q, inputs_kv, mask: AttentionMask, shape, **layer):
    """`kernel`'s attention layer (`shape`: heads, head_dim) equals the einsum path's at every real query (a
    nonzero segment id, or all without segment ids): outputs, and the gradients of params, inputs and bias (up to
    1e-5 of the largest)."""
    ids = mask.query_segment_ids
    real = np.ones(inputs_q.shape[:2], bool) if ids is None else np.asarray(ids) > 0
    want, want_grads = attention_outputs_and_grads("einsum", inputs_q, inputs_kv, mask, real, shape, **layer)
    got, got_grads = attention_outputs_and_grads(kernel, inputs_q, inputs_kv, mask, real, shape, **layer)
    np.testing.assert_allclose(got[real], want[real], atol=1e-5 * float(jnp.max(jnp.abs(want[real]))))
    # One scale for all gradients: some are zero up to rounding (a key projection bias under a softmax).
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(want_grads))
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-5 * scale), got_grads, want_grads)


TINY_ATTENTION = (2, 8, 16)  # heads, head_dim and width of the attention kernels' tests


def random_normal(seed: int, shape: tuple[int, ...], scale: float = 1.0) -> jnp.ndarray:
    return jnp.asarray(scale * np.random.default_rng(seed).standard_normal(shape), jnp.float32)


def tiny_attention_models(layers: int) -> tuple[T5Config, GPT2Config]:
    """T5 and GPT-2 of TINY_ATTENTION's shapes, `layers` layers (each stack), a 40-token vocabulary, no dropout."""
    heads, head_dim, width = TINY_ATTENTION
    t5 = T5Config(vocab_size=40, d_model=width, num_heads=heads, head_dim=head_dim, d_ff=32, num_encoder_layers=layers,
                  num_decoder_layers=layers, ffn_activations=("gelu", "linear"), tie_embeddings=False,
                  dropout_rate=0.0)
    gpt2 = GPT2Config(vocab_size=40, d_model=width, num_heads=heads, num_layers=layers, d_ff=32, max_length=16,
                      dropout_rate=0.0, attention_dropout_rate=0.0)
    return t5, gpt2
