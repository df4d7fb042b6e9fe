"""Shared helpers for the model tests: T5 configs from the gin files, cheap random weights."""

from __future__ import annotations

import math
import pathlib
from collections.abc import Callable

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ptmjax.models import EncoderDecoder, T5Config

GIN_DIR = pathlib.Path(__file__).resolve().parents[2] / "gin_configs" / "models"


def load_t5_config(name: str, **overrides: object) -> T5Config:
    """Parse gin_configs/models/{name}.gin and build T5Config(**overrides); leaves gin cleared."""
    gin.clear_config()
    try:
        gin.parse_config_file(str(GIN_DIR / f"{name}.gin"))
        return T5Config(**overrides)
    finally:
        gin.clear_config()


def random_variables(config: T5Config, seed: int = 0) -> dict:
    """Random unboxed variables with the model's tree, drawn in numpy (much faster than eager `init` on CPU).

    Kernels ~ N(0, 1/fan_in), embedding ~ N(0, 1), norm scales ~ 1 + N(0, 0.1^2).
    """
    tokens = jnp.ones((1, 1), jnp.int32)
    shapes = jax.eval_shape(lambda: EncoderDecoder(config).init(jax.random.PRNGKey(0), tokens, tokens))
    rng = np.random.default_rng(seed)

    def draw(box: nn.Partitioned) -> np.ndarray:
        shape, names = box.value.shape, box.names
        if names == ("embed",):
            return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if names == ("vocab", "embed") or names == ("relpos_buckets", "heads"):
            return rng.standard_normal(shape).astype(np.float32)
        fan_in = math.prod(shape[:2]) if names[:2] == ("heads", "kv") else shape[0]
        return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)

    return jax.tree.map(draw, shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned))


@pytest.fixture
def t5_config() -> Callable[..., T5Config]:
    return load_t5_config


@pytest.fixture
def t5_variables() -> Callable[..., dict]:
    return random_variables


def load_gin_config(name: str, config_class: type, **overrides: object) -> object:
    """Parse gin_configs/models/{name}.gin and build config_class(**overrides); leaves gin cleared."""
    gin.clear_config()
    try:
        gin.parse_config_file(str(GIN_DIR / f"{name}.gin"))
        return config_class(**overrides)
    finally:
        gin.clear_config()


@pytest.fixture
def gin_config() -> Callable[..., object]:
    return load_gin_config


def boxed_param_table(init: Callable[[], dict]) -> list[dict]:
    """Path, shape, dtype and logical axes of every parameter of `init()` (traced with eval_shape, never run)."""
    shapes = jax.eval_shape(init)
    leaves = jax.tree_util.tree_leaves_with_path(shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    table = []
    for path, leaf in leaves:
        assert isinstance(leaf, nn.Partitioned), f"{jax.tree_util.keystr(path)} is not logically partitioned"
        table.append({
            "path": "/".join(str(k.key) for k in path), "shape": list(leaf.value.shape),
            "dtype": str(leaf.value.dtype), "axes": list(leaf.names),
        })  # fmt: skip
    return sorted(table, key=lambda row: row["path"])
