"""PoWER-BERT's configuration search (ptmjax/compress/retention_search.py): at its initial ones the plain
classifier exactly; with any soft retention, a float64 NumPy encoder that scales each layer's ranked positions;
the ranking against a hand-made example; the objective's penalty and its gradient against their formula; the
retention read off the masses; (data, fsdp, tensor) against one device; one-line refusals; and, slow, the three
steps from gin: search, read the retention, fine-tune `power_bert` from the search's folder."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from compress.test_early_exit import CONFIGS, check_sharded_steps_equal_one_device, numpy_head, tokens
from compress.test_power_bert import LABELS, LENGTH, classifier, init, numpy_encoder
from flax import traverse_util

from ptmjax.compress.retention_search import (
    SOFT_RETENTION,
    RetentionSearch,
    retention_of,
    retention_search,
    soft_scales,
)
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig


def batch_of(ids):
    return {"input_tokens": ids, "label": np.arange(len(ids)) % LABELS, "example_weight": np.ones(len(ids), np.float32)}


@pytest.mark.parametrize("name", ["bert", "albert"])
def test_the_fresh_search_is_the_plain_classifier_and_any_soft_retention_a_float64_encoder(name):
    config, base = CONFIGS[name], classifier(name)
    model = retention_search(base)
    params = init(model, seed=1)
    assert params[SOFT_RETENTION].shape == (3, config.max_sequence_length)
    np.testing.assert_array_equal(params[SOFT_RETENTION], 0.0)  # r = clip(1 + rate * w) = 1
    ids = tokens(config.pad_token_id, seed=3)
    plain = {k: v for k, v in params.items() if k != SOFT_RETENTION}
    np.testing.assert_array_equal(model.apply({"params": params}, ids), base.apply({"params": plain}, ids))

    soft = np.random.default_rng(0).uniform(-0.2, 1.2, params[SOFT_RETENTION].shape).astype(np.float32)
    params = {**params, SOFT_RETENTION: jnp.asarray((soft - 1) / model.rate)}
    weights = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    x64 = np.asarray(model.apply({"params": params}, ids, method="embedded"), np.float64)
    expected, _ = numpy_encoder(config, weights, x64, ids != config.pad_token_id, [LENGTH] * 3,
                                soft=[soft[j, :LENGTH].astype(np.float64) for j in range(3)])
    head = {k: v for k, v in traverse_util.flatten_dict(weights, sep="/").items()
            if not k.startswith(("layers_", "embedding", SOFT_RETENTION))}
    np.testing.assert_allclose(model.apply({"params": params}, ids), numpy_head(config, head, expected), atol=5e-5)


def test_soft_scales_rank_cls_first_padding_last_ties_to_the_earlier():
    score = jnp.asarray([[0.1, 3.0, 2.0, 0.0, 0.0], [0.0, 1.0, 1.0, 1.0, 0.5]])
    valid = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    weights = jnp.asarray([1.0, 0.8, 0.6, 0.4, 0.0])  # r by rank
    expected = [[1.0, 0.8, 0.6, 0.4, 0.0],  # ranks 0 ([CLS]), 1, 2, then the padding in order
                [1.0, 0.8, 0.6, 0.4, 0.0]]  # the tied 1.0s in order, then 0.5
    np.testing.assert_allclose(np.asarray(soft_scales(score, valid, weights)), expected)


def test_the_objective_adds_the_layer_weighted_mass_and_its_gradient():
    model = retention_search(classifier())
    params = init(model, seed=2)
    soft = np.full(params[SOFT_RETENTION].shape, 0.5, np.float32)
    soft[1, 3] = 1.5  # clipped: counts 1, no gradient
    params = {**params, SOFT_RETENTION: jnp.asarray((soft - 1) / model.rate)}
    batch, api, penalty = batch_of(tokens(seed=5)), model_api(model), 1e-2
    objective = RetentionSearch(penalty)
    token_loss, batch_loss, stats, new_extra = objective(api, params, batch, LossConfig(), None, {})
    plain = api.loss(params, batch, LossConfig())
    masses = [0.5 * LENGTH, 0.5 * (LENGTH - 1) + 1.0, 0.5 * LENGTH]  # only the input's 10 positions count
    np.testing.assert_allclose(float(token_loss), float(plain[0]), rtol=1e-6)
    np.testing.assert_allclose(float(batch_loss) - float(plain[1]), penalty * (masses[0] + 2 * masses[1]
                                                                               + 3 * masses[2]), rtol=1e-5)
    np.testing.assert_allclose(float(stats.metrics()["retention_mass"]), sum(masses), rtol=1e-6)
    assert new_extra == {}
    grad = jax.grad(lambda p: objective(api, p, batch, LossConfig(), None, {})[1])(params)[SOFT_RETENTION]
    task = jax.grad(lambda p: api.loss(p, batch, LossConfig())[1])(params)[SOFT_RETENTION]
    expected = np.asarray(task) + model.rate * penalty * np.arange(1, 4)[:, None] * (np.arange(soft.shape[1]) < LENGTH)
    expected[1, 3] = task[1, 3]
    np.testing.assert_allclose(np.asarray(grad), expected, atol=1e-7)


def test_the_retention_is_the_rounded_up_masses_made_non_increasing():
    r = np.zeros((3, 16), np.float32)
    r[0, :7], r[0, 7] = 1.0, 0.25  # mass 7.25 -> 8
    r[1, :9] = 1.0  # mass 9 -> 9, but layer 1 kept 8
    r[2, 0] = 0.125  # mass 0.125 -> at least 1
    rate = 4.0
    assert retention_of((r - 1) / rate, rate, 10) == (8, 8, 1)
    assert retention_of(np.zeros((3, 16), np.float32), rate, 10) == (10, 10, 10)  # only the input's positions


def test_sharded_search_steps_equal_one_device():
    check_sharded_steps_equal_one_device(retention_search(classifier("roberta")), RetentionSearch(1e-2))


@pytest.mark.parametrize("make, message", [
    (lambda: RetentionSearch(-1.0), r"RetentionSearch.penalty=-1.0 must be a number >= 0"),
    (lambda: retention_search(classifier(), rate=0), r"retention_search.rate=0 must be a number > 0"),
    (lambda: retention_search(retention_search(classifier())), r"already searches its retention; apply "
                                                                r"retention_search once"),
    (lambda: RetentionSearch()(model_api(classifier()), init(classifier()), batch_of(tokens()), LossConfig(), None,
                               {}), r"RetentionSearch trains the soft retention of a searching model, not "
                                    r"EncoderForSequenceClassification; set train.model = @retention_search\(\)"),
])
def test_bad_values_are_refused_in_one_line(make, message):
    with pytest.raises(ValueError, match=message) as error:
        make()
    assert "\n" not in str(error.value)


@pytest.mark.slow  # three gin training runs
def test_search_then_read_the_retention_then_fine_tune_power_bert_from_gin(tmp_path):
    """runs/power_bert_search_demo.gin from a fresh BERT with a penalty that removes positions in a few steps;
    `searched_retention` of its folder, below the input length and non-increasing, then runs/power_bert_demo.gin
    at that retention from the search's folder (its soft retention left out)."""
    from ptmjax import cli
    from ptmjax.compress.token_dropping_evaluation import searched_retention

    common = ["train.batch_size = 8", "train.task_feature_lengths = {'inputs': 32}", "train.eval_every = 4",
              "train.eval_batches = 1", "train.inference_eval_tasks = []", "train.best_checkpoint_metric = None",
              "train.num_steps = 4", "train.show_progress = False"]
    search = str(tmp_path / "search")
    args = ["train", "--gin_file", "runs/power_bert_search_demo.gin", "--model_dir", search, "--gin_bindings",
            "train.init_checkpoint = None", "--gin_bindings", "RetentionSearch.penalty = 10.0", "--gin_bindings",
            "retention_search.rate = 200.0", "--gin_bindings", "slanted_triangular.total_steps = 10"]
    assert cli.main([*args, *(f"--gin_bindings={b}" for b in common)]) == 0
    retention = searched_retention(search, 32)
    assert list(retention) == sorted(retention, reverse=True) and retention[-1] < 32, retention
    tuned = str(tmp_path / "tuned")
    args = ["train", "--gin_file", "runs/power_bert_demo.gin", "--model_dir", tuned, "--gin_bindings",
            f"train.init_checkpoint = '{search}'", "--gin_bindings", f"power_bert.retention = {list(retention)}"]
    assert cli.main([*args, *(f"--gin_bindings={b}" for b in common)]) == 0
