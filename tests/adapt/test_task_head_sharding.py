"""One SGD step of a fine-tuning head on the (data=2, fsdp=2, tensor=2) mesh equals the single-device step
(metrics and parameters); the batch's last row is padding. SGD, because Adam's first step divides each
gradient by its own size and so magnifies the rounding of gradients that are zero in exact arithmetic
(the attention key biases)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_task_head_training import train

from ptmjax.partitioning import MeshConfig


@pytest.mark.parametrize("name", ["bert_sequence", pytest.param("gpt2_sequence", marks=pytest.mark.slow)])  # same head
def test_sharded_step_equals_single_device(name):
    _, want_params, (want,) = train(name, steps=1, optimizer="sgd")
    _, got_params, (got,) = train(name, MeshConfig(data=2, fsdp=2, tensor=2), steps=1, optimizer="sgd")
    for metric in ("loss", "accuracy", "grad_norm"):
        np.testing.assert_allclose(got[metric], want[metric], rtol=2e-5, atol=1e-6, err_msg=metric)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=1e-6), got_params, want_params)
