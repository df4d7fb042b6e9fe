"""The hyper-parameters of GPT-2's decoder stack, shared by the decoders built on it (GPT-2, Transformer-XL)."""

from __future__ import annotations

import dataclasses

from ptmjax.models.config import ModelConfig, check_activation, check_heads_divide, check_positive_ints


@dataclasses.dataclass(frozen=True)
class DecoderStackConfig(ModelConfig):
    """vocab_size, d_model, num_heads, num_layers, d_ff (positional, in that order) and GPT-2's
    layer_norm_epsilon; head_dim = d_model // num_heads; one stack of num_layers layers.

    A subclass adds its positional fields, then `attention_dropout_rate` and `activation` (fields with
    defaults come after the positional ones), and calls `check_decoder_stack` from `__post_init__`.
    """

    vocab_size: int
    d_model: int
    num_heads: int
    num_layers: int
    d_ff: int
    layer_norm_epsilon: float = dataclasses.field(default=1e-5, kw_only=True)

    def check_decoder_stack(self, *other_positive_ints: str) -> None:
        """Raise unless the sizes (and `other_positive_ints`) are positive ints, num_heads divides d_model, the
        activation is known and the family fields (attention_dropout_rate among the rates) are valid."""
        check_positive_ints(self, "vocab_size", "d_model", "num_heads", "num_layers", "d_ff", *other_positive_ints)
        check_heads_divide(self)
        check_activation(self)
        self.check_model_config("attention_dropout_rate")

    def layer_stacks(self) -> dict[tuple[str, ...], int]:
        return {(): self.num_layers}

    def stack_depth_fields(self) -> dict[tuple[str, ...], str]:
        return {(): "num_layers"}

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads
