"""Model FLOPs of a T5 (LongT5 too) or GPT-2 training step, for model FLOP utilisation (MFU).

Counts the matrix multiplications of the model as written (2 FLOPs per
multiply-add), attention scores over the full length (no credit for masks),
and the backward pass as twice the forward, as in the PaLM MFU convention.
An MoE feed-forward layer counts its router and, per token, the top-k experts
the token is sent to (Switch/GShard model FLOPs): capacity padding, dropped
tokens and the dispatch/combine einsums are implementation costs, not counted.
"""

from __future__ import annotations

import functools

from ptmjax.models.gpt2 import GPT2Config
from ptmjax.models.t5 import T5Config


def feed_forward_flops(config: T5Config | GPT2Config, layer: int) -> float:
    """Per-token FLOPs of layer `layer`'s feed-forward block (either stack).

    Dense: wi (one per T5 activation; GPT-2 has one) and wo. MoE: the
    [d_model, experts] router plus top_k times the dense count, one expert per
    chosen slot.
    """
    wi = len(config.ffn_activations) if isinstance(config, T5Config) else 1
    dense = 2 * config.d_model * config.d_ff * (wi + 1)
    if not config.is_moe_layer(layer):
        return float(dense)
    return float(2 * config.d_model * config.num_experts + config.moe_top_k * dense)


def attention_flops(config: T5Config | GPT2Config, queries: int, keys: int) -> float:
    """Per-example FLOPs of one attention layer: the q, k, v and output projections, scores and values."""
    inner = config.num_heads * config.head_dim
    projections = 2 * config.d_model * inner
    return float(2 * projections * queries + 2 * projections * keys + 2 * 2 * queries * keys * inner)


def encoder_attention_flops(config: T5Config, length: int) -> float:
    """Per-example FLOPs of one encoder self-attention layer: full, or LongT5's (ptmjax/models/longt5.py) as it
    computes them: scores over each block's 3-block window (the row padded to whole blocks) and, under
    transient-global, over the global tokens, whose keys and values are projected too."""
    if not hasattr(config, "local_radius"):
        return attention_flops(config, length, length)
    block = config.local_radius + 1
    globals_ = length // config.global_block_size if config.encoder_attention_type == "transient-global" else 0
    inner = config.num_heads * config.head_dim
    projections = 2 * config.d_model * inner
    padded = -(-length // block) * block
    return float(2 * projections * length + 2 * projections * (length + globals_)
                 + 2 * 2 * padded * (3 * block + globals_) * inner)


def t5_forward_flops(config: T5Config, batch: int, inputs_length: int, targets_length: int) -> float:
    """FLOPs of one forward pass over a [batch, inputs] / [batch, targets] batch."""
    attention = functools.partial(attention_flops, config)
    encoder = sum(
        encoder_attention_flops(config, inputs_length) + feed_forward_flops(config, i) * inputs_length
        for i in range(config.num_encoder_layers)
    )
    decoder = sum(
        attention(targets_length, targets_length) + attention(targets_length, inputs_length)
        + feed_forward_flops(config, i) * targets_length
        for i in range(config.num_decoder_layers)
    )
    logits = 2 * config.d_model * config.vocab_size * targets_length
    return float(batch * (encoder + decoder + logits))


def t5_training_flops(config: T5Config, batch: int, inputs_length: int, targets_length: int) -> float:
    """Forward plus backward (twice the forward) FLOPs of one training step."""
    return 3 * t5_forward_flops(config, batch, inputs_length, targets_length)


def gpt2_forward_flops(config: GPT2Config, batch: int, length: int) -> float:
    """FLOPs of one forward pass over a [batch, length] batch (logits against the tied embedding)."""
    layers = sum(attention_flops(config, length, length) + feed_forward_flops(config, i) * length
                 for i in range(config.num_layers))
    return float(batch * (layers + 2 * config.d_model * config.vocab_size * length))


def gpt2_training_flops(config: GPT2Config, batch: int, length: int) -> float:
    """Forward plus backward (twice the forward) FLOPs of one training step."""
    return 3 * gpt2_forward_flops(config, batch, length)
