"""`ptmjax/families/token_loss.py`'s `argmax_hits` against `jnp.argmax`: random logits, ties at the maximum (the first
index wins, as argmax chooses), all-equal logits, and targets out of the vocabulary's range."""

import jax.numpy as jnp
import numpy as np

from ptmjax.families.token_loss import argmax_hits


def test_argmax_hits_equal_jnp_argmax_with_ties_and_out_of_range_targets():
    rng = np.random.default_rng(0)
    logits = rng.integers(-3, 3, (4, 50, 7)).astype(np.float32)  # many ties at the maximum
    logits[3] = 0.0  # all equal: index 0 is the argmax
    logits[2, :25] = rng.standard_normal((25, 7))  # no ties
    targets = rng.integers(0, 7, (4, 50))
    targets[0, :3] = [7, -1, 100]  # out of range: never a hit
    want = (np.argmax(logits, -1) == targets).astype(np.float32)
    got = argmax_hits(jnp.asarray(logits), jnp.asarray(targets, jnp.int32))
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(got, want)
    assert 0 < want.sum() < want.size and want[3].sum() == (targets[3] == 0).sum()
