"""Magnitude pruning (`train.extra_state = [@MagnitudePruning()]`): the cubic schedule by hand, exact-count
masks against a NumPy sort, pruned weights exactly zero through steps, rewinding, sharded equal to one device,
and a resumed run bitwise equal to a straight one."""

import jax
import numpy as np
import pytest
from reliability.reliability_helpers_a import assert_trees_equal, run, saved_checkpoint

from ptmjax import partitioning
from ptmjax.compress.magnitude_masks import sparsity_of
from ptmjax.compress.magnitude_pruning import MagnitudePruning
from ptmjax.layers import layer_stack
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.training.callbacks.callback import StepEvent
from ptmjax.training.optimizers import adafactor
from ptmjax.training.run_spec import RunSpec
from ptmjax.tree_paths import leaves_by_path, subtree

CONFIG = T5Config(
    vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=2, num_decoder_layers=1,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
LENGTHS = {"inputs": 12, "targets": 6}


def trainer_and_batches(pruning, scan=False, mesh_config=None, devices=None, steps=4):
    spec = RunSpec(model=EncoderDecoder(CONFIG.with_scan_layers(scan)), batch_size=8, task_feature_lengths=LENGTHS,
                   optimizer=adafactor, pack=False, mesh_config=mesh_config, extra_state=(pruning,))
    trainer = spec.trainer(partitioning.make_mesh(spec.mesh_config, devices))
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(steps):
        batch = {name: rng.integers(1, CONFIG.vocab_size, s.shape, dtype=s.dtype)
                 for name, s in spec.abstract_batch(None).items()}
        batch["decoder_loss_weights"] = np.ones_like(batch["decoder_loss_weights"])
        batches.append(partitioning.global_batch(batch, trainer.mesh))
    return trainer, batches


def train(trainer, pruning, batches):
    """The states after each step, the pruning callback acting as in a run."""
    schedule, state, states = pruning.callback(trainer), trainer.init_state(jax.random.key(0)), []
    for step, batch in enumerate(batches, 1):
        state, metrics = trainer.train_step(state, batch, jax.random.key(1))
        event = StepEvent(step, state, metrics, batch, final=step == len(batches))
        schedule.on_step(event)
        state = event.state
        states.append(jax.device_get(state))
    return states


def reference_masks(weights, kept, count):
    """NumPy: prune the `count` smallest keys (-1 where already pruned), ties to the earlier position."""
    keys = np.concatenate([np.where(k, np.abs(w), -1.0).ravel() for w, k in zip(weights, kept, strict=True)])
    pruned = np.zeros(keys.size, bool)
    pruned[np.argsort(keys, kind="stable")[:count]] = True
    splits = np.cumsum([w.size for w in weights])[:-1]
    return [~p.reshape(w.shape) for p, w in zip(np.split(pruned, splits), weights, strict=True)]


def test_the_cubic_schedule_is_zhu_and_guptas():
    pruning = MagnitudePruning(0.8, begin_step=10, end_step=50, frequency=15, initial_sparsity=0.2)
    assert [t for t in range(70) if pruning.updates_at(t)] == [10, 25, 40, 50]
    for t, last in [(0, None), (9, None), (10, 10), (24, 10), (25, 25), (49, 40), (50, 50), (69, 50)]:
        want = 0.0 if last is None else 0.8 + (0.2 - 0.8) * (1 - (last - 10) / 40) ** 3
        assert pruning.sparsity_at(t) == pytest.approx(want, abs=1e-12), t
    one_shot = MagnitudePruning(0.5, begin_step=3)
    assert [t for t in range(10) if one_shot.updates_at(t)] == [3]
    assert [one_shot.sparsity_at(t) for t in (2, 3, 9)] == [0.0, 0.5, 0.5]


@pytest.mark.parametrize("scope", ["global", "tensor"])
@pytest.mark.slow
def test_masks_prune_exact_counts_as_a_numpy_sort_does_scanned_or_not(scope):
    pruning = MagnitudePruning(0.5, begin_step=1, scope=scope)
    plain_trainer, _ = trainer_and_batches(pruning, steps=0)
    params = jax.device_get(plain_trainer.init_state(jax.random.key(0)).params)
    # Coarse values make many ties; a third of the weights already pruned.
    weights = jax.tree.map(lambda w: np.round(np.asarray(w) * 20) / 20,
                           subtree(params, pruning.target_paths(plain_trainer.params_view)))
    rng = np.random.default_rng(1)
    kept = jax.tree.map(lambda w: rng.random(w.shape) > 1 / 3, weights)
    masks = {}
    for scan in (False, True):
        trainer = trainer_and_batches(pruning, scan=scan, steps=0)[0] if scan else plain_trainer
        config, view = trainer.api.module.config, trainer.params_view
        laid_out = (lambda tree, config=config: layer_stack.scan(tree, config)) if scan else (lambda tree: tree)  # noqa: E731
        got = jax.device_get(pruning.masks(laid_out(weights), laid_out(kept), pruning.pruned_counts(0.6, view), view))
        masks[scan] = layer_stack.unscan(got, config) if scan else got
        if scan:
            continue
        paths = [path for path, _ in leaves_by_path(weights)]
        w, k = (dict(leaves_by_path(tree)) for tree in (weights, kept))
        groups = [paths] if scope == "global" else [[p] for p in paths]
        for group in groups:
            size = sum(w[p].size for p in group)
            want = reference_masks([w[p] for p in group], [k[p] for p in group], int(np.floor(0.6 * size + 0.5)))
            for path, mask in zip(group, want, strict=True):
                np.testing.assert_array_equal(dict(leaves_by_path(got))[path], mask, err_msg=path)
        assert sparsity_of(got) == pytest.approx(0.6, abs=0.01)
    if scope == "tensor":  # per layer in either layout; the global order of ties differs between layouts
        assert_trees_equal(masks[False], masks[True])


def test_pruned_weights_stay_exactly_zero_and_reach_the_target_through_steps():
    pruning = MagnitudePruning(0.7, begin_step=2, end_step=6, frequency=2, initial_sparsity=0.3)
    trainer, batches = trainer_and_batches(pruning, steps=7)
    states = train(trainer, pruning, batches)
    paths = pruning.target_paths(trainer.params_view)
    previous = None
    for step, state in enumerate(states, 1):
        masks = state.extra["pruning"]["masks"]
        weights = subtree(state.params, paths)
        jax.tree.map(lambda w, m: np.testing.assert_array_equal(w[~m], 0), weights, masks)
        size = sum(m.size for m in jax.tree.leaves(masks))
        assert sparsity_of(masks) == int(np.floor(pruning.sparsity_at(step) * size + 0.5)) / size
        if previous is not None:  # masks only lose weights
            jax.tree.map(lambda m, p: np.testing.assert_array_equal(m & ~p, False), masks, previous)
        previous = masks
    assert sparsity_of(previous) == pytest.approx(0.7, abs=1e-3)
    untargeted = [p for p, _ in leaves_by_path(states[-1].params) if p not in paths]
    assert "token_embedder/embedding" in untargeted and "decoder/logits_dense/kernel" in untargeted
    assert all(np.count_nonzero(dict(leaves_by_path(states[-1].params))[p]) > 0 for p in untargeted)


@pytest.mark.slow
def test_one_shot_pruning_applies_before_the_first_step_and_to_an_init_checkpoints_params():
    pruning = MagnitudePruning(0.5)
    trainer, batches = trainer_and_batches(pruning, steps=1)
    plain, _ = trainer_and_batches(MagnitudePruning(0.0), steps=1)
    state = trainer.init_state(jax.random.key(0))
    dense = plain.init_state(jax.random.key(0))
    masks = jax.device_get(state.extra["pruning"]["masks"])
    assert sparsity_of(masks) == pytest.approx(0.5, abs=1e-3)
    weights = jax.device_get(subtree(dense.params, pruning.target_paths(trainer.params_view)))
    want = reference_masks(jax.tree.leaves(weights), [np.ones(w.shape, bool) for w in jax.tree.leaves(weights)],
                           int(np.floor(0.5 * sum(w.size for w in jax.tree.leaves(weights)) + 0.5)))
    for got, mask in zip(jax.tree.leaves(masks), want, strict=True):
        np.testing.assert_array_equal(got, mask)
    # The first step trains the pruned model: the same loss as the dense trainer given the pruned parameters.
    pruned_params = jax.device_get(state.params)
    _, metrics = trainer.train_step(state, batches[0], jax.random.key(1))
    _, dense_metrics = plain.train_step(plain.with_params(dense, pruned_params), batches[0], jax.random.key(1))
    assert float(metrics["loss"]) == float(dense_metrics["loss"])
    # Parameters given later (an init checkpoint's) are pruned from their own magnitudes.
    again = trainer.with_params(trainer.init_state(jax.random.key(2)), plain.init_state(jax.random.key(0)).params)
    assert_trees_equal(jax.device_get(again.params), pruned_params)


def test_rewinding_resets_the_survivors_to_their_initial_values():
    pruning = MagnitudePruning(0.6, begin_step=2, end_step=4, frequency=2, initial_sparsity=0.3, rewind=True)
    trainer, batches = trainer_and_batches(pruning, steps=4)
    initial = jax.device_get(trainer.init_state(jax.random.key(0)))
    states = train(trainer, pruning, batches)
    paths = pruning.target_paths(trainer.params_view)
    start = subtree(initial.params, paths)
    np.testing.assert_equal(jax.device_get(states[-1].extra["pruning"]["rewind"]), start)
    for step in (2, 4):
        masks, weights = states[step - 1].extra["pruning"]["masks"], subtree(states[step - 1].params, paths)
        jax.tree.map(lambda w, m, w0: np.testing.assert_array_equal(w, np.where(m, w0, 0)), weights, masks, start)
    moved = subtree(states[2].params, paths)  # step 3 trains the rewound subnetwork
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(start), strict=True))


@pytest.mark.slow
def test_a_sharded_pruned_run_equals_one_device():
    pruning = MagnitudePruning(0.5, begin_step=1, end_step=3, frequency=1, scope="tensor")
    results = []
    for mesh_config, devices in [(partitioning.MeshConfig(data=2, fsdp=2, tensor=2), None),
                                 (partitioning.MeshConfig(data=1), jax.devices()[:1])]:
        trainer, batches = trainer_and_batches(pruning, mesh_config=mesh_config, devices=devices, steps=3)
        results.append(train(trainer, pruning, batches)[-1])
    sharded, single = results
    assert_trees_equal(sharded.extra["pruning"]["masks"], single.extra["pruning"]["masks"])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), sharded.params, single.params)


@pytest.mark.slow
def test_a_resumed_pruned_run_equals_a_straight_one(tmp_path):
    pruning = MagnitudePruning(0.6, begin_step=1, end_step=5, frequency=2)
    run(tmp_path / "straight", num_steps=6, extra_state=[pruning])
    run(tmp_path / "resumed", num_steps=3, extra_state=[pruning], checkpoint_every=3)
    run(tmp_path / "resumed", num_steps=6, extra_state=[pruning])
    straight, resumed = (saved_checkpoint(tmp_path / name, 6)["state"] for name in ("straight", "resumed"))
    assert_trees_equal(straight, resumed)
    masks = straight["extra"]["pruning"]["masks"]
    assert all(m.dtype == np.bool_ for m in jax.tree.leaves(masks))
    assert sparsity_of(masks) == pytest.approx(0.6, abs=1e-3)


@pytest.mark.parametrize("settings, message", [
    ({"sparsity": 1.0}, r"sparsity=1.0 must be a fraction in \[0, 1\)"),
    ({"sparsity": 0.5, "initial_sparsity": 0.6}, "initial_sparsity=0.6 exceeds sparsity=0.5"),
    ({"sparsity": 0.5, "begin_step": 5, "end_step": 5}, "end_step=5 must be an integer after begin_step=5"),
    ({"sparsity": 0.5, "frequency": 0}, "frequency=0 must be an integer >= 1"),
    ({"sparsity": 0.5, "scope": "layer"}, "scope='layer' must be one of"),
    ({"sparsity": 0.5, "targets": ("(",)}, "'\\(' is not a regular expression"),
])
def test_bad_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        MagnitudePruning(**settings)


def test_targets_that_match_no_trained_parameter_are_refused():
    with pytest.raises(ValueError, match=r"targets=\['nothing/.\*'\] match none of the trained parameters"):
        trainer_and_batches(MagnitudePruning(0.5, targets=("nothing/.*",)), steps=0)


def test_the_demo_run_file_binds_gradual_pruning_of_the_layer_kernels():
    import gin

    from ptmjax import gin_files

    try:
        gin_files.parse_gin(["runs/prune_demo.gin"])
        (reference,) = gin.query_parameter("train.extra_state")
        pruning = reference.scoped_configurable_fn()
    finally:
        gin.clear_config()
    assert pruning == MagnitudePruning(0.5, begin_step=0, end_step=200, frequency=25)
    assert [pruning.sparsity_at(step) for step in (0, 100, 200)] == pytest.approx([0.0, 0.4375, 0.5])
