"""Golden parameter trees: path, shape, dtype and logical axes of every tiny-model parameter.

The golden files live in tests/testdata/{name}_params.json. After an intended
change of the tree, regenerate them with

    PTMJAX_UPDATE_GOLDEN=1 python -m pytest tests/models/test_t5_param_tree.py

and review the diff.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import pytest
from conftest import assert_matches_golden, boxed_param_table

from ptmjax.models import EncoderDecoder, T5Config

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "testdata"


def param_table(config: T5Config) -> list[dict]:
    tokens = jnp.ones((1, 4), jnp.int32)
    return boxed_param_table(lambda: EncoderDecoder(config).init(jax.random.PRNGKey(0), tokens, tokens))


@pytest.mark.parametrize("name", ["t5_1_0_tiny", "t5_1_1_tiny"])
def test_param_tree_matches_golden(name, t5_config):
    table = param_table(t5_config(name))
    assert_matches_golden(table, TESTDATA / f"{name}_params.json")


def test_every_param_has_one_logical_name_per_dim(t5_config):
    for row in param_table(t5_config("t5_1_1_tiny")):
        assert len(row["axes"]) == len(row["shape"]), row
        assert set(row["axes"]) <= {"vocab", "embed", "heads", "kv", "mlp", "relpos_buckets"}, row
