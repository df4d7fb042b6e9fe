"""ELMo (Peters et al., 2018): forward and backward LSTM language models over a character CNN token encoder.

Token encoder (`CharacterEncoder`, shared by both directions): each token's character ids [c] are embedded,
convolved by filters of several widths (valid padding), max-pooled over characters and passed through ReLU;
the pooled features x (all widths concatenated) go through highway layers, x <- g * x + (1 - g) * relu(W_h x
+ b_h) with g = sigmoid(W_g x + b_g), then a linear projection to `hidden_dim`.

Language models: the forward LSTM stack reads tokens left to right and its state at t predicts token t + 1;
the backward stack reads right to left (each row from its last real token: rows are right-padded) and its
state at t predicts token t - 1. Each stack has `num_layers` LSTM layers (Flax's `nn.LSTMCell` run by
`nn.RNN`: i, f, o = sigmoid, g = tanh of W_i x + W_h h + b; c' = f c + i g; h' = o tanh(c')), with a
residual connection around every layer after the first (the paper's). Both directions share the softmax
over the word vocabulary.

Layers exposed to probing (`layer_representations`): the token encoder's output and each LSTM layer's,
each as [forward; backward] (the token encoder's twice), [num_layers + 1, b, s, 2 * hidden_dim].

Sharding: the LSTM kernels are on ('embed', 'mlp') like the rest of the model, and each step's carry (c, h) is
constrained to ('activation_batch', 'activation_embed') (`BatchShardedLstmCell`). Without that constraint a
(data=2, fsdp=2, tensor=2) SGD step moved the character embedding 63% off one device's update while the loss was
equal: XLA's SPMD partitioner (jax 0.10.2, CPU) gets gradients wrong when an activation between two kernels
sharded on (fsdp, tensor) is left unconstrained with the batch sharded over (data, fsdp), at widths of 64-128 and
up (a two-matmul MLP shows it; a scan is not needed). Pinning the activation to batch sharding fixes it: here the
carry each step returns. (A `jit(grad)` that closes over the batch instead of taking it as an argument is right:
the closed-over batch is not partitioned the same way.)

Scaled down from the paper (4096-cell LSTMs projected to 512, 2048 filters): no cell clipping and no LSTM
projection; the tiny config is gin_configs/models/elmo_tiny.gin.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import flax.struct
import gin
import jax
import jax.numpy as jnp

from ptmjax.layers.common import DTYPES

Array = jax.Array
NUM_CHARACTERS = 262  # 256 bytes after 6 special ids (ptmjax/data/word_vocabulary.py)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ElmoConfig:
    """ELMo's hyper-parameters.

    vocab_size: the word vocabulary of the softmax; max_characters: character ids per token;
    num_characters, character_dim: the character table; filters: (width, number of filters) of the character
    CNN; num_highway: highway layers; hidden_dim: the token encoder's output and every LSTM's state;
    num_layers: LSTM layers per direction; dropout_rate: on the token encoder's output and each LSTM layer's.
    """

    vocab_size: int = 4000
    max_characters: int = 16
    num_characters: int = NUM_CHARACTERS
    character_dim: int = 16
    filters: tuple[tuple[int, int], ...] = ((1, 32), (2, 32), (3, 64), (4, 64))
    num_highway: int = 2
    hidden_dim: int = 128
    num_layers: int = 2
    dropout_rate: float = 0.0
    dtype: str = "float32"
    param_dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_characters", "num_characters", "character_dim", "hidden_dim", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"ElmoConfig.{name}={getattr(self, name)} must be a positive int")
        widest = max((width for width, _ in self.filters), default=0)
        if not self.filters or widest > self.max_characters:
            raise ValueError(f"ElmoConfig.filters={self.filters} must be non-empty with widths <= max_characters="
                             f"{self.max_characters}; e.g. ((1, 32), (2, 32), (3, 64))")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(f"ElmoConfig.{name}={getattr(self, name)!r}; use one of {sorted(DTYPES)}")

    @property
    def num_filters(self) -> int:
        return sum(count for _, count in self.filters)


@flax.struct.dataclass
class ElmoOutput:
    """forward_logits [b, s, vocab] (position t predicts token t + 1), backward_logits [b, s, vocab] (t - 1)."""

    forward_logits: Array
    backward_logits: Array


def _kwargs(config: ElmoConfig) -> dict:
    return {"dtype": jnp.dtype(DTYPES[config.dtype]), "param_dtype": jnp.dtype(DTYPES[config.param_dtype])}


LECUN_NORMAL = nn.initializers.lecun_normal()
RECURRENT_INIT = nn.initializers.orthogonal()  # nn.LSTMCell's default


def _kernel(axes: tuple[str | None, ...], init=LECUN_NORMAL):
    return nn.with_logical_partitioning(init, axes)


class CharacterEncoder(nn.Module):
    """Character ids [b, s, c] -> token vectors [b, s, hidden_dim] (module docstring)."""

    config: ElmoConfig

    @nn.compact
    def __call__(self, characters: Array) -> Array:
        c, kw = self.config, _kwargs(self.config)
        table = nn.Embed(c.num_characters, c.character_dim, name="character_embedding", **kw)(characters)
        pooled = []
        for width, count in c.filters:
            conv = nn.Conv(count, (width,), padding="VALID", name=f"filter_{width}",
                           kernel_init=_kernel((None, None, "mlp")), **kw)
            pooled.append(jnp.max(conv(table), axis=-2))  # [b, s, count]: the best window over the characters
        x = nn.relu(jnp.concatenate(pooled, axis=-1))
        for i in range(c.num_highway):
            dense = nn.Dense(2 * c.num_filters, name=f"highway_{i}", kernel_init=_kernel(("mlp", None)), **kw)
            transformed, gate = jnp.split(dense(x), 2, axis=-1)
            gate = nn.sigmoid(gate)
            x = gate * x + (1 - gate) * nn.relu(transformed)
        return nn.Dense(c.hidden_dim, name="projection", kernel_init=_kernel(("mlp", "embed")), **kw)(x)


class BatchShardedLstmCell(nn.LSTMCell):
    """`nn.LSTMCell` whose carry (c, h) [b, d] is constrained to ('activation_batch', 'activation_embed') on the
    way in and out of every step (see the module docstring's Sharding paragraph)."""

    def __call__(self, carry: tuple[Array, Array], inputs: Array) -> tuple[tuple[Array, Array], Array]:
        (c, h), _ = super().__call__(_batch_sharded(carry), inputs)
        c, h = _batch_sharded((c, h))
        return (c, h), h


def _batch_sharded(carry: tuple[Array, Array]) -> tuple[Array, Array]:
    return tuple(nn.with_logical_constraint(x, ("activation_batch", "activation_embed")) for x in carry)


class LstmStack(nn.Module):
    """One direction's LSTM layers over vectors [b, s, d] -> each layer's states [num_layers, b, s, d]; `reverse`
    reads every row from its last real token (`lengths`) back to its first."""

    config: ElmoConfig
    reverse: bool

    @nn.compact
    def __call__(self, x: Array, lengths: Array, enable_dropout: bool) -> Array:
        c, kw = self.config, _kwargs(self.config)
        states = []
        for i in range(c.num_layers):
            cell = BatchShardedLstmCell(c.hidden_dim, name=f"layer_{i}", kernel_init=_kernel(("embed", "mlp")),
                                        recurrent_kernel_init=_kernel(("embed", "mlp"), RECURRENT_INIT), **kw)
            h = nn.RNN(cell, reverse=self.reverse, keep_order=True)(x, seq_lengths=lengths)
            h = h + x if i > 0 else h  # the residual connection between layers
            x = nn.Dropout(c.dropout_rate, deterministic=not enable_dropout)(h)
            states.append(x)
        return jnp.stack(states)


class Elmo(nn.Module):
    """The bidirectional LM (module docstring). `__call__(input_tokens, input_chars, enable_dropout=False)`:
    input_tokens int [b, s] (0 = padding, rows right-padded), input_chars int [b, s, max_characters]."""

    config: ElmoConfig

    def setup(self) -> None:
        c = self.config
        self.token_encoder = CharacterEncoder(c)
        self.forward_lm = LstmStack(c, reverse=False)
        self.backward_lm = LstmStack(c, reverse=True)
        self.softmax = nn.Dense(c.vocab_size, kernel_init=_kernel(("embed", "vocab")), **_kwargs(c))
        self.dropout = nn.Dropout(c.dropout_rate)

    def states(self, input_tokens: Array, input_chars: Array, enable_dropout: bool = False
               ) -> tuple[Array, Array, Array]:
        """(token vectors [b, s, d], forward states [layers, b, s, d], backward states [layers, b, s, d])."""
        if input_chars.shape != (*input_tokens.shape, self.config.max_characters):
            raise ValueError(f"input_chars has shape {input_chars.shape}; with input_tokens {input_tokens.shape} it "
                             f"must be [b, s, max_characters={self.config.max_characters}]")
        tokens = self.token_encoder(input_chars)
        x = self.dropout(tokens, deterministic=not enable_dropout)
        lengths = jnp.sum(input_tokens != 0, axis=-1)
        return tokens, self.forward_lm(x, lengths, enable_dropout), self.backward_lm(x, lengths, enable_dropout)

    def __call__(self, input_tokens: Array, input_chars: Array, enable_dropout: bool = False) -> ElmoOutput:
        _, forward, backward = self.states(input_tokens, input_chars, enable_dropout)
        logits = (self.softmax(states[-1]).astype(jnp.float32) for states in (forward, backward))
        return ElmoOutput(*logits)

    def layer_representations(self, input_tokens: Array, input_chars: Array) -> Array:
        """[num_layers + 1, b, s, 2 * hidden_dim]: the token vectors twice, then each LSTM layer's [forward;
        backward] states (what ELMo's scalar mix weighs)."""
        tokens, forward, backward = self.states(input_tokens, input_chars)
        return jnp.concatenate([jnp.concatenate([tokens, tokens], -1)[None],
                                jnp.concatenate([forward, backward], -1)])
