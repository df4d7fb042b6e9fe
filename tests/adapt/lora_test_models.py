"""Tiny T5 and GPT-2 models, their batches, and LoRA parameters with a non-zero B, for the LoRA tests."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.adapt.lora import LORA_PARAMS
from ptmjax.families.model_api import model_api
from ptmjax.models import GPT2, EncoderDecoder, T5Config
from ptmjax.models.gpt2 import GPT2Config
from ptmjax.tree_paths import path_name

VOCAB = 64
T5_TINY = T5Config(
    vocab_size=VOCAB, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
)
GPT2_TINY = GPT2Config(
    vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=32, dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
BASE_MODELS = {"t5": EncoderDecoder(T5_TINY), "gpt2": GPT2(GPT2_TINY)}


def batch(name: str, rows: int = 2, length: int = 6, seed: int = 0) -> dict[str, jnp.ndarray]:
    """Random token rows with the model's family fields (T5's for BART too), loss weights all 1."""
    rng = np.random.default_rng(seed)
    tokens = lambda: jnp.asarray(rng.integers(2, VOCAB, (rows, length)), jnp.int32)  # noqa: E731
    if name in ("t5", "bart"):
        targets = tokens()
        return {
            "encoder_input_tokens": tokens(), "decoder_input_tokens": jnp.pad(targets[:, :-1], ((0, 0), (1, 0))),
            "decoder_target_tokens": targets, "decoder_loss_weights": jnp.ones_like(targets),
        }
    targets = tokens()
    return {
        "decoder_input_tokens": jnp.pad(targets[:, :-1], ((0, 0), (1, 0))), "decoder_target_tokens": targets,
        "decoder_loss_weights": jnp.ones_like(targets),
    }


def with_random_lora(params: dict, seed: int = 1, scale: float = 0.3) -> dict:
    """`params` with every LoRA leaf (A and B) replaced by N(0, scale^2) draws, so the updates are non-zero."""
    rng = np.random.default_rng(seed)

    def draw(path: tuple, x: jnp.ndarray) -> jnp.ndarray:
        if re.search(LORA_PARAMS, path_name(path)):
            return jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype)
        return x

    return jax.tree_util.tree_map_with_path(draw, params)


def init_params(model: nn.Module, seed: int = 0) -> dict:
    """The model's unboxed parameters from `ModelApi.init`."""
    return nn.unbox(model_api(model).init(jax.random.key(seed)))


def without_lora(params: dict) -> dict:
    """`params` with the LoRA leaves dropped: the base model's tree."""
    if not isinstance(params, dict):
        return params
    return {k: without_lora(v) for k, v in params.items() if k not in ("lora_a", "lora_b")}
