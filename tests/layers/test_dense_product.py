"""`ptmjax/layers/dense.py`'s `dense_product`: values and both gradients against float64 numpy, for a product
whose input is the smaller operand of the kernel's gradient (an MLP's `wi`), one whose output gradient is (its
`wo`), and a contraction over two axes (attention's output projection), in float32 (on the CPU, the custom
gradient) and bfloat16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.layers.dense import dense_product

CASES = {
    "wi": ((2, 5, 4), (4, 6), (2,)),
    "wo": ((2, 5, 6), (6, 4), (2,)),
    "out projection": ((2, 5, 3, 4), (3, 4, 6), (2, 3)),
}
TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 2e-2}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_dense_product_and_its_gradients_equal_float64(case, dtype):
    inputs_shape, kernel_shape, axis = CASES[case]
    rng = np.random.default_rng(0)
    inputs, kernel = (jnp.asarray(rng.standard_normal(shape), dtype) for shape in (inputs_shape, kernel_shape))
    out, vjp = jax.vjp(lambda x, w: dense_product(x, w, axis), inputs, kernel)
    cotangent = jnp.asarray(rng.standard_normal(out.shape), dtype)
    d_inputs, d_kernel = vjp(cotangent)
    x, w, c = (np.asarray(a.astype(jnp.float32), np.float64) for a in (inputs, kernel, cotangent))
    contracted = list(range(len(axis)))
    want_out = np.tensordot(x, w, (list(axis), contracted))
    want_d_inputs = np.tensordot(c, w, (list(range(2, c.ndim)), list(range(len(axis), w.ndim))))
    want_d_kernel = np.tensordot(x, c, ([0, 1], [0, 1]))
    for got, want in ((out, want_out), (d_inputs, want_d_inputs), (d_kernel, want_d_kernel)):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), want, rtol=TOLERANCE[dtype],
                                   atol=TOLERANCE[dtype] * np.abs(want).max())
