"""MPNet (Song et al., 2020): the post-LN encoder with T5-style relative position buckets shared across layers,
and its masked and permuted pre-training over two streams.

`MPNet` is Hugging Face's MPNetForMaskedLM: embeddings of tokens and absolute positions (no token types;
RoBERTa's positions, counted from pad_token_id + 1), a relative position bias [buckets, heads] over
bidirectional T5 buckets of key - query (computed once, added in every layer), post-LN layers and the
MLM head (erf GELU). Its interface is the BERT family's (`MaskedLMEncoder`).

`MPNetPretraining` has exactly MPNet's parameters and runs them over two streams
(ptmjax/layers/two_stream.py), as ptmjax.objectives.masked_permuted_lm lays a row out:
  input_tokens [b, N]: the content stream, n tokens in a random order (the last b of them predicted), then
    the b predicted tokens' mask tokens (80% [MASK], 10% random, 10% kept);
  positions [b, N]: each slot's position in the text (0-based); a mask token has its token's;
  loss_mask [b, Q]: 1 for the first b of Q queries, one per predicted token in order.
Rows end in seqio's padding (0s); every slot before it is content, whatever pad_token_id is.
The query of the predicted token of step t starts from its mask token's embedding and attends to the
tokens before it in the order and to the mask tokens of step >= t, so it sees all n positions; the
relative bias follows the positions. Logits [b, Q, vocab] come from the query stream.
"""

from __future__ import annotations

import dataclasses

import gin
import jax
import jax.numpy as jnp

from ptmjax.layers.attention_mask import AttentionMask, encoder_attention_mask, mask_to_bias
from ptmjax.layers.common import dtype_kwargs
from ptmjax.layers.positions import check_length, sequential_positions
from ptmjax.layers.relative_position import RelativePositionBias
from ptmjax.layers.two_stream import TwoStreamBlock, masked_permutation_masks
from ptmjax.models.config import check_positive_ints
from ptmjax.models.encoder import EncoderConfig, MaskedLMEncoder

Array = jax.Array


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MPNetConfig(EncoderConfig):
    """Hyper-parameters of MPNet: `EncoderConfig`'s, with no token types by default, and the relative bias's.

    relative_attention_num_buckets: buckets of key - query, half each way (Hugging Face computes 32 whatever
      its config says); relative_attention_max_distance: where the log-spaced buckets end (128).
    Hugging Face's MPNet pads with 1 and counts positions from 2: pad_token_id=1, positions_after_padding=True.
    """

    type_vocab_size: int = 0
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_ints(self, "relative_attention_num_buckets", "relative_attention_max_distance")
        if self.attention_pattern is not None:
            raise ValueError(f"MPNetConfig.attention_pattern={self.attention_pattern!r}: MPNet's two-stream attention "
                             "takes no sparse pattern; use None.")

    @property
    def mlm_activation(self) -> str:
        """Hugging Face's MPNetLMHead applies erf GELU whatever the encoder's activation."""
        return "gelu_exact"

    @property
    def position_offset(self) -> int:
        """Row of the position table of the text's first position."""
        return self.pad_token_id + 1 if self.positions_after_padding else 0


class MPNet(MaskedLMEncoder):
    """MPNet's encoder with its MLM head (module docstring); `__call__` as `MaskedLMEncoder`'s."""

    config: MPNetConfig

    def setup(self) -> None:
        super().setup()
        c = self.config
        self.relative_position_bias = RelativePositionBias(
            c.relative_attention_num_buckets, c.relative_attention_max_distance, c.num_heads, bidirectional=True,
            **dtype_kwargs(c),
        )

    def attention_mask(self, input_tokens: Array, dtype: jnp.dtype) -> AttentionMask:
        """Real tokens attend to real tokens, plus the relative bias of their indices (as Hugging Face)."""
        c = self.config
        indices = sequential_positions(input_tokens)
        bias = self.relative_position_bias(indices, indices)  # [1, heads, s, s]
        mask = encoder_attention_mask(input_tokens, pad_token_id=c.pad_token_id, bias=bias)
        return mask.for_kernel(c.attention_kernel, dtype)


class MPNetPretraining(MPNet):
    """MPNet over two streams (module docstring): `__call__(input_tokens [b, N], positions [b, N], loss_mask
    [b, Q], enable_dropout=False)` -> float32 logits [b, Q, vocab] of the query stream."""

    def setup(self) -> None:
        super().setup()
        c = self.config
        unsupported = {
            name: value for name, value in (("num_layer_groups", c.num_layer_groups),
                                            ("remat_policy", c.remat_policy), ("scan_layers", c.scan_layers))
            if value not in (None, "none", False)
        }
        if unsupported:
            raise ValueError(
                f"MPNetPretraining does not support MPNetConfig {unsupported}; its two-stream layers are unshared, "
                "unscanned and not rematerialised: set num_layer_groups=None, remat_policy='none', scan_layers=False."
            )
        self.layers = [TwoStreamBlock(c, pre_layer_norm=False) for _ in range(c.num_layers)]

    def __call__(self, input_tokens: Array, positions: Array, loss_mask: Array, enable_dropout: bool = False) -> Array:
        return self.mlm_logits(self.two_streams(input_tokens, positions, loss_mask, enable_dropout)[1])

    def two_streams(
        self, input_tokens: Array, positions: Array, loss_mask: Array, enable_dropout: bool = False
    ) -> tuple[Array, Array]:
        """-> the final content stream [b, N, d_model] and query stream [b, Q, d_model]."""
        c = self.config
        if input_tokens.ndim != 2 or positions.shape != input_tokens.shape or len(loss_mask) != len(positions):
            raise ValueError(
                f"input_tokens {input_tokens.shape} and positions {positions.shape} must both be [batch, length] "
                f"and loss_mask {loss_mask.shape} [batch, queries]"
            )
        check_length(input_tokens.shape[1], c.max_sequence_length, "MPNetPretraining")  # positions lie below it
        valid = jnp.cumsum(input_tokens[:, ::-1] != 0, axis=1)[:, ::-1] > 0  # all but seqio's trailing 0s
        content_mask, query_mask, query_slots = masked_permutation_masks(
            valid, jnp.sum(loss_mask, axis=1, dtype=jnp.int32), loss_mask.shape[1]
        )
        positions = jnp.where(valid, positions, 0)
        content = self.embeddings(input_tokens, None, enable_dropout, position_ids=positions + c.position_offset)
        query = jnp.take_along_axis(content, query_slots[:, :, None], axis=1)  # [b, Q, embed]: the mask tokens
        query_positions = jnp.take_along_axis(positions, query_slots, axis=1)
        content_bias = mask_to_bias(content_mask, content.dtype) + self.relative_position_bias(positions, positions)
        query_bias = mask_to_bias(query_mask, content.dtype) + self.relative_position_bias(query_positions, positions)
        for layer in self.layers:
            content, query = layer(content, query, content_bias, query_bias, enable_dropout)
        return content, query
