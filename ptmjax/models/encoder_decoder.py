"""The encoder-decoder interface that T5 and BART share, on seqio EncDecFeatureConverter fields."""

from __future__ import annotations

import flax.linen as nn
import jax

from ptmjax.layers.attention import CacheSlots

Array = jax.Array


class EncoderDecoderInterface(nn.Module):
    """ptmjax's encoder-decoder interface (T5, BART), on seqio EncDecFeatureConverter fields.

    A subclass defines `encode(encoder_input_tokens, encoder_segment_ids=None,
    encoder_positions=None, enable_dropout=False)` -> encoded [b, s, embed],
    `decoder_hidden_states(encoded, encoder_input_tokens, decoder_input_tokens,
    encoder_segment_ids=None, decoder_segment_ids=None, decoder_positions=None,
    enable_dropout=False, cache=None)` -> the decoder's final hidden states [b, t, embed], and
    `logits(hidden_states)` -> float32 logits [b, t, vocab]. `decode` is `logits` of
    `decoder_hidden_states`, `hidden_states` is `decoder_hidden_states(encode(...))` and `__call__`
    is `logits(hidden_states(...))`, so every such model trains through the same step (and the
    chunked loss, ptmjax/families/chunked_logits.py, reads `hidden_states` and `logits`).

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
        return self.logits(self.hidden_states(
            encoder_input_tokens, decoder_input_tokens, encoder_segment_ids, decoder_segment_ids,
            encoder_positions, decoder_positions, enable_dropout,
        ))

    def hidden_states(
        self,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        encoder_positions: Array | None = None,
        decoder_positions: Array | None = None,
        enable_dropout: bool = False,
    ) -> Array:
        """`__call__`'s fields -> the decoder's final hidden states [b, t, embed]."""
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids, encoder_positions, enable_dropout)
        return self.decoder_hidden_states(
            encoded, encoder_input_tokens, decoder_input_tokens,
            encoder_segment_ids, decoder_segment_ids, decoder_positions, enable_dropout,
        )

    def decode(
        self,
        encoded: Array | None,
        encoder_input_tokens: Array,
        decoder_input_tokens: Array,
        encoder_segment_ids: Array | None = None,
        decoder_segment_ids: Array | None = None,
        decoder_positions: Array | None = None,
        enable_dropout: bool = False,
        cache: CacheSlots | None = None,
    ) -> Array:
        """encoded [b, s, embed], encoder tokens [b, s] (for the mask), decoder tokens [b, t]
        -> logits [b, t, vocab]. Decoding: see the class docstring."""
        return self.logits(self.decoder_hidden_states(
            encoded, encoder_input_tokens, decoder_input_tokens,
            encoder_segment_ids, decoder_segment_ids, decoder_positions, enable_dropout, cache,
        ))
