"""A sliding-window GPT-2 decodes with a ring-buffer cache of `window` slots (ptmjax/layers/attention.py's
CacheSlots.window): greedy decoding of more tokens than the window (from prompts longer than it) gives the tokens
of uncached full-recompute argmax decoding under the same window mask, and the cache's length axis is the window
whatever the decode length."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest
from decoding_helpers import GPT, IDS, peaked_params, prompt_batch, uncached_greedy

from ptmjax.decoding import DecodeConfig
from ptmjax.decoding.prefill import decoder_only_prefill
from ptmjax.layers.attention_patterns import DilatedWindow, SlidingWindow
from ptmjax.models import GPT2

LENGTH = 12  # generated tokens; prompts are 4 slots wide


@pytest.mark.parametrize("pattern", [SlidingWindow(3), DilatedWindow(2, 2)], ids=["sliding", "dilated"])
def test_ring_buffer_decoding_equals_uncached_argmax(pattern, jit_predict):
    module = GPT2(dataclasses.replace(GPT, attention_pattern=pattern))
    params = peaked_params(module)
    batch = prompt_batch(module)
    out = jit_predict(module)(params, batch, DecodeConfig(max_decode_length=LENGTH), IDS)
    tokens, scores = uncached_greedy(module, params, batch, LENGTH)
    np.testing.assert_array_equal(np.asarray(out.tokens[:, 0]), tokens)
    np.testing.assert_allclose(np.asarray(out.scores[:, 0]), scores, rtol=1e-4, atol=1e-4)
    dense, _ = uncached_greedy(GPT2(GPT), params, batch, LENGTH)
    assert (tokens != dense).any(), "the window made no difference"


def test_the_cache_holds_window_slots_whatever_the_decode_length():
    module = GPT2(dataclasses.replace(GPT, attention_pattern=SlidingWindow(3)))
    params = peaked_params(module)
    for max_decode_length in (8, 24):
        state = decoder_only_prefill(module, params, prompt_batch(module), max_decode_length, IDS).state
        shapes = {leaf.shape for leaf in jax.tree.leaves(state.kv)}
        assert shapes == {(3, GPT.num_heads, 3, GPT.d_model // GPT.num_heads)}, shapes
