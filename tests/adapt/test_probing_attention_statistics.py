"""Attention statistics against hand-made maps (uniform, one-hot) and an explicit loop over queries, and the plots."""

from __future__ import annotations

import math

import numpy as np

from ptmjax.adapt.probing.attention_statistics import AttentionStatistics, per_query_statistics
from ptmjax.adapt.probing.plots import plot_attention_maps, plot_attention_statistics

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_uniform_and_one_hot_maps_give_the_textbook_values():
    valid = np.array([[True, True, True, True]])
    special = np.array([[False, False, False, True]])
    uniform = np.full((1, 1, 1, 4, 4), 0.25)
    one_hot = np.zeros((1, 1, 1, 4, 4))
    one_hot[..., 3] = 1.0  # every query on the last (special) token
    stats = AttentionStatistics()
    stats.add(np.concatenate([uniform, one_hot], axis=2), valid, special)  # head 0 uniform, head 1 one-hot
    means = stats.means()
    np.testing.assert_allclose(means["entropy"], [[math.log(4), 0.0]])
    np.testing.assert_allclose(means["max_weight"], [[0.25, 1.0]])
    np.testing.assert_allclose(means["to_first_token"], [[0.25, 0.0]])
    np.testing.assert_allclose(means["to_special_tokens"], [[0.25, 1.0]])


def test_means_over_valid_queries_equal_an_explicit_loop():
    rng = np.random.default_rng(0)
    layers, batch, heads, length = 2, 3, 2, 5
    lengths = [5, 3, 1]
    valid = np.arange(length)[None, :] < np.array(lengths)[:, None]
    special = np.zeros((batch, length), bool)
    special[0, 4], special[1, 2], special[1, 4] = True, True, True  # [1, 4] is padding: never special
    logits = rng.normal(size=(layers, batch, heads, length, length)) * 2
    logits = np.where(valid[None, :, None, None, :], logits, -np.inf)
    attention = np.exp(logits - logits.max(-1, keepdims=True))
    attention /= attention.sum(-1, keepdims=True)
    stats = AttentionStatistics()
    stats.add(attention[:, :2], valid[:2], special[:2])  # two batches accumulate
    stats.add(attention[:, 2:], valid[2:], special[2:])
    means = stats.means()
    expected = {name: np.zeros((layers, heads)) for name in means}
    for layer in range(layers):
        for head in range(heads):
            rows = [attention[layer, b, head, q] for b in range(batch) for q in range(lengths[b])]
            marks = [special[b] & valid[b] for b in range(batch) for q in range(lengths[b])]
            expected["entropy"][layer, head] = np.mean([-sum(p * math.log(p) for p in row if p > 0) for row in rows])
            expected["max_weight"][layer, head] = np.mean([max(row) for row in rows])
            expected["to_first_token"][layer, head] = np.mean([row[0] for row in rows])
            on_special = [row[mark].sum() for row, mark in zip(rows, marks, strict=True)]
            expected["to_special_tokens"][layer, head] = np.mean(on_special)
    for name in means:
        np.testing.assert_allclose(means[name], expected[name], rtol=1e-12, err_msg=name)
    assert stats.queries == sum(lengths)
    assert per_query_statistics(attention, special)["entropy"].shape == (layers, batch, heads, length)


def test_plots_are_pngs(tmp_path):
    rng = np.random.default_rng(0)
    stats = {name: rng.random((3, 4)) for name in ("entropy", "max_weight")}
    maps = rng.dirichlet(np.ones(6), size=(3, 4, 6))
    for path in (plot_attention_statistics(stats, str(tmp_path / "s.png")),
                 plot_attention_maps(maps, [f"t{i}" for i in range(6)], str(tmp_path / "m.png"))):
        with open(path, "rb") as f:
            assert f.read(8) == PNG_SIGNATURE
