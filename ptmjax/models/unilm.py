"""UniLM (Dong et al., 2019): one BERT encoder and MLM head trained on cloze tasks under four self-attention masks.

Each query says which mask it is read under ('lm_mask_kind', an index into `UNILM_MASKS`, the same along a
row: ptmjax/objectives/unilm.py); `unified_lm_mask` builds the masks from the tokens and token types:

* bidirectional: every real token attends to every real token;
* left-to-right: to itself and the tokens before it; right-to-left: to itself and the tokens after it;
* sequence-to-sequence: source tokens (token type 0) attend to the source; target tokens (type 1) to the
  source and to the target up to themselves.

Interface: `__call__(input_tokens, token_type_ids=None, lm_mask_kind=None, enable_dropout=False)` ->
`MaskedLMOutput` (no sentence-pair head); without `lm_mask_kind` every query is bidirectional. The parameters
are BERT's, so a UniLM folder fine-tunes and converts as a BERT one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ptmjax.layers.attention_mask import causal_mask, pairwise_mask
from ptmjax.models.bert import Bert
from ptmjax.models.encoder import MaskedLMOutput

Array = jax.Array
UNILM_MASKS = ("bidirectional", "left_to_right", "right_to_left", "sequence_to_sequence")


def unified_lm_mask(input_tokens: Array, token_type_ids: Array, lm_mask_kind: Array, pad_token_id: int = 0) -> Array:
    """bool [b, 1, s, s]: the keys each query may attend under its UniLM mask (see the module doc).

    input_tokens, token_type_ids, lm_mask_kind [b, s] int; lm_mask_kind: each query's mask, an index into
    `UNILM_MASKS`.
    """
    length = input_tokens.shape[1]
    left = causal_mask(length)  # [1, 1, s, s]: key <= query
    right = jnp.swapaxes(left, -1, -2)  # key >= query
    source_key = (token_type_ids == 0)[:, None, None, :]
    target_query = (token_type_ids == 1)[:, None, :, None]
    by_kind = {
        "bidirectional": jnp.ones_like(left),
        "left_to_right": left,
        "right_to_left": right,
        "sequence_to_sequence": source_key | (target_query & left),
    }
    kind = lm_mask_kind[:, None, :, None]  # per query
    mask = jnp.zeros((input_tokens.shape[0], 1, length, length), bool)
    for index, name in enumerate(UNILM_MASKS):
        mask = jnp.where(kind == index, by_kind[name], mask)
    real = input_tokens != pad_token_id
    return mask & pairwise_mask(real, real)


class UniLM(Bert):
    """BERT's encoder and MLM head read under UniLM's masks (see the module docstring); config.nsp_head False."""

    def setup(self) -> None:
        super().setup()
        if self.config.pair_head:
            raise ValueError("UniLM trains cloze tasks without next-sentence prediction: set "
                             "BertConfig.nsp_head = False")

    def __call__(
        self, input_tokens: Array, token_type_ids: Array | None = None, lm_mask_kind: Array | None = None,
        enable_dropout: bool = False,
    ) -> MaskedLMOutput:
        """input_tokens, token_type_ids, lm_mask_kind [b, s] -> MLM logits [b, s, vocab]."""
        types = jnp.zeros_like(input_tokens) if token_type_ids is None else token_type_ids
        kind = jnp.zeros_like(input_tokens) if lm_mask_kind is None else lm_mask_kind
        attention = unified_lm_mask(input_tokens, types, kind, self.config.pad_token_id)
        hidden = self.encode(input_tokens, token_type_ids, enable_dropout, attention=attention)
        return MaskedLMOutput(self.mlm_logits(hidden), None)
