"""Transformer-XL (Dai et al., 2019) on GPT-2's decoder-only backbone: segment-level recurrence with a memory of
each layer's earlier inputs, and relative positions (ptmjax/layers/xl_relative_attention.py) instead of a
position table.

The layers are GPT-2's (pre-LN, a biased GELU MLP, tied embeddings); the attention of layer n reads the
layer's input over [memory_n; segment], where memory_n holds that layer's inputs at the `memory_length`
positions before the segment, as the previous segments left them, without gradient. A memory is a dict
{'hidden': [layers, b, memory_length, embed], 'filled': int32 [b]}: the last `filled` slots of each row
hold states, the others are masked (a fresh memory has none). Query i of a t-token segment, at position
memory_length + i of [memory; segment], attends the filled slots and the segment's keys up to its own.
`with_memory` returns the logits and the memory the next segment reads: the last memory_length inputs
of [memory; segment] per layer. Without a memory (`__call__`, `hidden_states`) a segment is read alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp

from ptmjax.layers.attention_mask import mask_to_bias
from ptmjax.layers.common import HIDDEN_AXES, LOGIT_AXES, dtype_kwargs
from ptmjax.layers.embed import EMBED_INIT_STDDEV, Embed
from ptmjax.layers.layer_stack import rematerialised
from ptmjax.layers.mlp import MlpBlock
from ptmjax.layers.norms import LayerNorm
from ptmjax.layers.xl_relative_attention import RecentKeys, RelativeMultiHeadAttention
from ptmjax.models.decoder_stack_config import DecoderStackConfig

Array = jax.Array
Memory = dict[str, Array]  # {'hidden': [layers, b, memory_length, embed], 'filled': int32 [b]}
MEMORY_AXES = (None, "activation_batch", "activation_length", "activation_embed")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TransformerXLConfig(DecoderStackConfig):
    """Hyper-parameters of a Transformer-XL decoder: GPT-2's decoder stack (DecoderStackConfig) with a memory.

    memory_length: the positions of earlier segments each layer keeps
    (the paper's M). activation as GPT2Config's ('gelu' the tanh form). dropout_rate applies to embeddings
    and residual branches, attention_dropout_rate to attention probabilities. The layers run unscanned with
    the einsum kernel and no LayerDrop: each reads its own memory.
    decode_segment_length: the segment length S of cached decoding (ptmjax/decoding/segment_memory_prefill.py):
    the prompt and the generated tokens are read in segments of S after the memory, and the cache holds
    memory_length + S - 1 keys and values per layer. 1 (the default): every token reads the memory_length
    positions before it.
    """

    memory_length: int
    attention_dropout_rate: float = 0.1
    activation: str = "gelu"
    decode_segment_length: int = dataclasses.field(default=1, kw_only=True)

    def __post_init__(self) -> None:
        self.check_decoder_stack("memory_length", "decode_segment_length")
        if self.d_model % 2:
            raise ValueError(f"TransformerXLConfig.d_model={self.d_model} must be even (sin and cos halves of R)")
        for name, plain in (("scan_layers", False), ("layerdrop", 0.0), ("attention_kernel", "einsum")):
            if getattr(self, name) != plain:
                raise ValueError(f"TransformerXLConfig.{name}={getattr(self, name)!r} is not supported (each layer "
                                 f"reads its own memory); set {name}={plain!r}")


def empty_memory(config: TransformerXLConfig, rows: int) -> Memory:
    """A memory of `rows` rows with no slot filled (float32 states)."""
    return {"hidden": jnp.zeros((config.num_layers, rows, config.memory_length, config.d_model), jnp.float32),
            "filled": jnp.zeros((rows,), jnp.int32)}


def memory_bias(filled: Array, memory_length: int, length: int, dtype: Any) -> Array:
    """The additive mask [b, 1, t, memory_length + t]: query i sees the filled memory slots (the last
    `filled` of the row) and the segment's keys up to its own."""
    keys = jnp.arange(memory_length + length)[None, None, :]
    queries = jnp.arange(length)[None, :, None] + memory_length
    allowed = (keys <= queries) & (keys >= memory_length - filled[:, None, None])
    return mask_to_bias(allowed[:, None], dtype)


class TransformerXLBlock(nn.Module):
    """LayerNorm -> relative attention over [memory; segment] -> residual; LayerNorm -> MLP -> residual."""

    config: TransformerXLConfig

    @nn.compact
    def __call__(
        self, x: Array, memory: Array, bias: Array, enable_dropout: bool = False, cache: RecentKeys | None = None
    ) -> Array:
        """x [b, t, embed], memory [b, m, embed] (its earlier inputs), bias [b, 1, t, m + t] -> [b, t, embed];
        decoding (`cache`): the attention also reads its cached keys and values first."""
        c = self.config
        drop = nn.Dropout(c.dropout_rate)
        normed = LayerNorm(c.layer_norm_epsilon, name="pre_attention_layer_norm", **dtype_kwargs(c))(
            jnp.concatenate([memory.astype(x.dtype), x], axis=1))
        h = RelativeMultiHeadAttention(c.num_heads, c.head_dim, c.attention_dropout_rate, name="attention",
                                       **dtype_kwargs(c))(normed[:, memory.shape[1]:], normed, bias, enable_dropout,
                                                            cache)
        x = x + drop(h, deterministic=not enable_dropout)
        h = LayerNorm(c.layer_norm_epsilon, name="pre_mlp_layer_norm", **dtype_kwargs(c))(x)
        h = MlpBlock(c.d_ff, (c.activation,), 0.0, use_bias=True, name="mlp", **dtype_kwargs(c))(h, enable_dropout)
        x = nn.with_logical_constraint(x + drop(h, deterministic=not enable_dropout), HIDDEN_AXES)
        self.sow("intermediates", "hidden_states", x)
        return x


class TransformerXL(nn.Module):
    """Transformer-XL language model: `__call__` gives float32 logits [b, t, vocab] of a segment read alone,
    `with_memory` the logits of a segment after `memory` and the memory after it (see the module doc).

    Inputs: decoder_input_tokens [b, t] int (rows of ptmjax/data/segment_stream_converter.py, each the
    continuation of the row before it). Dropout draws from the 'dropout' rng when `enable_dropout=True`.
    """

    config: TransformerXLConfig

    def setup(self) -> None:
        c = self.config
        self.token_embedder = Embed(
            c.vocab_size, c.d_model, embedding_init=nn.initializers.normal(EMBED_INIT_STDDEV), **dtype_kwargs(c)
        )
        self.decoder_norm = LayerNorm(c.layer_norm_epsilon, **dtype_kwargs(c))
        self.dropout = nn.Dropout(c.dropout_rate)

    @nn.compact
    def run_layers(
        self, x: Array, memory: Array, bias: Array, enable_dropout: bool = False, cache: RecentKeys | None = None
    ) -> tuple[Array, Array]:
        """The layers `layers_{n}` over embedded x [b, t, embed] after `memory` [layers, b, m, embed] (m may be 0)
        -> (the last layer's output, each layer's input stacked [layers, b, t, embed])."""
        c = self.config
        layer = TransformerXLBlock if cache is not None else rematerialised(TransformerXLBlock, c.remat_policy, 2)
        inputs = []
        for n in range(c.num_layers):
            inputs.append(x)
            x = layer(c, name=f"layers_{n}")(x, memory[n], bias, enable_dropout, cache)
        return x, jnp.stack(inputs)

    def hidden_states_and_memory(
        self, decoder_input_tokens: Array, memory: Memory | None = None, enable_dropout: bool = False
    ) -> tuple[Array, Memory]:
        """-> (final hidden states [b, t, embed] after the last LayerNorm, the memory after the segment)."""
        c, tokens = self.config, decoder_input_tokens
        rows, length = tokens.shape
        if memory is None:  # no slot: the segment alone
            hidden, filled = jnp.zeros((c.num_layers, rows, 0, c.d_model), jnp.float32), jnp.zeros((rows,), jnp.int32)
        else:
            check_memory(memory, c, rows)
            hidden, filled = jax.lax.stop_gradient(memory["hidden"]), memory["filled"]
        x = self.token_embedder(tokens)
        x = nn.with_logical_constraint(self.dropout(x, deterministic=not enable_dropout), HIDDEN_AXES)
        bias = memory_bias(filled, hidden.shape[2], length, x.dtype)
        x, inputs = self.run_layers(x, hidden, bias, enable_dropout)
        states = jnp.concatenate([hidden, inputs.astype(jnp.float32)], axis=2)
        if states.shape[2] < c.memory_length:  # fewer positions than slots: empty slots before them
            states = jnp.pad(states, ((0, 0), (0, 0), (c.memory_length - states.shape[2], 0), (0, 0)))
        new_memory = {"hidden": nn.with_logical_constraint(jax.lax.stop_gradient(states[:, :, -c.memory_length:]),
                                                           MEMORY_AXES),
                      "filled": jnp.minimum(filled + length, c.memory_length)}
        return nn.with_logical_constraint(self.decoder_norm(x), HIDDEN_AXES), new_memory

    def hidden_states(self, decoder_input_tokens: Array, enable_dropout: bool = False) -> Array:
        """-> final hidden states [b, t, embed] of a segment read alone; the layers are children `layers_{n}`."""
        return self.hidden_states_and_memory(decoder_input_tokens, None, enable_dropout)[0]

    def __call__(self, decoder_input_tokens: Array, enable_dropout: bool = False) -> Array:
        """-> logits float32 [b, t, vocab] of a segment read alone, against the (tied) token embedding."""
        return self.logits(self.hidden_states(decoder_input_tokens, enable_dropout))

    def with_memory(
        self, decoder_input_tokens: Array, memory: Memory, enable_dropout: bool = False
    ) -> tuple[Array, Memory]:
        """-> (logits float32 [b, t, vocab] of the segment after `memory`, the memory after the segment)."""
        hidden, new_memory = self.hidden_states_and_memory(decoder_input_tokens, memory, enable_dropout)
        return self.logits(hidden), new_memory

    def decode(
        self, decoder_input_tokens: Array, bias: Array, cache: RecentKeys, memory_hidden: Array | None = None
    ) -> Array:
        """A decoding call (apply with mutable=['cache']): final hidden states [b, t, embed] of the tokens read
        after each layer's cached keys and values (the first call: after `memory_hidden` [layers, b, m, embed]
        instead), keeping `cache` of them (ptmjax/decoding/segment_memory_prefill.py). bias [b, 1, t, keys]."""
        c, rows = self.config, decoder_input_tokens.shape[0]
        if memory_hidden is None:
            memory_hidden = jnp.zeros((c.num_layers, rows, 0, c.d_model), jnp.float32)
        x = nn.with_logical_constraint(self.token_embedder(decoder_input_tokens), HIDDEN_AXES)
        x, _ = self.run_layers(x, memory_hidden, bias, False, cache)
        return nn.with_logical_constraint(self.decoder_norm(x), HIDDEN_AXES)

    def logits(self, hidden_states: Array) -> Array:
        """Final hidden states [b, t, embed] -> logits float32 [b, t, vocab]."""
        logits = self.token_embedder.attend(hidden_states)
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)


def check_memory(memory: Memory, config: TransformerXLConfig, rows: int) -> None:
    """Raise unless `memory` has the shapes `empty_memory(config, rows)` gives."""
    want = (config.num_layers, rows, config.memory_length, config.d_model)
    if tuple(memory["hidden"].shape) != want or tuple(memory["filled"].shape) != (rows,):
        raise ValueError(
            f"Transformer-XL memory of shape {tuple(memory['hidden'].shape)} (filled {tuple(memory['filled'].shape)}) "
            f"does not fit a batch of {rows} rows: want {want}; give the memory as many rows as the batch "
            "(RecurrentMemory.rows = the batch size, no micro-batches)"
        )
