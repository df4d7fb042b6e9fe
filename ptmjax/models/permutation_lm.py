"""XLNet-style permutation language model: two-stream attention over a random factorisation order.

The backbone is GPT-2's (pre-LN blocks, learned positions, tied embeddings;
`GPT2Config`); its layers are pre-LN `TwoStreamBlock`s (ptmjax/layers/two_stream.py).
A factorisation order is given per row as `permutation_rank` [b, s]
(rank[i] = the step at which token i is predicted). Two streams run
through the same layers, with the same parameters:
- the content stream h starts from token + position embeddings; position i
  attends to the tokens of rank <= rank[i] (itself included);
- the query stream g starts from a learned query vector + the position
  embedding, so it knows where it predicts but not what is there; position i
  attends to the content of the tokens of rank < rank[i].
Logits come from the query stream: position i is predicted from exactly the
tokens before it in the order (the first of the order, with nothing before it,
gets no attention update). Padding (token 0) is never attended to.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from ptmjax.layers.attention_mask import mask_to_bias
from ptmjax.layers.common import dtype_kwargs
from ptmjax.layers.embed import EMBED_INIT_STDDEV, Embed
from ptmjax.layers.norms import LayerNorm
from ptmjax.layers.positions import check_length, position_embedder, sequential_positions
from ptmjax.layers.two_stream import TwoStreamBlock, two_stream_masks
from ptmjax.models.gpt2 import LOGIT_AXES, GPT2Config

Array = jax.Array


class PermutationLM(nn.Module):
    """XLNet-style permuted LM (see the module docstring).

    `__call__(input_tokens [b, s] int, permutation_rank [b, s] int, enable_dropout=False)`
    -> float32 logits [b, s, vocab] from the query stream.
    """

    config: GPT2Config

    def setup(self) -> None:
        c = self.config
        unsupported = {
            name: value for name, value in
            (("num_experts", c.num_experts), ("remat_policy", c.remat_policy), ("scan_layers", c.scan_layers),
             ("block_position_embeddings", c.block_position_embeddings))
            if value not in (0, "none", False)
        }
        if unsupported:
            raise ValueError(
                f"PermutationLM does not support GPT2Config {unsupported}; its two-stream layers are dense, "
                "unscanned and not rematerialised, with one position table: set num_experts=0, "
                "remat_policy='none', scan_layers=False, block_position_embeddings=False."
            )
        self.token_embedder = Embed(
            c.vocab_size, c.d_model, embedding_init=nn.initializers.normal(EMBED_INIT_STDDEV), **dtype_kwargs(c)
        )
        self.position_embedder = position_embedder(c.max_length, c.d_model, EMBED_INIT_STDDEV, **dtype_kwargs(c))
        self.query_embedding = self.param(
            "query_embedding", nn.with_logical_partitioning(nn.initializers.normal(EMBED_INIT_STDDEV), ("embed",)),
            (c.d_model,), dtype_kwargs(c)["param_dtype"],
        )
        self.layers = [TwoStreamBlock(c, pre_layer_norm=True) for _ in range(c.num_layers)]
        self.decoder_norm = LayerNorm(c.layer_norm_epsilon, **dtype_kwargs(c))
        self.dropout = nn.Dropout(c.dropout_rate)

    def __call__(self, input_tokens: Array, permutation_rank: Array, enable_dropout: bool = False) -> Array:
        if input_tokens.ndim != 2 or permutation_rank.shape != input_tokens.shape:
            raise ValueError(
                f"input_tokens {input_tokens.shape} and permutation_rank {permutation_rank.shape} must both be "
                "[batch, length]"
            )
        check_length(input_tokens.shape[1], self.config.max_length, "PermutationLM")
        positions = self.position_embedder(sequential_positions(input_tokens))  # [1, s, embed]
        content = self.dropout(self.token_embedder(input_tokens) + positions, deterministic=not enable_dropout)
        query = jnp.broadcast_to(jnp.asarray(self.query_embedding, content.dtype) + positions, content.shape)
        content_mask, query_mask = two_stream_masks(permutation_rank, input_tokens != 0)
        content_bias, query_bias = mask_to_bias(content_mask, content.dtype), mask_to_bias(query_mask, content.dtype)
        for layer in self.layers:
            content, query = layer(content, query, content_bias, query_bias, enable_dropout)
        logits = self.token_embedder.attend(self.decoder_norm(query))
        return nn.with_logical_constraint(logits.astype(jnp.float32), LOGIT_AXES)
