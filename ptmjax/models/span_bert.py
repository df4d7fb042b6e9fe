"""SpanBERT: BERT without next-sentence prediction, with the span boundary objective (SBO) beside the MLM head.

Joshi et al. (2020) predict each token x_i of a masked span s..e twice: by the MLM head from its own state, and
by the SBO head (`SpanBoundaryHead`) from the states of the boundary tokens x_{s-1}, x_{e+1} and the embedding
of its relative position i - s + 1; the loss is the sum of both cross-entropies over the span tokens
(ptmjax/families/losses.py, `span_boundary_mlm_loss`). The masked-LM objective gives the boundaries with
`MaskedLMOptions(masking='span', span_boundaries=True)` (ptmjax/objectives/span_boundaries.py).

Interface: `__call__(input_tokens, span_left=None, span_right=None, span_position=None, token_type_ids=None,
enable_dropout=False)` -> `SpanBertOutput`; without the span features no position is an SBO target.
The backbone and MLM head are BERT's (`Bert`), so `encode`, `mlm_logits` and every BERT tool apply.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from ptmjax.layers.common import dtype_kwargs
from ptmjax.models.bert import Bert
from ptmjax.models.encoder_heads import SpanBoundaryHead

Array = jax.Array


@flax.struct.dataclass
class SpanBertOutput:
    """mlm_logits, span_boundary_logits: float32 [b, s, vocab]; span_boundary_weights: float32 [b, s], 1 where a
    position has span boundaries and a relative position the SBO head's table covers (1..max_span_positions)."""

    mlm_logits: Array
    span_boundary_logits: Array
    span_boundary_weights: Array


class SpanBert(Bert):
    """BERT's encoder and MLM head with SpanBERT's span boundary head (see the module docstring).

    max_span_positions: rows of the relative position table; tokens further into a span than this are left out
    of the SBO loss (SpanBERT's code: 20 pair targets per span, `--max-pair-targets`).
    """

    max_span_positions: int = 20

    def setup(self) -> None:
        super().setup()
        c = self.config
        if c.pair_head:
            raise ValueError("SpanBert trains single segments without next-sentence prediction: set "
                             "BertConfig.nsp_head = False")
        if self.max_span_positions < 1:
            raise ValueError(f"SpanBert.max_span_positions={self.max_span_positions} must be at least 1 "
                             "(SpanBERT: 20)")
        self.span_boundary_head = SpanBoundaryHead(
            c.vocab_size, c.embed_dim, c.d_model, self.max_span_positions, c.mlm_activation, c.layer_norm_epsilon,
            **dtype_kwargs(c),
        )

    def __call__(
        self, input_tokens: Array, span_left: Array | None = None, span_right: Array | None = None,
        span_position: Array | None = None, token_type_ids: Array | None = None, enable_dropout: bool = False,
    ) -> SpanBertOutput:
        """input_tokens [b, s]; span_left, span_right, span_position [b, s] int (0 where no SBO target)."""
        hidden = self.encode(input_tokens, token_type_ids, enable_dropout)
        zeros = jnp.zeros_like(input_tokens)
        left, right, position = (zeros if x is None else x for x in (span_left, span_right, span_position))
        sbo_logits = self.span_boundary_head(hidden, left, right, position, self.embeddings.attend)
        weights = ((position >= 1) & (position <= self.max_span_positions)).astype(jnp.float32)
        return SpanBertOutput(self.mlm_logits(hidden), sbo_logits, weights)
