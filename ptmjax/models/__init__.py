"""Model definitions: layers, attention, feed-forward and the T5 encoder-decoder."""

from ptmjax.models.t5 import EncoderDecoder, T5Config

__all__ = ["EncoderDecoder", "T5Config"]
