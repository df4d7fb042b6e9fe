"""Decoding with a key/value cache: greedy, beam search and sampling, jit-compiled with `lax.while_loop`.

`ModelApi.predict` is the entry point; a family's `Family.predict` is `predict`
with its prefill (prefill.py). The layers cache keys and values in the 'cache'
collection (layers/attention.py); the search algorithms (sampling.py,
beam_search.py) see only first logits, a cache and a step function, so a new
algorithm needs no model code, and a new family only a prefill.
"""

from ptmjax.decoding.blank_infilling import blank_infilling_prefill
from ptmjax.decoding.config import DecodeConfig, DecodeOutput
from ptmjax.decoding.fill_blanks import fill_blanks
from ptmjax.decoding.generation_ids import GenerationIds
from ptmjax.decoding.predict import predict
from ptmjax.decoding.prefill import decoder_only_prefill, encoder_decoder_prefill
from ptmjax.decoding.segment_memory_prefill import segment_memory_prefill

__all__ = [
    "DecodeConfig", "DecodeOutput", "GenerationIds", "blank_infilling_prefill", "decoder_only_prefill",
    "encoder_decoder_prefill", "fill_blanks", "predict", "segment_memory_prefill",
]
