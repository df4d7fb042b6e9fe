"""Golden parameter trees: path, shape, dtype and logical axes of every tiny-model parameter.

The golden files live in tests/testdata/{name}_params.json. After an intended
change of the tree, regenerate them with

    PTMJAX_UPDATE_GOLDEN=1 python -m pytest tests/models/test_t5_param_tree.py

and review the diff.
"""

from __future__ import annotations

import json
import os
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from ptmjax.models import EncoderDecoder, T5Config

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "testdata"


def param_table(config: T5Config) -> list[dict]:
    tokens = jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: EncoderDecoder(config).init(jax.random.PRNGKey(0), tokens, tokens))
    leaves = jax.tree_util.tree_leaves_with_path(shapes, is_leaf=lambda x: isinstance(x, nn.Partitioned))
    table = []
    for path, leaf in leaves:
        assert isinstance(leaf, nn.Partitioned), f"{jax.tree_util.keystr(path)} is not logically partitioned"
        table.append(
            {
                "path": "/".join(str(k.key) for k in path),
                "shape": list(leaf.value.shape),
                "dtype": str(leaf.value.dtype),
                "axes": list(leaf.names),
            }
        )
    return sorted(table, key=lambda row: row["path"])


@pytest.mark.parametrize("name", ["t5_1_0_tiny", "t5_1_1_tiny"])
def test_param_tree_matches_golden(name, t5_config):
    table = param_table(t5_config(name))
    golden = TESTDATA / f"{name}_params.json"
    if os.environ.get("PTMJAX_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text("[\n" + ",\n".join(json.dumps(row) for row in table) + "\n]\n")
    assert golden.exists(), f"missing {golden}; create it with PTMJAX_UPDATE_GOLDEN=1"
    assert table == json.loads(golden.read_text())


def test_every_param_has_one_logical_name_per_dim(t5_config):
    for row in param_table(t5_config("t5_1_1_tiny")):
        assert len(row["axes"]) == len(row["shape"]), row
        assert set(row["axes"]) <= {"vocab", "embed", "heads", "kv", "mlp", "relpos_buckets"}, row
