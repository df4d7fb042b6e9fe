"""One Adam step of a fine-tuning head on the (data=2, fsdp=2, tensor=2) mesh equals the single-device step,
and so do the following steps (metrics and parameters)."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_task_head_training import train

from ptmjax.partitioning import MeshConfig


@pytest.mark.parametrize("name", ["bert_sequence", "gpt2_sequence"])
def test_sharded_steps_equal_single_device(name):
    _, want_first, want = train(name)
    _, got_first, got = train(name, MeshConfig(data=2, fsdp=2, tensor=2))
    for got_step, want_step in zip(got, want, strict=True):
        for metric in ("loss", "accuracy", "grad_norm"):
            np.testing.assert_allclose(got_step[metric], want_step[metric], rtol=2e-5, atol=1e-6, err_msg=metric)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5), got_first, want_first)
