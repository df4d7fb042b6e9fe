"""BERT / RoBERTa parameter trees (golden JSON) and parameter counts (shapes only, never materialised).

Regenerate the golden files after an intended change with
    PTMJAX_UPDATE_GOLDEN=1 python -m pytest tests/models/test_bert_params.py
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import pytest
from conftest import assert_matches_golden, boxed_param_table, count_params, hf_meta_param_count

from ptmjax.models import Bert, BertConfig

TESTDATA = pathlib.Path(__file__).resolve().parents[1] / "testdata"
# Published sizes, pre-training heads included. BERT-large is quoted as "340M" in the paper, a rounding
# of 335M (encoder) + heads; the HF model card's 336M is used so that the 1% check is meaningful.
PUBLISHED = {"bert_base": 110e6, "bert_large": 336e6, "roberta_base": 125e6}
KNOWN_AXES = {"vocab", "embed", "heads", "kv", "mlp", "position", "token_type", "classes"}


def _init(config: BertConfig):
    tokens = jnp.full((1, 4), 5, jnp.int32)
    return lambda: Bert(config).init(jax.random.PRNGKey(0), tokens)


@pytest.mark.parametrize("name", ["bert_tiny", "roberta_tiny"])
def test_param_tree_matches_golden(name, gin_config):
    table = boxed_param_table(_init(gin_config(name, BertConfig)))
    assert_matches_golden(table, TESTDATA / f"{name}_params.json")
    for row in table:
        assert len(row["axes"]) == len(row["shape"]) and set(row["axes"]) <= KNOWN_AXES, row


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_matches_hf_and_published(name, gin_config):
    config = gin_config(name, BertConfig)
    ours = count_params(_init(config))
    print(f"{name}: {ours:,} parameters")
    assert abs(ours - PUBLISHED[name]) / PUBLISHED[name] < 0.01, (name, ours)
    assert ours == hf_meta_param_count("hf_bert", config), name
