"""GPT-2 parameter trees (golden JSON) and parameter counts (shapes only, never materialised).

Regenerate the golden file after an intended change with
    PTMJAX_UPDATE_GOLDEN=1 python -m pytest tests/models/test_gpt2_params.py
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import pytest
from conftest import assert_matches_golden, boxed_param_table, count_params, hf_meta_param_count

from ptmjax.models import GPT2, GPT2Config

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "testdata"
PUBLISHED = {"gpt2_small": 124e6, "gpt2_medium": 355e6}  # the GPT-2 paper's / HF model card sizes
KNOWN_AXES = {"vocab", "embed", "heads", "kv", "mlp", "position"}


def _init(config: GPT2Config):
    tokens = jnp.ones((1, 4), jnp.int32)
    return lambda: GPT2(config).init(jax.random.PRNGKey(0), tokens)


def test_param_tree_matches_golden(gin_config):
    table = boxed_param_table(_init(gin_config("gpt2_tiny", GPT2Config)))
    assert_matches_golden(table, TESTDATA / "gpt2_tiny_params.json")
    for row in table:
        assert len(row["axes"]) == len(row["shape"]) and set(row["axes"]) <= KNOWN_AXES, row


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_hf_and_published(name, gin_config):
    config = gin_config(name, GPT2Config)
    ours = count_params(_init(config))
    print(f"{name}: {ours:,} parameters")
    assert abs(ours - PUBLISHED[name]) / PUBLISHED[name] < 0.01, (name, ours)
    assert ours == hf_meta_param_count("hf_gpt2", config), name
