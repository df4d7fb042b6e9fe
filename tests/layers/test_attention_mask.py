"""AttentionMask folds to the masks ptmjax has always built: the encoder's (bidirectional among the
non-padding tokens of a segment), the decoder's (causal within a segment) and cross-attention's (to
the encoder's non-padding tokens of the query's segment), packed or not, plus a bias; each checked
against its definition spelled out position by position."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.layers.attention_mask import (
    NEG_INF,
    cross_attention_mask,
    decoder_attention_mask,
    encoder_attention_mask,
    mask_to_bias,
)

SEGMENTS = np.array([[1, 1, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
TOKENS = np.array([[4, 1, 5, 6, 7, 1], [3, 3, 3, 1, 1, 1]])  # padding id 1 (as BART), also inside segments


def folded(mask) -> np.ndarray:
    return np.asarray(jnp.broadcast_to(mask.dense_bias(jnp.float32), (2, 1, 6, 6)))


def expected(allowed) -> np.ndarray:
    """[2, 1, 6, 6]: 0 where allowed(b, q, k), NEG_INF elsewhere."""
    rows = [[[0.0 if allowed(b, q, k) else NEG_INF for k in range(6)] for q in range(6)] for b in range(2)]
    return np.asarray(rows, np.float32)[:, None]


def same_segment(b, q, k) -> bool:
    return SEGMENTS[b, q] == SEGMENTS[b, k] and SEGMENTS[b, q] > 0


@pytest.mark.parametrize("packed", [False, True])
def test_masks_fold_to_their_definitions(packed):
    segments = jnp.asarray(SEGMENTS) if packed else None
    tokens = jnp.asarray(TOKENS)
    in_segment = same_segment if packed else lambda b, q, k: True
    real = lambda b, i: TOKENS[b, i] != 1  # noqa: E731

    encoder = encoder_attention_mask(tokens, segments, pad_token_id=1)
    assert not encoder.causal
    np.testing.assert_array_equal(folded(encoder), expected(lambda b, q, k: real(b, q) and real(b, k)
                                                            and in_segment(b, q, k)))
    decoder = decoder_attention_mask(tokens, segments)
    assert decoder.causal
    np.testing.assert_array_equal(folded(decoder), expected(lambda b, q, k: k <= q and in_segment(b, q, k)))
    cross = cross_attention_mask(tokens, tokens[::-1], segments, None if segments is None else segments[::-1], 1)
    in_segment = (lambda b, q, k: SEGMENTS[b, q] == SEGMENTS[1 - b, k] and SEGMENTS[b, q] > 0) if packed else in_segment
    np.testing.assert_array_equal(folded(cross), expected(lambda b, q, k: real(1 - b, k) and in_segment(b, q, k)))


def test_unpacked_rows_of_a_model_whose_pad_id_is_not_0_end_in_padding_at_seqio_s_trailing_zeros():
    """seqio pads with 0 whatever the model's pad id; Hugging Face BART's and RoBERTa's id 0 is <s>, real where it
    starts a row, padding where it trails. Packed rows have segment ids, which say what is padding."""
    tokens = jnp.asarray([[0, 5, 0, 6, 0, 0], [0, 0, 0, 0, 0, 0]])
    keys = lambda mask: np.asarray(mask.key_segment_ids).tolist()  # noqa: E731
    assert keys(encoder_attention_mask(tokens, pad_token_id=1)) == [[1, 1, 1, 1, 0, 0], [0] * 6]
    assert keys(cross_attention_mask(tokens, tokens, pad_token_id=1)) == [[1, 1, 1, 1, 0, 0], [0] * 6]
    assert keys(encoder_attention_mask(tokens, pad_token_id=0)) == [[0, 1, 0, 1, 0, 0], [0] * 6]
    segments = jnp.asarray([[1, 1, 1, 1, 2, 2], [1] * 6])
    assert keys(encoder_attention_mask(tokens, segments, pad_token_id=1)) == segments.tolist()


def test_a_bias_is_added_to_the_folded_mask_and_one_sided_segment_ids_are_refused():
    bias = jnp.arange(36.0).reshape(1, 1, 6, 6)
    mask = decoder_attention_mask(jnp.asarray(TOKENS), jnp.asarray(SEGMENTS), bias)
    np.testing.assert_array_equal(folded(mask), bias + expected(lambda b, q, k: k <= q and same_segment(b, q, k)))
    assert mask.for_kernel("pallas_tpu_flash", jnp.float32) is mask
    dense = mask.for_kernel("einsum", jnp.float32)
    assert dense.query_segment_ids is None and dense.key_segment_ids is None and not dense.causal
    np.testing.assert_array_equal(dense.bias, mask.dense_bias(jnp.float32))
    with pytest.raises(ValueError, match="needs both decoder_segment_ids and encoder_segment_ids"):
        cross_attention_mask(jnp.asarray(TOKENS), jnp.asarray(TOKENS), jnp.asarray(SEGMENTS))


def test_unpacked_masks_reach_the_fused_kernels_as_lengths_and_packed_ones_as_a_folded_bias():
    tokens, bias = jnp.asarray(TOKENS), jnp.ones((1, 2, 6, 6))
    unpacked = encoder_attention_mask(tokens, pad_token_id=1, bias=bias)
    assert unpacked.unpacked and not decoder_attention_mask(tokens, jnp.asarray(SEGMENTS)).unpacked
    for kernel in ("xla", "cudnn", "pallas_tpu_flash"):
        assert unpacked.for_kernel(kernel, jnp.float32) is unpacked
    dense = unpacked.for_kernel("einsum", jnp.float32)
    assert not dense.unpacked and dense.query_segment_ids is None
    np.testing.assert_array_equal(unpacked.sequence_lengths()[1], [5, 3])  # up to the last token: inner padding counts
    cross = cross_attention_mask(tokens[:, :4], tokens, pad_token_id=1)
    assert cross.unpacked and not cross.causal
    queries, keys = cross.sequence_lengths()
    np.testing.assert_array_equal(queries, [4, 4])
    np.testing.assert_array_equal(keys, [5, 3])


def test_a_float16_bias_stays_finite_with_a_logit_added_so_a_fully_masked_row_has_no_nan():
    mask = jnp.asarray([[[[True, False, False], [False, False, False]]]])
    bias = mask_to_bias(mask, jnp.float16)
    assert bias.dtype == jnp.float16 and float(bias[0, 0, 0, 1]) == -32752.0  # -1e10 is -inf in float16
    logits = bias + jnp.asarray([[[[-30000.0, -30000.0, 2.0], [-30000.0, 5.0, 0.0]]]], jnp.float16)
    assert bool(jnp.isfinite(logits).all())
    probabilities = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    np.testing.assert_allclose(probabilities[0, 0, 0], [1.0, 0.0, 0.0], atol=1e-6)
    assert bool(jnp.isfinite(probabilities).all())
    assert float(mask_to_bias(mask, jnp.float32)[0, 0, 0, 1]) == -1e10  # float32 and bfloat16 keep -1e10
