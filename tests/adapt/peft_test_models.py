"""Helpers for the adapter, prompt and prefix tests: a tiny BERT and BART beside lora_test_models' T5 and GPT-2,
outputs of any of them, parameter trees with a method's leaves redrawn or dropped, and an uncached greedy
reference."""

from __future__ import annotations

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from lora_test_models import BASE_MODELS, VOCAB, batch

from ptmjax.families.model_api import model_api
from ptmjax.models import Bert, BertConfig
from ptmjax.models.bart import Bart, BartConfig
from ptmjax.tree_paths import path_name

BERT_TINY = Bert(BertConfig(
    vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=32, dropout_rate=0.0,
    attention_dropout_rate=0.0,
))
BART_TINY = Bart(BartConfig(
    vocab_size=VOCAB, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64, max_length=32,
    dropout_rate=0.0,
))
MODELS = {**BASE_MODELS, "bert": BERT_TINY, "bart": BART_TINY}
ENCODER_DECODERS = ("t5", "bart")


def outputs(model: nn.Module, params: dict, name: str, **overrides: jax.Array) -> np.ndarray:
    """T5, BART and GPT-2: logits of `batch(name)` (fields replaced by `overrides`); BERT: the encoder's hidden
    states."""
    if name == "bert":
        tokens = overrides.get("input_tokens", token_inputs("bert"))
        return np.asarray(model.apply({"params": params}, tokens, method="encode"))
    inputs = {**model_api(model).model_inputs(batch(name)), **overrides}
    return np.asarray(model.apply({"params": params}, **inputs))


def input_field(name: str) -> str:
    """The token input a prompt goes in front of."""
    return {"gpt2": "decoder_input_tokens", "bert": "input_tokens"}.get(name, "encoder_input_tokens")


def token_inputs(name: str) -> jax.Array:
    """The tokens of `input_field(name)` that `outputs` runs (BERT: random ids, no padding)."""
    return batch("gpt2")["decoder_target_tokens"] if name == "bert" else batch(name)[input_field(name)]


def redrawn(params: dict, pattern: str, seed: int = 1, scale: float = 0.3) -> dict:
    """`params` with every leaf whose path matches `pattern` replaced by N(0, scale^2) draws."""
    rng = np.random.default_rng(seed)

    def draw(path: tuple, x: jax.Array) -> jax.Array:
        return jnp.asarray(scale * rng.standard_normal(x.shape), x.dtype) if re.search(pattern, path_name(path)) else x

    return jax.tree_util.tree_map_with_path(draw, params)


def without(params: dict, pattern: str, prefix: str = "") -> dict:
    """`params` without the leaves whose path matches `pattern`: the base model's tree."""
    out = {}
    for key, value in params.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out[key] = without(value, pattern, f"{path}/")
        elif not re.search(pattern, path):
            out[key] = value
    return out


def uncached_greedy(model: nn.Module, params: dict, name: str, prompts: np.ndarray, steps: int, eos: int) -> np.ndarray:
    """Greedy tokens [b, steps] by re-running the whole model on everything so far at each step (no cache);
    0 after a row's EOS, as decoding pads."""
    rows = prompts.shape[0]
    generated = np.zeros((rows, 0), np.int32)
    for _ in range(steps):
        if name in ENCODER_DECODERS:
            decoder_inputs = np.concatenate([np.zeros((rows, 1), np.int32), generated], axis=1)
            logits = model.apply({"params": params}, prompts, decoder_inputs)
        else:
            logits = model.apply({"params": params}, np.concatenate([prompts, generated], axis=1))
        generated = np.concatenate([generated, np.asarray(jnp.argmax(logits[:, -1], -1), np.int32)[:, None]], axis=1)
    ended = np.cumsum(np.cumsum(generated == eos, axis=1), axis=1) > 1  # the positions after the first EOS
    return np.where(ended, 0, generated)
