"""Parameter counts of every canonical T5 size, from shapes only (jax.eval_shape).

Compared with the published sizes and, when torch/transformers are installed,
with a Hugging Face model of the same config built on the 'meta' device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from conftest import count_params

from ptmjax.models import EncoderDecoder, T5Config

# Hugging Face parameter counts of the released checkpoints (tied copies counted once).
PUBLISHED = {
    "t5_1_0_small": 60.5e6,
    "t5_1_0_base": 222.9e6,
    "t5_1_0_large": 737.7e6,
    "t5_1_0_3B": 2.85e9,
    "t5_1_0_11B": 11.3e9,
    "t5_1_1_small": 76.96e6,
    "t5_1_1_base": 247.6e6,
    "t5_1_1_large": 783.2e6,
    "t5_1_1_3B": 2.85e9,  # t5-v1_1-xl
    "t5_1_1_11B": 11.14e9,  # t5-v1_1-xxl
}


def t5_param_count(config: T5Config) -> int:
    tokens = jnp.ones((1, 1), jnp.int32)
    return count_params(lambda: EncoderDecoder(config).init(jax.random.PRNGKey(0), tokens, tokens))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count(name, t5_config):
    config = t5_config(name)
    ours = t5_param_count(config)
    assert abs(ours - PUBLISHED[name]) / PUBLISHED[name] < 0.01, (name, ours)
    try:
        import torch

        from ptmjax.convert.hf_t5 import build_hf_model
    except ImportError:
        return
    pytest.importorskip("transformers")
    with torch.device("meta"):
        hf = build_hf_model(config)
    assert ours == sum(p.numel() for p in hf.parameters()), name
