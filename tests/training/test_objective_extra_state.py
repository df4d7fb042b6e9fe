"""An objective that reads the run's extra state and returns new values of it (ptmjax/training/objective.py):
an L2-SP penalty towards a frozen copy of the initial parameters and a count of the target tokens seen, against
the plain step plus the penalty's gradient worked out by hand in float64, with one and with two micro-batches."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ptmjax import partitioning
from ptmjax.models import EncoderDecoder, T5Config
from ptmjax.training.objective import family_loss
from ptmjax.training.optimizers import adafactor
from ptmjax.training.run_spec import RunSpec
from ptmjax.training.trainer import Trainer
from ptmjax.tree_paths import leaves_by_path

CONFIG = T5Config(
    vocab_size=64, d_model=16, num_heads=2, head_dim=8, d_ff=32, num_encoder_layers=1, num_decoder_layers=1,
    ffn_activations=("gelu", "linear"), tie_embeddings=False, dropout_rate=0.0,
)
STRENGTH, LEARNING_RATE, STEPS = 2.0, 0.1, 3


@dataclasses.dataclass(frozen=True)
class FrozenStart:
    """The initial parameters, never updated (as a frozen teacher's would be)."""

    name: str = "start"

    def abstract(self, view):
        return view.abstract_params

    def shardings(self, view):
        return view.param_shardings

    def init(self, params, view):
        return params

    def update(self, value, params, view):
        return value


@dataclasses.dataclass(frozen=True)
class TokensSeen:
    """A float32 count that only the objective changes."""

    name: str = "tokens_seen"

    def abstract(self, view):
        return jax.ShapeDtypeStruct((), jnp.float32)

    def shardings(self, view):
        return jax.sharding.NamedSharding(jax.tree.leaves(view.param_shardings)[0].mesh, jax.sharding.PartitionSpec())

    def init(self, params, view):
        return jnp.zeros((), jnp.float32)

    def update(self, value, params, view):
        return value


def l2_sp(api, params, batch, loss_config, rng, extra):
    token_loss, batch_loss, stats, _ = family_loss(api, params, batch, loss_config, rng, extra)
    penalty = sum(jax.tree.leaves(jax.tree.map(lambda p, s: jnp.sum((p - s) ** 2), params, extra["start"])))
    seen = extra["tokens_seen"] + jnp.sum(batch["decoder_loss_weights"])
    return token_loss, batch_loss + STRENGTH * penalty, stats, {"tokens_seen": seen}


def trainer(extra_state=(), objective=family_loss, num_microbatches=1):
    spec = RunSpec(model=EncoderDecoder(CONFIG), batch_size=8, task_feature_lengths={"inputs": 12, "targets": 6},
                   optimizer=adafactor, pack=False)
    mesh = partitioning.make_mesh(spec.mesh_config)
    return spec, Trainer(spec.model, optax.sgd(LEARNING_RATE), optax.constant_schedule(LEARNING_RATE), mesh,
                         spec.mesh_config.rules, num_microbatches=num_microbatches, extra_state=extra_state,
                         objective=objective)


def batches(spec, mesh):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(STEPS):
        batch = {name: rng.integers(1, CONFIG.vocab_size, s.shape, dtype=s.dtype)
                 for name, s in spec.abstract_batch(None).items()}
        batch["decoder_loss_weights"] = (rng.random(batch["decoder_loss_weights"].shape) < 0.8).astype(np.int32)
        out.append(partitioning.global_batch(batch, mesh))
    return out


def float64(params):
    return {path: np.asarray(value, np.float64) for path, value in leaves_by_path(jax.device_get(params))}


@pytest.mark.parametrize("num_microbatches", [1, 2])
def test_the_objective_reads_and_updates_the_extra_state(num_microbatches):
    spec, penalised = trainer((FrozenStart(), TokensSeen()), l2_sp, num_microbatches)
    _, plain = trainer(num_microbatches=num_microbatches)
    data = batches(spec, penalised.mesh)
    state = penalised.init_state(jax.random.key(0))
    start = float64(state.params)
    rng, seen = jax.random.key(1), 0.0
    for batch in data:
        before = float64(state.params)
        copy = jax.tree.map(jnp.copy, state.replace(extra={}))  # the step donates its state
        plain_after = float64(plain.train_step(copy, batch, rng)[0].params)
        state, metrics = penalised.train_step(state, batch, rng)
        normalizer = float(np.sum(jax.device_get(batch["decoder_loss_weights"])))
        seen += normalizer
        # SGD on family loss / normalizer + STRENGTH * |p - p0|^2 (a per-batch term, once however many
        # micro-batches): the plain step, less the penalty's step.
        for path, value in float64(state.params).items():
            expected = plain_after[path] - LEARNING_RATE * 2 * STRENGTH * (before[path] - start[path])
            np.testing.assert_allclose(value, expected, rtol=2e-5, atol=2e-6, err_msg=path)
        assert bool(metrics["finite"])
    assert float(state.extra["tokens_seen"]) == seen
    for path, value in float64(state.extra["start"]).items():
        np.testing.assert_array_equal(value, start[path])


def with_memory(api, params, batch, loss_config, rng, extra):
    return (*family_loss(api, params, batch, loss_config, rng, extra)[:3], {"memory": jnp.zeros(())})


def test_an_objective_returning_state_the_run_does_not_carry_is_named():
    spec, run = trainer((FrozenStart(),), with_memory)
    state = run.init_state(jax.random.key(0))
    with pytest.raises(ValueError, match=r"returned extra state \['memory'\], which the run does not carry"):
        run.train_step(state, batches(spec, run.mesh)[0], jax.random.key(1))
