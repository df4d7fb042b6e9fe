"""Model FLOPs of a T5 training step, for model FLOP utilisation (MFU).

Counts the matrix multiplications of the model as written (2 FLOPs per
multiply-add), attention scores over the full length (no credit for masks),
and the backward pass as twice the forward, as in the PaLM MFU convention.
"""

from __future__ import annotations

from ptmjax.models.t5 import T5Config


def t5_forward_flops(config: T5Config, batch: int, inputs_length: int, targets_length: int) -> float:
    """FLOPs of one forward pass over a [batch, inputs] / [batch, targets] batch."""
    inner = config.num_heads * config.head_dim
    ffn = 2 * config.d_model * config.d_ff * len(config.ffn_activations)  # wi (one per activation)
    ffn += 2 * config.d_ff * config.d_model  # wo
    projections = 2 * config.d_model * inner

    def attention(queries: int, keys: int, project_kv: bool = True) -> float:
        """Per-example FLOPs of one attention layer."""
        q_and_out = 2 * projections * queries
        kv = 2 * projections * keys if project_kv else 0.0
        scores_and_values = 2 * 2 * queries * keys * inner
        return q_and_out + kv + scores_and_values

    encoder = config.num_encoder_layers * (attention(inputs_length, inputs_length) + ffn * inputs_length)
    decoder = config.num_decoder_layers * (
        attention(targets_length, targets_length) + attention(targets_length, inputs_length) + ffn * targets_length
    )
    logits = 2 * config.d_model * config.vocab_size * targets_length
    return float(batch * (encoder + decoder + logits))


def t5_training_flops(config: T5Config, batch: int, inputs_length: int, targets_length: int) -> float:
    """Forward plus backward (twice the forward) FLOPs of one training step."""
    return 3 * t5_forward_flops(config, batch, inputs_length, targets_length)
