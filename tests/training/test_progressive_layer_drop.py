"""Progressive layer dropping (`train.extra_state = [@ProgressiveLayerDrop()]`): the keep schedule against the
formulas in float64 NumPy; keep probability 1 trains exactly as no schedule; each layer's empirical keep
frequency over many draws passes a binomial test against p_l; evaluation runs every layer; a run resumed
mid-way equals an uninterrupted one bitwise."""

import dataclasses

import gin
import jax
import numpy as np
import pytest
from progressive_helpers import CONFIG, train, trainer_and_batches
from reliability.reliability_helpers_a import assert_trees_equal, saved_checkpoint
from scipy import stats

from ptmjax.families.token_loss import LossConfig
from ptmjax.layers.layer_stack import LAYER_SCHEDULE
from ptmjax.models import Bert
from ptmjax.training import run
from ptmjax.training.layer_schedule import schedule_variables
from ptmjax.training.progressive_layer_drop import ProgressiveLayerDrop


def test_the_keep_schedule_is_zhang_and_hes():
    pld = ProgressiveLayerDrop(theta_bar=0.4, gamma=0.01)
    for step in (0, 1, 50, 300, 5000):
        theta = (1 - 0.4) * np.exp(-0.01 * step) + 0.4
        active, keep = pld.layers(np.int32(step), {}, 6)
        np.testing.assert_allclose(keep, 1 - np.arange(1, 7) / 6 * (1 - theta), rtol=1e-6)
        assert np.all(active) and float(pld.theta(step)) == pytest.approx(theta, rel=1e-6)


@pytest.mark.slow
def test_keep_probability_one_trains_exactly_as_no_schedule():
    scheduled, batches = trainer_and_batches([ProgressiveLayerDrop(theta_bar=1.0)], steps=2)
    plain, _ = trainer_and_batches(steps=0)
    got, _ = train(scheduled, batches)
    want, _ = train(plain, batches)
    for a, b in zip(got, want, strict=True):
        assert_trees_equal(a.params, b.params)
        assert_trees_equal(a.opt_state, b.opt_state)


def test_each_layer_is_kept_as_often_as_p_l_and_evaluation_runs_them_all():
    pld = ProgressiveLayerDrop(theta_bar=0.5, gamma=0.01)
    trainer, batches = trainer_and_batches([pld], steps=1)
    state = trainer.init_state(jax.random.key(0)).replace(step=np.int32(100))
    variables = schedule_variables([pld], trainer.model, state.step, state.extra, train=True)
    api = trainer.api.with_variables(variables)

    @jax.jit
    def skipped(rng):
        _, sown = api.forward(state.params, batches[0], LossConfig(), rng, mutable=("intermediates",))
        return sown["intermediates"][LAYER_SCHEDULE]["skipped"][0]

    draws = 2000
    kept = ~np.stack([np.asarray(skipped(jax.random.key(i))) for i in range(draws)])
    p = np.asarray(variables[LAYER_SCHEDULE][LAYER_SCHEDULE]["keep"])
    np.testing.assert_allclose(p, 1 - np.arange(1, 5) / 4 * (1 - float(pld.theta(100))), rtol=1e-6)
    for layer in range(4):
        assert stats.binomtest(int(kept[:, layer].sum()), draws, float(p[layer])).pvalue > 1e-3, layer
    # Evaluation runs every layer: the same statistics as a model without a schedule.
    plain, _ = trainer_and_batches(steps=0)
    got = jax.device_get(trainer.eval_stats(state.params, batches[0], state).metrics())
    want = jax.device_get(plain.eval_stats(state.params, batches[0]).metrics())
    assert_trees_equal(got, want)


@pytest.mark.slow  # three short runs
def test_a_resumed_run_equals_a_straight_one(tmp_path):
    def bert_run(model_dir, num_steps, checkpoint_every):
        gin.parse_config_file("gin_configs/models/bert_tiny.gin")
        try:
            run.train(str(model_dir), model=Bert(dataclasses.replace(CONFIG, vocab_size=2176, max_length=32)),
                      mixture_or_task_name="ptmjax_stdlib_mlm_nsp", task_feature_lengths={"inputs": 32, "targets": 32},
                      pack=False, batch_size=8, num_steps=num_steps, checkpoint_every=checkpoint_every,
                      extra_state=[ProgressiveLayerDrop(theta_bar=0.5, gamma=0.2)], show_progress=False,
                      log_every=1, eval_every=1000, eval_batches=1)
        finally:
            gin.clear_config()

    bert_run(tmp_path / "straight", 6, 6)
    bert_run(tmp_path / "resumed", 3, 3)
    bert_run(tmp_path / "resumed", 6, 6)
    assert_trees_equal(saved_checkpoint(tmp_path / "straight", 6)["state"],
                       saved_checkpoint(tmp_path / "resumed", 6)["state"])


@pytest.mark.parametrize("settings, message", [
    ({"theta_bar": 0.0}, r"theta_bar=0.0 must be a probability in \(0, 1\]"),
    ({"gamma": -1.0}, r"gamma=-1.0 must be a decay rate >= 0"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        ProgressiveLayerDrop(**settings)
