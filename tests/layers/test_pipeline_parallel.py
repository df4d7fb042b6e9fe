"""Pipeline stages (ptmjax/layers/pipeline.py): the schedule, its bubble, and the pipelined stack's numbers.

A stack of simple layers run as a pipeline on 8 emulated devices (stage=4, data=2) equals the
same layers applied one after the other, in value and in gradient (of the parameters, the input and
the side inputs), with each layer's auxiliary loss summed as the sequence sums it, for GPipe and the
circular schedule (with and without the buffer between rounds); the idle (stage, tick) slots of the
schedule are counted against the bubble formula. The circular schedule's backward pass keeps no copy of the
layers it cut for each tick (compiled temporaries of two rounds against one).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ptmjax.layers import pipeline
from ptmjax.layers.layer_stack import REMAT_POLICIES
from ptmjax.models import GPT2, GPT2Config

STAGES, BATCH, WIDTH = 4, 16, 8


@pytest.mark.parametrize("stages, microbatches, repeats", [(4, 4, 1), (4, 8, 1), (2, 3, 1), (4, 1, 1),
                                                           (4, 4, 2), (4, 8, 3), (2, 5, 2)])
def test_bubble_formula_equals_the_idle_slots_of_the_schedule(stages, microbatches, repeats):
    table = pipeline.schedule_table(stages, microbatches, repeats)
    idle = np.sum(table < 0) / table.size
    assert idle == pytest.approx(pipeline.bubble_fraction(stages, microbatches, repeats), abs=1e-12)
    items = microbatches * repeats
    for stage in range(stages):  # every stage runs every (round, micro-batch) once, in order
        assert list(table[:, stage][table[:, stage] >= 0]) == list(range(items))
    tick_of = {(int(item), stage): tick for (tick, stage), item in np.ndenumerate(table) if item >= 0}
    for (item, stage), tick in tick_of.items():  # its input is ready: the previous stage, or the last one's round
        if stage > 0:
            assert tick_of[item, stage - 1] < tick
        elif item >= microbatches:
            assert tick_of[item - microbatches, stages - 1] < tick


def layer(params, h, args, rng, index):
    """A layer and an auxiliary loss that is a mean over rows, as MoE's are."""
    scale, shift = args
    out = jnp.tanh(h @ params["w"] + params["b"]) * scale + shift[index % 2]
    return out, {"mean_square": jnp.mean(out**2) * (index + 1)}


def sequential(params, x, args):
    aux = 0.0
    for i in range(params["w"].shape[0]):
        x, layer_aux = layer(jax.tree.map(lambda p, i=i: p[i], params), x, args, None, i)
        aux += layer_aux["mean_square"]
    return x, {"mean_square": aux}


@functools.lru_cache(maxsize=None)
def mesh():
    return Mesh(np.asarray(jax.devices()).reshape(STAGES, 2), ("stage", "data"))


def inputs(depth):
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(0, 0.5, (depth, WIDTH, WIDTH)), "b": rng.normal(0, 0.1, (depth, WIDTH))}
    x = rng.normal(size=(BATCH, 3, WIDTH))
    args = (rng.uniform(0.5, 1.5, (BATCH, 1, 1)), rng.normal(size=(2, WIDTH)))  # per row, and shared
    return jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), (params, x, args))


@pytest.mark.parametrize("microbatches, repeats", [(4, 1), (2, 1), (4, 2), (8, 2)])
def test_pipelined_stack_equals_the_layers_in_sequence(microbatches, repeats):
    params, x, args = inputs(STAGES * repeats * 2)
    run = lambda p, x, a: pipeline.pipelined_stack(layer, p, x, a, None, "stage", STAGES, microbatches, repeats)  # noqa: E731
    loss = lambda f: lambda p, x, a: jnp.sum(f(p, x, a)[0] ** 2) + 10 * f(p, x, a)[1]["mean_square"]  # noqa: E731
    with jax.set_mesh(mesh()):
        on = lambda *spec: NamedSharding(mesh(), PartitionSpec(*spec))  # noqa: E731
        params = jax.device_put(params, on("stage"))
        x = jax.device_put(x, on("data"))
        got = jax.jit(run)(params, x, args)
        got_grads = jax.jit(jax.grad(loss(run), argnums=(0, 1, 2)))(params, x, args)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-6, atol=2e-6), got, sequential(params, x, args))
    want_grads = jax.grad(loss(sequential), argnums=(0, 1, 2))(params, x, args)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-4), got_grads, want_grads)


@pytest.mark.parametrize("policy", ["none", "full", "save_dot_products"])
def test_the_circular_backward_pass_keeps_no_copy_of_the_layers_per_tick(policy):
    """The round's layers, cut at a traced index, are cut again in the backward pass: two rounds of half the
    layers need no more temporaries than one round of all, where keeping each tick's cut would add
    (ticks = M R + S - 1 = 11) x 2 MiB here. The FLOPs are those of the model's own remat policy."""
    width, depth, remat = 512, 8, REMAT_POLICIES[policy]

    def mlp(params, h, args, rng, index):
        out = h + jnp.tanh(h @ params["w1"]) @ params["w2"]
        return out, {}

    inner = mlp if remat is None else jax.checkpoint(mlp, policy=remat)
    on = lambda *spec: NamedSharding(mesh(), PartitionSpec(*spec))  # noqa: E731
    params = {name: jax.ShapeDtypeStruct((depth, width, width), jnp.float32, sharding=on("stage"))
              for name in ("w1", "w2")}
    x = jax.ShapeDtypeStruct((64, width), jnp.float32, sharding=on("data"))
    compiled = {}
    for repeats in (1, 2):
        def loss(p, x, repeats=repeats):
            out, _ = pipeline.pipelined_stack(inner, p, x, (), None, "stage", STAGES, 4, repeats, remat)
            return jnp.sum(out**2)

        with jax.set_mesh(mesh()):
            compiled[repeats] = jax.jit(jax.grad(loss)).lower(params, x).compile()
    temporaries = {r: c.memory_analysis().temp_size_in_bytes for r, c in compiled.items()}
    assert temporaries[2] < 1.1 * temporaries[1], temporaries  # keeping the cuts: 3.5 times (30.5 / 8.8 MiB)
    flops = {r: c.cost_analysis()["flops"] for r, c in compiled.items()}
    assert flops[2] < 1.02 * flops[1], flops  # no layer recomputed beyond what the policy recomputes


def test_bad_pipeline_fields_are_refused():
    base = dict(vocab_size=64, d_model=16, num_heads=2, num_layers=4, d_ff=32, max_length=16)
    with pytest.raises(ValueError, match="pipeline_schedule='zigzag' is unknown"):
        GPT2Config(**base, pipeline_schedule="zigzag")
    with pytest.raises(ValueError, match="pipeline_repeats=2 needs pipeline_schedule='circular'"):
        GPT2Config(**base, pipeline_repeats=2)
    with pytest.raises(ValueError, match="pipeline_microbatches=0 must be a positive int"):
        GPT2Config(**base, pipeline_microbatches=0)


def test_summary_reports_the_bubble_of_the_staged_mesh():
    from ptmjax import partitioning
    from ptmjax.partitioning import MeshConfig, pipeline_rules
    from ptmjax.training.startup import StartupClock

    axes = {"stage": 4, "data": 2, "fsdp": 1, "tensor": 1, "expert": 1}
    staged = MeshConfig(axes=tuple(axes.items()), rules=pipeline_rules())
    config = GPT2Config(vocab_size=64, d_model=16, num_heads=2, num_layers=8, d_ff=32, max_length=16,
                        scan_layers=True, pipeline_microbatches=4, pipeline_schedule="circular", pipeline_repeats=2)
    line = pipeline.summary(GPT2(config), partitioning.make_mesh(staged), staged.rules)
    assert line == ("pipeline: 4 stages over 'stage', 4 micro-batches, circular x 2 rounds, "
                    "bubble (S-1)/(M R+S-1) = 27.3%")  # 3 / 11
    assert pipeline.summary(GPT2(config), partitioning.make_mesh(MeshConfig()), MeshConfig().rules) is None
    clock = StartupClock("imports and gin")
    clock.notes.append(line)
    assert clock.line().endswith("; " + line)
