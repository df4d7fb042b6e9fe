"""PoWER-BERT (Goyal et al., 2020): length-adaptive inference that drops the least attended tokens between layers.

`power_bert(model, retention)` returns a sequence classifier of the encoder family (BERT, RoBERTa, ALBERT,
ELECTRA) whose layer j keeps only l_j = retention[j] positions: between the layer's self-attention (and its
residual LayerNorm) and its feed-forward block, where the paper puts its extract layer, each position's
significance is the attention it receives, summed over heads and over the real query positions
(`significance`), and the l_j most significant stay, gathered in their positional order (`kept_positions`).
The first position ([CLS], which the head reads) is always kept; padding scores zero and goes before any
real token. The shapes shrink, so layer j's feed-forward and every later layer compute l_j positions, not
the input's s: fewer FLOPs, the point of the method. `retention` has one entry per layer applied (an ALBERT
shared layer counts once per use), non-increasing: token counts, or fractions of the input length (l_j =
ceil(fraction * s)). A count above the input's length is an error, so counts suit fixed-length inputs (the
trainer's, `ptmjax eval`'s) and fractions any length.

Training goes through the hard extraction (the paper's third step: fine-tuning with the retention fixed);
no gradient flows through the choice of positions. The model adds no parameters and keeps its class's
family record and parameter paths, so a fine-tuned classifier's checkpoint restores into it, and `ptmjax
eval`, the head evaluator and the trainer read it as the classifier it is: its `__call__` gives the head's
logits on [CLS] after the extraction (`encode_kept` the kept positions' states), while `encode` stays the
plain encoder's, every position, for what reads states per position (`ptmjax.load`'s hidden states and
embeddings, probing). Made the way ptmjax/compress/early_exit.py makes its models: a subclass of the
model's own class (one per base) that runs its layers one by one, reading each layer's probabilities
through `MultiHeadAttention.probabilities` and gathering the positions at its `attention_layer_norm`, by
interception (`extraction`). The paper's configuration search, which learns the retention, is
ptmjax/compress/retention_search.py. Scanned and rematerialised layers, LayerDrop and fused attention kernels
are refused. `token_dropping_evaluation` reports the score against the tokens kept, the FLOPs and the speed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.compress.early_exit import is_encoder_classifier
from ptmjax.layers import layer_stack
from ptmjax.layers.common import HIDDEN_AXES
from ptmjax.layers.positions import check_length
from ptmjax.models.encoder import PostLNLayer

Array = jax.Array
Retention = tuple[int, ...] | tuple[float, ...]


def power_bert(model: nn.Module, retention: Sequence[int | float]) -> nn.Module:
    """`model` (an encoder-family sequence classifier) keeping retention[j] positions after layer j's attention."""
    check_dropping_base(model)
    retention = check_retention(retention, model.config.num_layers)
    return _dropping_class(type(model))(**base_fields(model), retention=retention)


def base_fields(model: nn.Module) -> dict[str, Any]:
    """The fields of the classifier `model` is (a `power_bert` model's without its retention)."""
    names = [f.name for f in dataclasses.fields(model) if f.init and f.name not in ("parent", "name", "retention")]
    return {name: getattr(model, name) for name in names}


def plain_classifier(model: nn.Module) -> nn.Module:
    """The classifier a `power_bert` model transforms (any other model as it is)."""
    if not is_token_dropping(model):
        return model
    return type(model).__mro__[1](**base_fields(model))


def is_token_dropping(model: nn.Module) -> bool:
    """Whether `model` is a `power_bert` model."""
    return getattr(model, "retention", None) is not None and hasattr(model, "retained_counts")


def check_dropping_base(model: nn.Module) -> None:
    """Raise in one line unless `model` is an encoder-family sequence classifier with plain einsum layers."""
    if not is_encoder_classifier(model):
        raise ValueError(
            f"PoWER-BERT needs a sequence classifier of the encoder family (BERT, RoBERTa, ALBERT, ELECTRA) with "
            f"num_labels >= 2, got {type(model).__name__}; e.g. power_bert.model = @EncoderForSequenceClassification()"
        )
    if is_token_dropping(model):
        raise ValueError(f"{type(model).__name__} already drops tokens; apply power_bert to the classifier once.")
    c, config = model.config, type(model.config).__name__
    refusals = [
        (layer_stack.scanning_config(model) is not None, f"{config}.scan_layers = False"),
        (c.remat_policy != "none", f"{config}.remat_policy = 'none' (got {c.remat_policy!r})"),
        (c.layerdrop != 0, f"{config}.layerdrop = 0 (got {c.layerdrop!r})"),
        (c.attention_kernel != "einsum", f"{config}.attention_kernel = 'einsum' (got {c.attention_kernel!r})"),
    ]
    for refused, fix in refusals:
        if refused:
            raise ValueError(f"PoWER-BERT runs each layer itself and reads its attention probabilities; set {fix}.")


def check_retention(retention: Sequence[int | float], depth: int) -> Retention:
    """`retention` as a tuple, after checking it: `depth` entries, all counts >= 1 or all fractions in (0, 1],
    non-increasing."""
    values = tuple(retention) if isinstance(retention, (list, tuple)) else ()
    counts = all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values)
    fractions = all(isinstance(v, float) and 0 < v <= 1 for v in values)
    if len(values) != depth or not (counts or fractions):
        raise ValueError(
            f"power_bert.retention={retention!r} must list one entry per layer ({depth}): token counts >= 1 or "
            f"fractions of the input length in (0, 1], e.g. {[1.0] * depth}."
        )
    increases = [j for j in range(1, depth) if values[j] > values[j - 1]]
    if increases:
        j = increases[0]
        raise ValueError(
            f"power_bert.retention={list(values)} grows at layer {j + 1} ({values[j - 1]} -> {values[j]}); a dropped "
            "token cannot come back, so make it non-increasing."
        )
    return values


def retained_counts(retention: Retention, length: int) -> tuple[int, ...]:
    """The positions each layer keeps of an input `length` long (fractions rounded up)."""
    counts = tuple(v if isinstance(v, int) else math.ceil(v * length) for v in retention)
    if counts[0] > length:
        raise ValueError(
            f"power_bert.retention={list(retention)} keeps {counts[0]} tokens at layer 1 but the input is {length} "
            f"long; use counts <= {length}, or fractions of the length."
        )
    return counts


def significance(weights: Array, valid: Array) -> Array:
    """The attention each position receives: weights [b, heads, q, k] summed over heads and the real queries
    (valid bool [b, s], s = q = k), float32 [b, s], 0 at padding."""
    received = jnp.sum(weights.astype(jnp.float32) * valid[:, None, :, None], axis=(1, 2))
    return jnp.where(valid, received, 0.0)


def kept_positions(score: Array, valid: Array, count: int) -> Array:
    """int32 [b, count]: the `count` most significant positions (score [b, s]) in increasing order; the first
    always, padding (valid False) after every real token, ties to the earlier position."""
    rank = jnp.where(valid, score, -1.0).at[:, 0].set(jnp.inf)
    return jnp.sort(jax.lax.top_k(jax.lax.stop_gradient(rank), count)[1], axis=-1)


@contextlib.contextmanager
def extraction(valid: Array, extract: Callable[[Array, Array], Array]) -> Iterator[None]:
    """Within the block (one layer's call), the layer's `attention_layer_norm` output [b, s, d] is replaced by
    extract(output, the significance [b, s] of its attention's probabilities): where PoWER-BERT extracts."""
    probabilities: list[Array] = []

    def intercept(next_fun, args, kwargs, context):
        output = next_fun(*args, **kwargs)
        if context.method_name == "probabilities" and context.module.name == "attention":
            probabilities.append(output)
        elif context.method_name == "__call__" and context.module.name == "attention_layer_norm":
            (weights,) = probabilities
            output = extract(output, significance(weights, valid))
        return output

    with nn.intercept_methods(intercept):
        yield


def layer_of(model: nn.Module, index: int) -> nn.Module:
    """The layer `model` applies `index`-th (an ALBERT shared layer once per use)."""
    return model.layers[index * model.config.layer_groups // model.config.num_layers]


@functools.cache
def _dropping_class(base: type[nn.Module]) -> type[nn.Module]:
    """`base` with PoWER-BERT's extraction in every layer (one class per base, so equal models compare equal)."""

    class TokenDropping(base):
        retention: Retention | None = None

        def setup(self) -> None:
            base.setup(self)
            self.layers = [PostLNLayer(self.config) for _ in range(self.config.layer_groups)]  # layers_{g}

        def __call__(self, input_tokens: Array, token_type_ids: Array | None = None,
                     enable_dropout: bool = False) -> Array:
            """float32 logits [b, num_labels] of the head on [CLS] after the layers dropped tokens."""
            return self.classify(self.encode_kept(input_tokens, token_type_ids, enable_dropout), enable_dropout)

        def retained_counts(self, length: int) -> tuple[int, ...]:
            """The positions each layer keeps of an input `length` long."""
            return retained_counts(self.retention, length)

        def encode(self, input_tokens: Array, token_type_ids: Array | None = None,
                   enable_dropout: bool = False) -> Array:
            """The plain classifier's final hidden states [b, s, d_model], every position (probing, `ptmjax.load`)."""
            return self._encoded(input_tokens, token_type_ids, enable_dropout, None)

        def encode_kept(self, input_tokens: Array, token_type_ids: Array | None = None,
                        enable_dropout: bool = False) -> Array:
            """The kept positions' final hidden states [b, l_L, d_model], in positional order, [CLS] first."""
            length = input_tokens.shape[1]  # init's one-token inputs keep it: the parameters alone matter there
            counts = None if self.is_initializing() else self.retained_counts(length)
            return self._encoded(input_tokens, token_type_ids, enable_dropout, counts)

        def _encoded(self, input_tokens: Array, token_type_ids: Array | None, enable_dropout: bool,
                     counts: tuple[int, ...] | None) -> Array:
            """The layers applied one by one, layer j keeping counts[j] positions (None: all)."""
            c = self.config
            check_length(input_tokens.shape[1], c.max_sequence_length, type(self).__name__)
            x = self.embedded(input_tokens, token_type_ids, enable_dropout)
            tokens = input_tokens
            for index in range(c.num_layers):
                layer, mask = layer_of(self, index), self.attention_mask(tokens, x.dtype)
                if counts is None:
                    x = layer(x, mask, enable_dropout)
                    continue
                valid, kept = tokens != c.pad_token_id, []

                def extract(output: Array, score: Array, valid=valid, count=counts[index], kept=kept) -> Array:
                    kept.append(kept_positions(score, valid, count))
                    return jnp.take_along_axis(output, kept[0][..., None], axis=1)

                with extraction(valid, extract):
                    x = layer(x, mask, enable_dropout)
                tokens = jnp.take_along_axis(tokens, kept[0], axis=1)
            return nn.with_logical_constraint(x, HIDDEN_AXES)

    TokenDropping.__name__ = TokenDropping.__qualname__ = f"PowerBert{base.__name__}"
    TokenDropping.__module__ = __name__
    return TokenDropping
