"""XLNet-style permutation LM: each prediction sees exactly the tokens before it in the factorisation order."""

import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.models import GPT2Config, PermutationLM

CONFIG = GPT2Config(
    vocab_size=64, d_model=32, num_heads=4, num_layers=2, d_ff=64, max_length=16,
    dropout_rate=0.0, attention_dropout_rate=0.0,
)


def test_predictions_depend_exactly_on_the_earlier_tokens_of_the_order():
    rng = np.random.default_rng(0)
    length = 10
    tokens = rng.integers(3, CONFIG.vocab_size, (2, length)).astype(np.int32)
    tokens[1, 7:] = 0  # padding is never attended to
    rank = np.stack([rng.permutation(length) for _ in range(2)]).astype(np.int32)
    model = PermutationLM(CONFIG)
    params = model.init(jax.random.key(0), jnp.asarray(tokens), jnp.asarray(rank))
    logits = jax.jit(model.apply)
    base = np.asarray(logits(params, tokens, rank))
    for row in range(2):
        for j in range(length):
            changed = tokens.copy()
            changed[row, j] = 3 + (tokens[row, j] - 2) % (CONFIG.vocab_size - 3)
            diff = np.abs(np.asarray(logits(params, changed, rank)) - base)[row].max(axis=-1)  # [length]
            blind = rank[row] <= rank[row, j]  # the token itself and everything predicted no later
            np.testing.assert_array_equal(diff[blind], 0.0, err_msg=f"row {row}: token {j} leaks")
            sees = ~blind & (tokens[row, j] != 0)
            if sees.any():
                assert diff[sees].min() > 1e-4, f"row {row}: token {j} is not seen by later predictions"
    unpadded = np.asarray(logits(params, tokens * (np.arange(length) < 7), rank))
    np.testing.assert_array_equal(base[1, :7], unpadded[1, :7])


def test_options_the_two_stream_layers_lack_are_refused():
    import dataclasses

    import pytest

    tokens = jnp.ones((1, 4), jnp.int32)
    for change in ({"remat_policy": "full"}, {"scan_layers": True}, {"block_position_embeddings": True}):
        model = PermutationLM(dataclasses.replace(CONFIG, **change))
        with pytest.raises(ValueError, match=f"PermutationLM does not support GPT2Config {{'{next(iter(change))}'"):
            jax.eval_shape(model.init, jax.random.key(0), tokens, tokens)
