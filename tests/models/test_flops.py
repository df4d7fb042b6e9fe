"""Model FLOPs of T5, GPT-2 and MoE layers, checked against counts done by hand."""

from __future__ import annotations

import dataclasses

from ptmjax.models import GPT2Config, T5Config
from ptmjax.models.flops import (
    feed_forward_flops,
    gpt2_forward_flops,
    gpt2_training_flops,
    t5_forward_flops,
    t5_training_flops,
)

DENSE = T5Config(
    vocab_size=10, d_model=4, num_heads=2, head_dim=3, d_ff=8, num_encoder_layers=2, num_decoder_layers=3,
    ffn_activations=("relu",), tie_embeddings=True, dropout_rate=0.0,
)
GSHARD = dataclasses.replace(DENSE, num_experts=4, moe_every=2, moe_top_k=2)  # MoE: layer 1 of each stack


def test_moe_feed_forward_counts_the_router_and_top_k_experts():
    # Dense: wi 4x8 and wo 8x4, 2 FLOPs per multiply-add: 2 * (32 + 32) = 128 per token.
    assert feed_forward_flops(DENSE, 1) == 128
    # MoE: router 4x4 (2 * 16 = 32) plus 2 chosen experts of 128 each.
    assert [feed_forward_flops(GSHARD, i) for i in range(3)] == [128, 288, 128]
    # Switch (top-1) costs the dense FFN plus the router; gated GELU has two wi.
    switch = dataclasses.replace(GSHARD, moe_top_k=1, ffn_activations=("gelu", "linear"))
    assert feed_forward_flops(switch, 1) == 2 * 4 * 4 + 2 * (4 * 8 * 2 + 8 * 4)


def test_model_flops_of_a_switch_step_by_hand():
    batch, inputs, targets = 2, 5, 3
    # Only the MoE layers (encoder layer 1 over 5 tokens, decoder layer 1 over 3) differ: 288 - 128 per token.
    extra = batch * (inputs + targets) * (288 - 128)
    assert t5_forward_flops(GSHARD, batch, inputs, targets) == t5_forward_flops(DENSE, batch, inputs, targets) + extra
    # The dense model by hand: projections 2*4*6 = 48 per token and matrix (q, k, v, out).
    self_attention = lambda n: 4 * 48 * n + 2 * 2 * n * n * 6  # noqa: E731
    cross = 2 * 48 * targets + 2 * 48 * inputs + 2 * 2 * targets * inputs * 6
    encoder = 2 * (self_attention(inputs) + 128 * inputs)
    decoder = 3 * (self_attention(targets) + cross + 128 * targets)
    logits = 2 * 4 * 10 * targets
    assert t5_forward_flops(DENSE, batch, inputs, targets) == batch * (encoder + decoder + logits)
    assert t5_training_flops(GSHARD, batch, inputs, targets) == 3 * t5_forward_flops(GSHARD, batch, inputs, targets)


def test_switch_base_adds_only_routers_to_t5_base(t5_config):
    """Top-1 Switch keeps the dense FLOPs per token: 6 MoE layers per stack add a [768, 8] router each."""
    switch, dense = t5_config("switch_base_8"), t5_config("t5_1_1_base")
    router = 2 * 768 * 8
    extra = 4 * (6 * 512 + 6 * 114) * router
    assert t5_forward_flops(switch, 4, 512, 114) == t5_forward_flops(dense, 4, 512, 114) + extra


def test_model_flops_of_a_gpt2_step_by_hand():
    config = GPT2Config(vocab_size=10, d_model=4, num_heads=2, num_layers=3, d_ff=8, max_length=16)
    batch, length = 2, 5
    # Per layer: q, k, v and out projections 4 x (2*4*4) per token, scores and values 2*2*n*n*4, wi and wo 2*(32+32).
    layer = 4 * 32 * length + 2 * 2 * length * length * 4 + 128 * length
    logits = 2 * 4 * 10 * length
    assert gpt2_forward_flops(config, batch, length) == batch * (3 * layer + logits)
    assert gpt2_training_flops(config, batch, length) == 3 * gpt2_forward_flops(config, batch, length)
    moe = dataclasses.replace(config, num_experts=4, moe_every=3, moe_top_k=1)  # MoE: layer 2 only, + a 4x4 router
    router = batch * length * 2 * 4 * 4
    assert gpt2_forward_flops(moe, batch, length) == gpt2_forward_flops(config, batch, length) + router
