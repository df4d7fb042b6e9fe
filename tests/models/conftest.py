"""Shared helpers for the model tests: configs from the gin files, cheap random weights, parameter checks."""

from __future__ import annotations

import importlib
import json
import math
import os
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
    return load_gin_config(name, T5Config, **overrides)


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


def assert_matches_golden(table: list[dict], golden: pathlib.Path) -> None:
    """Assert `table` equals the JSON in `golden`; with PTMJAX_UPDATE_GOLDEN=1, (re)write `golden` first."""
    if os.environ.get("PTMJAX_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text("[\n" + ",\n".join(json.dumps(row) for row in table) + "\n]\n")
    assert golden.exists(), f"missing {golden}; create it with PTMJAX_UPDATE_GOLDEN=1"
    assert table == json.loads(golden.read_text())


def count_params(init: Callable[[], dict]) -> int:
    """Number of parameters `init()` creates (traced with eval_shape, never run)."""
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(jax.eval_shape(init)))


def hf_meta_param_count(converter: str, config: object) -> int:
    """Parameter count of ptmjax.convert.{converter}.build_hf_model(config) on torch's 'meta' device.

    Skips the calling test when torch or transformers is missing.
    """
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    build_hf_model = importlib.import_module(f"ptmjax.convert.{converter}").build_hf_model
    with torch.device("meta"):
        hf = build_hf_model(config)
    return sum(p.numel() for p in hf.parameters())


def assert_same_state_dict(back: dict[str, np.ndarray], state: dict[str, np.ndarray]) -> None:
    """Assert `back` has exactly the keys of `state` and bit-identical arrays under them."""
    assert set(back) == set(state)
    for key, value in state.items():
        np.testing.assert_array_equal(back[key], value, err_msg=key)
