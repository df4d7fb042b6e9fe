"""Pipeline parallelism: a scanned layer stack split into stages over a mesh axis, fed micro-batches.

The rules pick the stage axis: when the logical axis 'layers' (the leading axis
of a scanned stack's parameters, ptmjax/layers/layer_stack.py) maps to a mesh
axis of size S > 1 (`partitioning.pipeline_rules`, gin_configs/mesh/pp.gin),
each device on that axis holds L / S of the L layers and `apply_layers` runs
the stack as a pipeline. The parameter tree is the scanned one, so checkpoints
need no conversion between meshes with and without stages.

Families: GPT-2 (dense or MoE), T5 (with LongT5) and BART (`PipelineStages`
configs). An encoder-decoder runs each stack as its own pipeline over all S
stages, one after the other: the encoder's output leaves its pipeline on every
stage (the last stage's result, summed over the stage axis) and enters each
decoder stage as a side input cut into the decoder's micro-batches, as the
masks are. Megatron-LM instead gives each stage either encoder or decoder
layers and sends the encoder's output down the decoder stages with the hidden
states; here every stage holds 1/S of each stack, so the stages stay balanced
whatever the two depths, each stack fills and drains its own pipeline (the
same bubble fraction, twice), and the encoder's output costs one sum of
[b, s, embed] over the stage axis.

Schedule (the model config's `pipeline_microbatches` M, `pipeline_schedule`,
`pipeline_repeats` R): the batch is cut into M micro-batches (interleaved, so
each data-parallel device keeps its own rows). At each tick every stage runs
its layers on one micro-batch and hands the result to the next stage with a
`ppermute` inside `shard_map` (one collective permute per tick). 'gpipe' is
R = 1: stage s holds layers [s L/S, (s+1) L/S) and micro-batch m passes it at
tick m + s. 'circular' (interleaved, as MaxText's `num_pipeline_repeats`):
stage s holds R groups of K = L / (S R) layers, group r being layers
[(r S + s) K, (r S + s + 1) K), and a micro-batch goes round the ring R times;
the last stage's output returns to stage 0 for the next round (buffered when
M > S). Both take M R + S - 1 ticks, each stage busy M R of them, so the idle
fraction (the bubble) is (S - 1) / (M R + S - 1), the count MaxText's
`Pipeline.__call__` gives (`real_iterations + bubble_iterations`, forwarding
delay 1). Circular needs M >= S. Its layer groups are not contiguous in the
stored [L, ...] layout, so the step reorders them over the stage axis (an
all-to-all of the stack's parameters, and of their gradients, per step).

Each stage's layers are scanned (`lax.scan`), rematerialised as `remat_policy`
says; dropout draws one key per (micro-batch, layer), so they differ from the
unpipelined run's, as scanning's differ from the plain stack's. Layers' sown
intermediates are not collected under the pipeline; their sown 'losses' (MoE's
auxiliary losses, whose expert axis composes with the stages) are, each summed
over the layers and averaged over the micro-batches (`apply_stages`).

With FSDP (e.g. stage=2 x fsdp=32) the fsdp axis stays automatic inside the
`shard_map`: XLA gathers each layer's weights inside the layer loop, one layer
at a time. The optimizer, which sees the layers unscanned, holds each layer's
state split over the stages too (`partitioning.optimizer_rules`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from ptmjax.layers.sequence_sharding import context_axis

Array = jax.Array
SCHEDULES = ("gpipe", "circular")
LAYERS_AXIS = "layers"  # the logical axis of a scanned stack's leading parameter dimension


def stage_axis() -> tuple[str, int] | None:
    """(mesh axis, size) that the rules in context give the logical 'layers' axis, if its size is > 1."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    spec = nn.logical_to_mesh_axes((LAYERS_AXIS,))
    axes = spec[0] if len(spec) else None
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    names = tuple(name for name in names if name in mesh.axis_names and mesh.shape[name] > 1)
    if not names:
        return None
    if len(names) > 1:
        raise ValueError(f"the rules map 'layers' to mesh axes {names}; a pipeline runs over one axis, map 'layers' "
                         "to one of them")
    return names[0], mesh.shape[names[0]]


def bubble_fraction(stages: int, microbatches: int, repeats: int = 1) -> float:
    """The idle share of a stage's ticks: (S - 1) / (M R + S - 1)."""
    return (stages - 1) / (microbatches * repeats + stages - 1)


def summary(model: nn.Module, mesh: jax.sharding.Mesh, rules: Any) -> str | None:
    """What a run's start-up line says of `model`'s pipeline ('pipeline: 4 stages over 'stage', ...'); None without."""
    config = getattr(model, "config", None)
    if not isinstance(config, PipelineStages):
        return None
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        layout = stage_axis()
    if layout is None:
        return None
    (axis, stages), repeats = layout, config.pipeline_repeats
    microbatches = config.pipeline_microbatches or stages
    rounds = f" x {repeats} rounds" if config.pipeline_schedule == "circular" else ""
    return (f"pipeline: {stages} stages over '{axis}', {microbatches} micro-batches, {config.pipeline_schedule}"
            f"{rounds}, bubble (S-1)/(M R+S-1) = {bubble_fraction(stages, microbatches, repeats):.1%}")


def schedule_table(stages: int, microbatches: int, repeats: int = 1) -> np.ndarray:
    """int [ticks, stages]: the work item (round r, micro-batch m as r M + m) each stage runs per tick; -1: idle.

    Stage s runs item t - s at tick t; micro-batch m meets layer group r S + s at item r M + m.
    """
    ticks = microbatches * repeats + stages - 1
    item = np.arange(ticks)[:, None] - np.arange(stages)[None, :]
    return np.where((item >= 0) & (item < microbatches * repeats), item, -1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineStages:
    """The pipeline fields of a family's config; a family whose stack can run as a pipeline inherits them.

    pipeline_microbatches: micro-batches M per batch (per gradient-accumulation micro-batch); None: one per stage.
    pipeline_schedule: 'gpipe' or 'circular' (see the module docstring).
    pipeline_repeats: R, the rounds of the circular schedule (groups of layers per stage); 1 for 'gpipe'.
    They only matter on a mesh whose rules map 'layers' to a stage axis (`stage_axis`).
    """

    pipeline_microbatches: int | None = None
    pipeline_schedule: str = "gpipe"
    pipeline_repeats: int = 1

    def check_pipeline_fields(self) -> None:
        """Raise unless the pipeline fields are well formed; errors name the field and the fix."""
        owner = type(self).__name__
        if self.pipeline_schedule not in SCHEDULES:
            raise ValueError(f"{owner}.pipeline_schedule={self.pipeline_schedule!r} is unknown; use one of {SCHEDULES}")
        m, r = self.pipeline_microbatches, self.pipeline_repeats
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
            raise ValueError(f"{owner}.pipeline_microbatches={m!r} must be a positive int (None: one per stage)")
        if not isinstance(r, int) or isinstance(r, bool) or r < 1:
            raise ValueError(f"{owner}.pipeline_repeats={r!r} must be a positive int")
        if self.pipeline_schedule == "gpipe" and r != 1:
            raise ValueError(f"{owner}.pipeline_repeats={r} needs pipeline_schedule='circular'; GPipe runs one round")


def stage_layout(config: Any, depth: int, skips_layers: bool) -> tuple[str, int] | None:
    """`stage_axis()` for a stack of `depth` layers of `config`, after one-line errors for what cannot run staged."""
    layout = stage_axis()
    if layout is None:
        return None
    owner, stages = type(config).__name__, layout[1]
    if not isinstance(config, PipelineStages):
        raise ValueError(
            f"pipeline stages run GPT-2, T5 and BART (GPT2Config, T5Config, BartConfig) stacks only, not "
            f"{owner}'s; map the logical axis 'layers' to no mesh axis (drop MeshConfig.rules = @pipeline_rules() "
            "and the stage axis)")
    if not config.scan_layers:
        raise ValueError(f"pipeline stages split a scanned stack; set {owner}.scan_layers=True")
    if context_axis() is not None:  # a context-parallel mask's shared leaves could be cut as per-row ones
        raise ValueError(f"{owner}: pipeline stages do not run with a context axis ({context_axis()!r}) yet; drop "
                         "the context axis or the stage axis")
    if skips_layers:
        raise ValueError(f"{owner}: LayerDrop and layer schedules do not run with pipeline stages; set layerdrop=0 "
                         "and drop the layer schedule")
    r, period = config.pipeline_repeats, config.scan_period
    if depth % (stages * r * period):
        per_step = f" (scan steps of moe_every={period} layers)" if period > 1 else ""
        raise ValueError(f"{owner}: {depth} layers{per_step} do not split into {stages} stages x "
                         f"pipeline_repeats={r}; make the depth a multiple of stages * repeats * {period}")
    m = config.pipeline_microbatches or stages
    if config.pipeline_schedule == "circular" and m < stages:
        raise ValueError(f"{owner}: the circular schedule needs pipeline_microbatches >= stages ({m} < {stages}); "
                         "raise pipeline_microbatches")
    return layout


def runs_staged(body: nn.Module) -> bool:
    """Whether a staged stack's scanned module runs as a pipeline now: not while it is initialised (the scan
    creates its parameters) nor while decoding (the scan fills the cache)."""
    return not body.is_initializing() and not body.is_mutable_collection("cache")


def apply_stages(body: nn.Module, config: Any, x: Array, args: tuple[Any, ...], enable_dropout: bool,
                 layout: tuple[str, int], remat_policy: Callable[..., bool] | None) -> Array:
    """The scanned stack `body` (its parameters [L, ...]) on x [b, ...] as a pipeline over `layout`'s axis.

    `remat_policy` is the jax policy of the layers' `config.remat_policy` (None for 'none'), see pipelined_stack.

    What the layers sow into 'losses' (MoE's auxiliary losses) is sown into `body`'s, each loss summed over
    the layers and averaged over the micro-batches: the whole batch's, as the losses are means over rows.
    """
    axis, stages = layout
    microbatches = config.pipeline_microbatches or stages
    if x.shape[0] % microbatches:
        raise ValueError(f"{type(config).__name__}.pipeline_microbatches={microbatches} does not divide the batch "
                         f"of {x.shape[0]} rows (per gradient-accumulation micro-batch); pick a divisor")
    plain = body.clone(parent=None)
    rng = body.make_rng("dropout") if enable_dropout else None

    def apply_layer(params, h, layer_args, layer_rng, index):
        rngs = {} if layer_rng is None else {"dropout": jax.random.fold_in(layer_rng, index)}
        out, sown = plain.apply({"params": params}, h, *layer_args, enable_dropout, rngs=rngs, mutable=["losses"])
        return out, jax.tree.map(jnp.sum, dict(sown.get("losses", {})))

    out, losses = pipelined_stack(apply_layer, body.variables["params"], x, args, rng, axis, stages, microbatches,
                                  config.pipeline_repeats, remat_policy)
    for name, value in losses.items():
        body.sow("losses", name, value)
    return out


def split_microbatches(x: Array, num_microbatches: int) -> Array:
    """[batch, ...] -> [microbatches, batch / microbatches, ...], interleaved.

    Microbatch m takes examples m, m + M, m + 2M, ..., so that each device
    keeps its own examples when the batch dimension is sharded.
    """
    batch = x.shape[0]
    if batch % num_microbatches:
        raise ValueError(f"batch size {batch} is not divisible by num_microbatches={num_microbatches}")
    x = x.reshape((batch // num_microbatches, num_microbatches) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)


def join_microbatches(x: Array) -> Array:
    """The inverse of `split_microbatches`: [microbatches, rows, ...] -> [microbatches * rows, ...]."""
    return jnp.swapaxes(x, 0, 1).reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def pipelined_stack(
    apply_layer: Callable[..., tuple[Array, Any]], params: Any, x: Array, args: tuple[Any, ...], rng: Array | None,
    axis: str, stages: int, microbatches: int, repeats: int, remat_policy: Callable[..., bool] | None = None,
) -> tuple[Array, Any]:
    """Runs a stack of L layers over x [b, ...] as a pipeline of `stages` stages on mesh axis `axis`.

    `params`: the scanned stack's parameters, leaves [L, ...] (sharded over `axis` on L).
    `apply_layer(layer_params, x, args, rng, layer_index)` runs one layer -> (output, aux), aux a tree of
    scalars (the same tree for every layer; {} for none); `args` leaves whose leading dimension is the batch's
    are cut into micro-batches with x, the others are shared. -> (output [b, ...], aux with each leaf summed
    over the layers and averaged over the micro-batches), both on every stage.
    `remat_policy`: what the layers save for the backward pass (a jax.checkpoint policy; None: every matrix
    product). With repeats > 1 each layer's parameters are cut from the stage's stack at the tick's round inside
    a checkpoint with that policy, so the backward pass cuts them again instead of keeping a copy per tick.
    """
    batch = x.shape[0]
    depth = jax.tree.leaves(params)[0].shape[0]
    per_group = depth // (stages * repeats)
    # Stage-major layer order: stage s's R groups contiguous, so sharding L over `axis` hands each stage its own.
    params = jax.tree.map(lambda p: _stage_major(p, stages, repeats), params)
    batched = jax.tree.map(lambda a: batch > 1 and a.ndim > 0 and a.shape[0] == batch, args)
    args = jax.tree.map(lambda a, cut: split_microbatches(a, microbatches) if cut else a, args, batched)
    table = schedule_table(stages, microbatches, repeats)
    arrived = np.concatenate([[-1], table[:-1, -1]])  # the item stage 0 receives from the last stage at each tick

    def per_stage(local_params, x_micro, args, rng):
        stage = jax.lax.axis_index(axis)
        local_params = jax.tree.map(lambda p: p.reshape((repeats, per_group) + p.shape[1:]), local_params)
        # One round: the group is the whole local stack, scanned as it is. Several: each layer is cut from the
        # stack at the traced round inside the layer scan (a cut outside it would be kept for every tick).
        group_of = lambda r: (jax.tree.map(lambda p: p[0], local_params) if repeats == 1  # noqa: E731
                              else functools.partial(_cut_layer, local_params, r))
        args_of = lambda m: jax.tree.map(lambda a, cut: _take(a, m) if cut else a, args, batched)  # noqa: E731

        def tick(carry, row):
            received, circulating, outputs, aux = carry
            items, arrived_item = row
            item = items[stage]
            m, r = jnp.maximum(item, 0) % microbatches, jnp.maximum(item, 0) // microbatches
            fresh = _take(x_micro, m)
            if circulating is not None:  # stage 0 keeps what the last stage finished last tick for its next round
                circulating = _set_if(circulating, jnp.maximum(arrived_item, 0) % microbatches, received,
                                      arrived_item >= 0)
                fresh = jnp.where(item < microbatches, fresh, _take(circulating, m))
            inputs = jnp.where(stage == 0, fresh, received)
            first_layer = (r * stages + stage) * per_group
            out, out_aux = _run_group(apply_layer, group_of(r), inputs, args_of(m), rng, m, first_layer, per_group,
                                       remat_policy)
            aux = jax.tree.map(lambda total, a: total + jnp.where(item >= 0, a, 0), aux, out_aux)
            outputs = _set_if(outputs, m, out, (stage == stages - 1) & (item >= microbatches * (repeats - 1)))
            received = jax.lax.ppermute(out, axis, [(s, (s + 1) % stages) for s in range(stages)])
            return (received, circulating, outputs, aux), None

        varying = lambda a: jax.lax.pcast(a, axis, to="varying")  # noqa: E731  (each stage's own values)
        received = varying(jnp.zeros_like(x_micro[0]))
        aux_shapes = jax.eval_shape(
            lambda: _run_group(apply_layer, group_of(0), received, args_of(0), rng, 0, 0, per_group, remat_policy))
        aux = jax.tree.map(lambda s: varying(jnp.zeros(s.shape, s.dtype)), aux_shapes[1])
        carry = (received, varying(jnp.zeros_like(x_micro)) if repeats > 1 else None,
                 varying(jnp.zeros_like(x_micro)), aux)
        (_, _, outputs, aux), _ = jax.lax.scan(tick, carry, (jnp.asarray(table), jnp.asarray(arrived)))
        outputs = jax.lax.psum(jnp.where(stage == stages - 1, outputs, 0), axis)  # the last stage's, on every stage
        return outputs, jax.tree.map(lambda a: jax.lax.psum(a, axis) / microbatches, aux)

    run = jax.shard_map(
        per_stage, in_specs=(PartitionSpec(axis), PartitionSpec(), PartitionSpec(), PartitionSpec()),
        out_specs=PartitionSpec(), axis_names=frozenset({axis}),
    )
    outputs, aux = run(params, split_microbatches(x, microbatches), args, rng)
    return join_microbatches(outputs), aux


def _run_group(apply_layer, group, x, args, rng, microbatch, first_layer, depth, remat_policy):
    """The stage's K = `depth` layers on one micro-batch, scanned -> (output, aux summed over them).

    `group`: their parameters (leaves [K, ...]), or a function of a layer's index k < K to its parameters,
    called inside a checkpoint with `remat_policy` (None: jax.checkpoint_policies.dots_saveable).
    """
    rng = None if rng is None else jax.random.fold_in(rng, microbatch)
    if callable(group):
        def layer(h, index):
            return apply_layer(group(index), h, args, rng, first_layer + index)

        layer = jax.checkpoint(layer, policy=remat_policy or jax.checkpoint_policies.dots_saveable)
        out, aux = jax.lax.scan(layer, x, jnp.arange(depth))
    else:
        out, aux = jax.lax.scan(lambda h, indexed: apply_layer(indexed[1], h, args, rng, first_layer + indexed[0]),
                                x, (jnp.arange(depth), group))
    return out, jax.tree.map(lambda a: jnp.sum(a, axis=0), aux)


def _cut_layer(local_params: Any, round_index: Array, index: Array) -> Any:
    """Layer `index` of group `round_index` of a stage's stack (leaves [R, K, ...])."""
    return jax.tree.map(lambda p: p[round_index, index], local_params)


def _stage_major(p: Array, stages: int, repeats: int) -> Array:
    """[L, ...] in layer order -> [L, ...] with stage s's groups r S + s (r < R) contiguous (R = 1: unchanged)."""
    if repeats == 1:
        return p
    groups = p.reshape((repeats, stages, p.shape[0] // (repeats * stages)) + p.shape[1:])
    return jnp.swapaxes(groups, 0, 1).reshape(p.shape)


def _take(x: Array, index: Array) -> Array:
    return jax.lax.dynamic_index_in_dim(x, index, keepdims=False)


def _set_if(buffer: Array, index: Array, value: Array, condition: Array) -> Array:
    """buffer with buffer[index] = value where `condition`."""
    return jax.lax.dynamic_update_index_in_dim(buffer, jnp.where(condition, value, _take(buffer, index)), index, 0)
