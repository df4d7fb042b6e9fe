"""The output layer tied to the embedding table (`ptmjax/layers/embed.py`'s `tied_logits`): its values and both
gradients against float64 numpy, in float32 (on the CPU, where the table's gradient is computed transposed) and
in bfloat16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.layers.embed import tied_logits

TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tied_logits_and_their_gradients_equal_float64_products(dtype):
    rng = np.random.default_rng(0)
    shapes = ((2, 5, 8), (11, 8), (2, 5, 11))
    query, table, cotangent = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in shapes)
    logits, vjp = jax.vjp(tied_logits, query, table)
    d_query, d_table = vjp(cotangent)
    q, t, c = (np.asarray(x.astype(jnp.float32), np.float64) for x in (query, table, cotangent))
    assert logits.dtype == d_query.dtype == d_table.dtype == dtype
    assert d_query.shape == query.shape and d_table.shape == table.shape
    for got, want in ((logits, q @ t.T), (d_query, c @ t), (d_table, np.einsum("bte,btv->ve", q, c))):
        np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), want, rtol=TOLERANCE[dtype],
                                   atol=TOLERANCE[dtype] * np.abs(want).max())
