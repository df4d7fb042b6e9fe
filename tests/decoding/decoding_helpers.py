"""Tiny generative models with peaked random weights, and an uncached reference decoder."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ptmjax import partitioning
from ptmjax.decoding import GenerationIds
from ptmjax.decoding.sharded import jit_predict
from ptmjax.families.model_api import model_api
from ptmjax.models import GPT2, Bart, EncoderDecoder, T5Config
from ptmjax.models.bart import BartConfig
from ptmjax.models.gpt2 import GPT2Config
from ptmjax.models.longt5 import LongT5, LongT5Config

VOCAB = 48
EOS = 1
IDS = GenerationIds(eos_token_id=EOS, pad_token_id=0, decoder_start_token_id=0)
T5_V1_1 = T5Config(
    vocab_size=VOCAB, d_model=32, num_heads=4, head_dim=8, d_ff=64, num_encoder_layers=2, num_decoder_layers=2,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
T5_V1_0 = dataclasses.replace(T5_V1_1, ffn_activations=("relu",), tie_embeddings=True)
SWITCH = dataclasses.replace(T5_V1_1, num_experts=4, moe_every=2, moe_eval_capacity_factor=4.0)
BART = BartConfig(
    vocab_size=VOCAB, d_model=32, num_heads=4, num_encoder_layers=2, num_decoder_layers=2, d_ff=64, max_length=32,
    pad_token_id=0, dropout_rate=0.0,
)
MBART = dataclasses.replace(BART, pre_layer_norm=True, scale_embedding=True)
GPT = GPT2Config(
    vocab_size=VOCAB, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=32, dropout_rate=0.0,
    attention_dropout_rate=0.0,
)
GPT_MOE = dataclasses.replace(GPT, num_experts=4, moe_every=1, moe_eval_capacity_factor=4.0)
# LongT5 over the 6-token encoder inputs: blocks of 2, 3 global tokens.
LONGT5_TGLOBAL = LongT5Config(**{f.name: getattr(T5_V1_1, f.name) for f in dataclasses.fields(T5_V1_1)},
                              encoder_attention_type="transient-global", local_radius=1, global_block_size=2)
MODELS = {
    "t5_1_1": EncoderDecoder(T5_V1_1), "t5_1_0": EncoderDecoder(T5_V1_0), "switch": EncoderDecoder(SWITCH),
    "bart": Bart(BART), "mbart": Bart(MBART), "gpt2": GPT2(GPT), "gpt2_moe": GPT2(GPT_MOE),
    "longt5_tglobal": LongT5(LONGT5_TGLOBAL),
}
# Encoder inputs of different lengths, padded with 0; decoder-only prompts right-padded (segment ids 0).
ENCODER_INPUTS = np.array([[5, 6, 7, 8, 9, 1], [10, 11, 1, 0, 0, 0], [12, 13, 14, 1, 0, 0]], np.int32)
PROMPTS = np.array([[3, 4, 5, 6], [7, 8, 0, 0], [9, 0, 0, 0]], np.int32)
PROMPT_SEGMENTS = (PROMPTS > 0).astype(np.int32)


def peaked_params(module: nn.Module, scale: float = 6.0, seed: int = 0) -> dict:
    """Random parameters with embedding tables N(0, 1) and other matrices scaled up, so next-token
    distributions are peaked but vary with the context."""
    params = nn.unbox(jax.jit(model_api(module).init)(jax.random.key(seed)))  # compiled: eager ops are slow on a GPU

    def peaked(path: tuple, x: jnp.ndarray) -> jnp.ndarray:
        if jax.tree_util.keystr(path).endswith("['embedding']"):
            return x / jnp.std(x)
        return x * scale if x.ndim > 1 else x

    return jax.tree_util.tree_map_with_path(peaked, params)


def is_decoder_only(module: nn.Module) -> bool:
    return isinstance(module, GPT2)


def prompt_batch(module: nn.Module, prefix_lm: bool = False) -> dict[str, jnp.ndarray]:
    """The model's batch of three prompts of different lengths."""
    if not is_decoder_only(module):
        return {"encoder_input_tokens": jnp.asarray(ENCODER_INPUTS)}
    batch = {"decoder_input_tokens": jnp.asarray(PROMPTS), "decoder_segment_ids": jnp.asarray(PROMPT_SEGMENTS)}
    if prefix_lm:
        batch["decoder_causal_attention"] = jnp.asarray(PROMPT_SEGMENTS)
    return batch


def uncached_greedy(
    module: nn.Module, params: dict, batch: dict, length: int, ids: GenerationIds = IDS
) -> tuple[np.ndarray, np.ndarray]:
    """Argmax decoding that reruns the whole sequence for every token (no cache), scores in float64:
    -> tokens [b, length] (pad after EOS), scores [b].

    Every step runs the model on fixed-size rows (the sequence so far, then padding that causal
    attention hides), so it compiles once.
    """
    if is_decoder_only(module):
        segments = np.asarray(batch["decoder_segment_ids"])
        lengths = segments.sum(axis=1)
        sequences = np.zeros((len(lengths), segments.shape[1] + length), np.int32)
        sequences[:, : segments.shape[1]] = np.asarray(batch["decoder_input_tokens"]) * segments
        prefix = None
        if "decoder_causal_attention" in batch:
            prefix = jnp.asarray((np.arange(sequences.shape[1])[None] < lengths[:, None]).astype(np.int32))
        forward = jax.jit(lambda x: module.apply({"params": params}, x, decoder_causal_attention=prefix))
        first = lengths - 1  # where the logits of the first new token are
    else:
        encoder = jnp.asarray(batch["encoder_input_tokens"])
        sequences = np.zeros((encoder.shape[0], length + 1), np.int32)
        sequences[:, 0] = ids.decoder_start_token_id
        forward = jax.jit(lambda x: module.apply({"params": params}, encoder, x))
        first = np.zeros(encoder.shape[0], int)
    rows = np.arange(len(first))
    tokens, scores = np.full((len(first), length), ids.pad_token_id, np.int32), np.zeros(len(first))
    finished = np.zeros(len(first), bool)
    for i in range(length):
        logits = np.asarray(forward(jnp.asarray(sequences)), np.float64)[rows, first + i]  # [b, vocab]
        log_probs = logits - logits.max(axis=1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(axis=1, keepdims=True))
        token = log_probs.argmax(axis=1)
        scores += np.where(finished, 0.0, log_probs[rows, token])
        tokens[:, i] = np.where(finished, ids.pad_token_id, token)
        sequences[rows, first + i + 1] = token
        finished |= token == ids.eos_token_id
    return tokens, scores


def sharded_equals_one_device(module: nn.Module, params: dict, batch: dict, config, ids: GenerationIds = IDS):
    """Asserts that decoding `batch` (8 rows) on the (data=2, fsdp=2, tensor=2) training layout gives the tokens
    (and the scores within 1e-4) of one device; -> the one-device DecodeOutput."""
    api = model_api(module)
    single = jax.jit(api.predict, static_argnums=(2, 3))(params, batch, config, ids)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(data=2, fsdp=2, tensor=2))
    sharded = jit_predict(api.predict, api.boxed_abstract_params, mesh, partitioning.DEFAULT_RULES, config, ids)(
        params, batch)
    assert len(sharded.tokens.sharding.device_set) == 8
    np.testing.assert_array_equal(np.asarray(sharded.tokens), np.asarray(single.tokens))
    np.testing.assert_allclose(np.asarray(sharded.scores), np.asarray(single.scores), rtol=1e-4, atol=1e-4)
    return single
