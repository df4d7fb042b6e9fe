"""Progressive stacking (`train.extra_state = [@ProgressiveStacking()]`): before its growth the 4-layer model
is the 2-layer one, step by step; the growth copies layers and their optimizer moments exactly, scanned or not,
and the grown model's forward is a hand-built 4-layer model's; sharded equals one device; runs killed before
and after the growth and resumed equal an uninterrupted run bitwise."""

import dataclasses
import functools

import gin
import jax
import numpy as np
import optax
import pytest
from progressive_helpers import CONFIG, train, trainer_and_batches
from reliability.reliability_helpers_a import assert_trees_equal, saved_checkpoint

from ptmjax import partitioning
from ptmjax.compress.layerdrop import prune_layers
from ptmjax.families.token_loss import LossConfig
from ptmjax.layers import layer_stack
from ptmjax.models import Bert
from ptmjax.training import run
from ptmjax.training.layer_schedule import schedule_variables
from ptmjax.training.progressive_stacking import ProgressiveStacking
from ptmjax.tree_paths import leaves_by_path

STACKING = ProgressiveStacking((2,))
PLAIN = dataclasses.replace(CONFIG, dropout_rate=0.0)


def layer(tree, index):
    return {path: leaf for path, leaf in leaves_by_path(tree) if f"layers_{index}/" in f"{path}/"}


def test_before_its_growth_the_deep_model_trains_as_the_shallow_one():
    deep, batches = trainer_and_batches([STACKING], config=PLAIN, steps=2)
    shallow, _ = trainer_and_batches(config=dataclasses.replace(PLAIN, num_layers=2), steps=0)
    start = deep.init_state(jax.random.key(0))
    _, shallow_params = prune_layers(Bert(PLAIN), jax.device_get(start.params), [0, 1])
    deep_states, _ = train(deep, batches, state=start)  # no callback: the growth at step 2 is not done
    shallow_states, _ = train(shallow, batches, state=shallow.with_params(shallow.init_state(jax.random.key(0)),
                                                                          shallow_params))
    for got, want in zip(deep_states, shallow_states, strict=True):
        _, pruned = prune_layers(Bert(PLAIN), got.params, [0, 1])
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-7), pruned, want.params)


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.slow
def test_the_growth_copies_each_layer_and_its_moments_exactly(scan):
    trainer, batches = trainer_and_batches([STACKING], config=CONFIG.with_scan_layers(scan), steps=2)
    _, state = train(trainer, batches[:1])
    (grown,), _ = train(trainer, batches[1:], [STACKING.callback(trainer)], state=state, first_step=2)
    assert int(grown.extra["progressive_stacking"]["growths"]) == 1 and int(grown.step) == 2
    params = layer_stack.unscan(grown.params, CONFIG) if scan else grown.params
    mu, nu = grown.opt_state[1][0].mu, grown.opt_state[1][0].nu
    for tree in (params, mu, nu):
        for low in (0, 1):
            upper = layer(tree, low + 2)
            copy = {path.replace(f"layers_{low + 2}", f"layers_{low}"): leaf for path, leaf in upper.items()}
            assert_trees_equal(copy, layer(tree, low))
    assert int(grown.opt_state[1][0].count) == 2  # the step count goes on

    # The grown model is the plain 4-layer model of those parameters: built by hand from step 2's lower layers.
    hand = dict(params)
    for low in (0, 1):
        hand[f"layers_{low + 2}"] = params[f"layers_{low}"]
    api = trainer.api.unscanned() if scan else trainer.api
    variables = schedule_variables([STACKING], trainer.model, grown.step, grown.extra, train=False)
    batch = jax.device_get(batches[0])
    scheduled = trainer.api.with_variables(variables).loss(grown.params, batch, LossConfig())
    plain = api.loss(hand, batch, LossConfig())
    if scan:  # a scan's sums round apart from the unrolled stack's by an ulp
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), jax.device_get(scheduled),
                     jax.device_get(plain))
    else:
        assert_trees_equal(jax.device_get(scheduled), jax.device_get(plain))


def test_evaluation_before_the_growth_runs_the_active_layers_only():
    trainer, batches = trainer_and_batches([STACKING], config=PLAIN, steps=1)
    state = trainer.init_state(jax.random.key(0))
    shallow_model, shallow_params = prune_layers(Bert(PLAIN), jax.device_get(state.params), [0, 1])
    shallow, _ = trainer_and_batches(config=shallow_model.config, steps=0)
    got = trainer.eval_stats(state.params, batches[0], state).metrics()
    want = shallow.eval_stats(shallow_params, batches[0]).metrics()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), jax.device_get(got), jax.device_get(want))


@pytest.mark.slow
def test_a_sharded_stacking_run_equals_one_device():
    """Three steps with the growth after the second, on (data=2, fsdp=2, tensor=2) and on one device.

    SGD with momentum, whose per-layer trace the growth copies as it copies Adam's moments. Not Adam: the
    attention key biases have an exactly zero gradient (a constant added to a softmax row), about 1e-10 in
    float32 rounding, and Adam divides it by its own size (eps 1e-8), so those biases move by up to 0.1 of the
    learning rate in directions set by the rounding of each layout (1e-3 apart; every other parameter within
    2e-5). With SGD the two runs agree within 3e-8."""
    momentum = functools.partial(optax.sgd, momentum=0.9)
    results = []
    for mesh_config, devices in [(partitioning.MeshConfig(data=2, fsdp=2, tensor=2), jax.devices()),
                                 (partitioning.MeshConfig(data=1), jax.devices()[:1])]:
        trainer, batches = trainer_and_batches([STACKING], mesh_config=mesh_config, devices=devices, steps=3,
                                               optimizer=momentum)
        results.append(train(trainer, batches, [STACKING.callback(trainer)])[0][-1])
    sharded, single = results
    assert int(sharded.extra["progressive_stacking"]["growths"]) == 1
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), sharded.params, single.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), sharded.opt_state,
                 single.opt_state)


def bert_run(model_dir, num_steps, **settings):
    """runs/bert_stacking_demo.gin's model and task, tiny: growth after step 3."""
    gin.parse_config_file("gin_configs/models/bert_tiny.gin")
    try:
        return run.train(
            str(model_dir), model=Bert(dataclasses.replace(CONFIG, vocab_size=2176, max_length=32)),
            mixture_or_task_name="ptmjax_stdlib_mlm_nsp", task_feature_lengths={"inputs": 32, "targets": 32},
            pack=False, batch_size=8, num_steps=num_steps, extra_state=[ProgressiveStacking((3,))],
            show_progress=False, log_every=1, eval_every=1000, eval_batches=1, **settings,
        )
    finally:
        gin.clear_config()


@pytest.mark.slow  # five short runs
def test_runs_killed_before_and_after_the_growth_and_resumed_equal_a_straight_one(tmp_path):
    bert_run(tmp_path / "straight", 6, checkpoint_every=6)
    for name, killed_at in (("before", 2), ("after", 4)):
        bert_run(tmp_path / name, killed_at, checkpoint_every=killed_at)
        bert_run(tmp_path / name, 6, checkpoint_every=6)
    straight = saved_checkpoint(tmp_path / "straight", 6)
    assert int(straight["state"]["extra"]["progressive_stacking"]["growths"]) == 1
    for name in ("before", "after"):
        resumed = saved_checkpoint(tmp_path / name, 6)
        assert_trees_equal(straight["state"], resumed["state"])
        assert straight["data"] == resumed["data"]


@pytest.mark.parametrize("steps, message", [
    ((), r"growth_steps=\[\] must be increasing step counts >= 1"),
    ((5, 5), r"growth_steps=\[5, 5\] must be increasing"),
    ((0,), r"growth_steps=\[0\] must be increasing"),
])
def test_bad_growth_steps_are_refused_in_one_line(steps, message):
    with pytest.raises(ValueError, match=message):
        ProgressiveStacking(steps)


def test_a_depth_that_does_not_halve_is_refused():
    trainer, _ = trainer_and_batches([ProgressiveStacking((1, 2, 3))], steps=0)
    with pytest.raises(ValueError, match="depth must be a multiple of 8, but a stack of the model has 4 layers"):
        ProgressiveStacking((1, 2, 3)).callback(trainer)


@pytest.mark.parametrize("run_file, bound", [
    ("runs/bert_stacking_demo.gin", ProgressiveStacking((200,))),
    ("runs/bert_pld_demo.gin", "ProgressiveLayerDrop(theta_bar=0.5, gamma=0.005)"),
])
def test_the_demo_run_files_bind_their_schedule_on_a_4_layer_bert(run_file, bound):
    from ptmjax import gin_files

    try:
        gin_files.parse_gin([run_file])
        (reference,) = gin.query_parameter("train.extra_state")
        schedule = reference.scoped_configurable_fn()
        depth = gin.query_parameter("BertConfig.num_layers")
    finally:
        gin.clear_config()
    assert depth == 4
    assert (schedule if isinstance(bound, ProgressiveStacking) else repr(schedule)) == bound
