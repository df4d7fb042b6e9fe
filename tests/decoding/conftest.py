"""The decoding tests' fixture: jitted `ModelApi.predict` per model."""

from __future__ import annotations

import flax.linen as nn
import jax
import pytest

from ptmjax.families.model_api import model_api


@pytest.fixture(scope="module")
def jit_predict():
    """jax.jit(api.predict) with config and ids static, cached per model."""
    cache = {}

    def get(module: nn.Module):
        key = id(module)
        if key not in cache:
            cache[key] = jax.jit(model_api(module).predict, static_argnums=(2, 3))
        return cache[key]

    return get
