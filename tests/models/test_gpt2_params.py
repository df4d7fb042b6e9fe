"""GPT-2 parameter trees (golden JSON) and parameter counts (shapes only, never materialised).

Regenerate the golden file after an intended change with
    PTMJAX_UPDATE_GOLDEN=1 python -m pytest tests/models/test_gpt2_params.py
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import pytest
from conftest import boxed_param_table

from ptmjax.models import GPT2, GPT2Config

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "testdata"
PUBLISHED = {"gpt2_small": 124e6, "gpt2_medium": 355e6}  # the GPT-2 paper's / HF model card sizes
KNOWN_AXES = {"vocab", "embed", "heads", "kv", "mlp", "position"}


def _init(config: GPT2Config):
    tokens = jnp.ones((1, 4), jnp.int32)
    return lambda: GPT2(config).init(jax.random.PRNGKey(0), tokens)


def test_param_tree_matches_golden(gin_config):
    table = boxed_param_table(_init(gin_config("gpt2_tiny", GPT2Config)))
    golden = TESTDATA / "gpt2_tiny_params.json"
    if os.environ.get("PTMJAX_UPDATE_GOLDEN") == "1":
        golden.write_text("[\n" + ",\n".join(json.dumps(row) for row in table) + "\n]\n")
    assert golden.exists(), f"missing {golden}; create it with PTMJAX_UPDATE_GOLDEN=1"
    assert table == json.loads(golden.read_text())
    for row in table:
        assert len(row["axes"]) == len(row["shape"]) and set(row["axes"]) <= KNOWN_AXES, row


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_hf_and_published(name, gin_config):
    config = gin_config(name, GPT2Config)
    ours = sum(math.prod(leaf.value.shape) for leaf in jax.tree.leaves(
        jax.eval_shape(_init(config)), is_leaf=lambda x: hasattr(x, "names")))  # fmt: skip
    print(f"{name}: {ours:,} parameters")
    assert abs(ours - PUBLISHED[name]) / PUBLISHED[name] < 0.01, (name, ours)
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ptmjax.convert import hf_gpt2

    with torch.device("meta"):
        hf = hf_gpt2.build_hf_model(config)
    assert ours == sum(p.numel() for p in hf.parameters()), name
