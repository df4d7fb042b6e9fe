"""The encoder-decoder interface that T5 and BART share, on seqio EncDecFeatureConverter fields."""

from __future__ import annotations

import flax.linen as nn
import jax

Array = jax.Array


class EncoderDecoderInterface(nn.Module):
    """ptmjax's encoder-decoder interface (T5, BART), on seqio EncDecFeatureConverter fields.

    A subclass defines `encode(encoder_input_tokens, encoder_segment_ids=None,
    encoder_positions=None, enable_dropout=False)` -> encoded [b, s, embed] and
    `decode(encoded, encoder_input_tokens, decoder_input_tokens,
    encoder_segment_ids=None, decoder_segment_ids=None, decoder_positions=None,
    enable_dropout=False, cache=None)` -> float32 logits [b, t, vocab]; `__call__` is
    `decode(encode(...))`, so every such model trains through the same step.

    Decoding (ptmjax/decoding): `decode` with `cache` (layers.attention.CacheSlots,
    applied with mutable=['cache']) feeds decoder tokens one call at a time into a
    key/value cache; the first call with a cache creates it, the second passes
    `encoded` (its cross-attention keys are cached), later ones pass encoded=None.
    """

    def __call__(
        self,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        encoder_positions: Array | None = None,
        decoder_positions: Array | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        """Encoder and decoder fields [b, s] / [b, t] -> float32 logits [b, t, vocab]."""
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions, enable_dropout)
        return self.decode(
            encoded, encoder_input_tokens, decoder_input_tokens,
            encoder_segment_ids, decoder_segment_ids, decoder_positions, enable_dropout,
        )  # fmt: skip
