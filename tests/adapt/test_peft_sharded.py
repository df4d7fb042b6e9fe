"""One step of each parameter-efficient method on a (data=2, fsdp=2, tensor=2) mesh equals one device's: the loss
and every parameter after the step."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from peft_training_runs import SHARDED, train

SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "method",  # prefix tuning's per-layer keys and values by default; the others' parameters with -m slow
    [pytest.param(m, marks=SLOW) if m != "prefix" else m for m in ("prompt", "prefix", "houlsby", "p_tuning")],
)
def test_a_sharded_step_equals_one_devices(method):
    _, single, single_losses = train(method, steps=2)
    _, sharded, sharded_losses = train(method, SHARDED, steps=2)
    np.testing.assert_allclose(sharded_losses, single_losses, rtol=1e-5)
    jax.tree.map(lambda s, o: np.testing.assert_allclose(s, o, rtol=1e-4, atol=1e-5), sharded, single)
