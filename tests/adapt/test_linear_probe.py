"""Linear probes per layer: pooled features against a numpy masked mean, probes on a planted label, the table."""

from __future__ import annotations

import csv
import json

import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.adapt.probing.layer_features import LayerReader, padded_batch
from ptmjax.adapt.probing.linear_probe import (
    format_table,
    majority_accuracy,
    pooled_features,
    probe_layers,
    write_table,
)
from ptmjax.models import Bert, BertConfig

CONFIG = BertConfig(vocab_size=64, d_model=32, num_heads=2, num_layers=2, d_ff=64, max_length=16, nsp_head=False,
                    dropout_rate=0.0, attention_dropout_rate=0.0)


def tiny_bert_reader():
    model = Bert(CONFIG)
    return LayerReader(model, jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"])


def labelled_rows(rng, count):
    """Random ids 10..15 with one label token (3 + label) at a random place: the label is in the embeddings."""
    labels = rng.integers(0, 3, count)
    rows = []
    for label in labels:
        row = list(rng.integers(10, 16, rng.integers(5, 12)))
        row.insert(int(rng.integers(0, len(row) + 1)), 3 + int(label))
        rows.append(row)
    return rows, labels


def test_pooled_features_are_the_masked_mean_of_every_layer():
    reader = tiny_bert_reader()
    rows, _ = labelled_rows(np.random.default_rng(0), 7)
    pooled = pooled_features(reader, rows, 14, batch_size=3)  # three batches, the last one filled up
    tokens, valid = padded_batch(rows, 14, CONFIG.pad_token_id)
    hidden = reader(tokens).hidden.astype(np.float64)
    expected = np.stack([[hidden[layer, i][valid[i]].mean(0) for i in range(len(rows))] for layer in range(3)])
    assert pooled.shape == (3, 7, 32)
    np.testing.assert_allclose(pooled, expected, rtol=1e-5, atol=1e-6)


def test_probe_reads_a_label_planted_in_one_layer():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 300)
    features = rng.normal(size=(3, 300, 8))
    features[1, :, 0] += 4.0 * labels  # only layer 1 carries the label
    rows = probe_layers(features[:, :200], labels[:200], features[:, 200:], labels[200:])
    assert [row.layer for row in rows] == [0, 1, 2]
    print([f"{row.accuracy:.1f}" for row in rows])
    assert rows[1].accuracy > 95 and rows[0].accuracy < 60 and rows[2].accuracy < 60


def test_frozen_model_probe_finds_the_label_in_the_embeddings(tmp_path):
    reader = tiny_bert_reader()
    rng = np.random.default_rng(1)
    (train_rows, train_labels), (val_rows, val_labels) = labelled_rows(rng, 240), labelled_rows(rng, 90)
    train, validation = (pooled_features(reader, rows, 14, 32) for rows in (train_rows, val_rows))
    rows = probe_layers(train, train_labels, validation, val_labels)
    print(format_table(rows))
    assert len(rows) == CONFIG.num_layers + 1 and rows[0].accuracy > 95
    chance = majority_accuracy(train_labels, val_labels)
    assert chance == 100 * np.mean(val_labels == np.bincount(train_labels).argmax())
    write_table(rows, {"majority_class_accuracy": chance}, str(tmp_path / "t.json"), str(tmp_path / "t.csv"))
    table = json.loads((tmp_path / "t.json").read_text())
    assert [row["layer"] for row in table["layers"]] == [0, 1, 2] and table["majority_class_accuracy"] == chance
    with open(tmp_path / "t.csv") as f:
        assert [float(r["accuracy"]) for r in csv.DictReader(f)] == [row.accuracy for row in rows]
