"""Layer stacks: rematerialisation policies, scanning over layers, and the scanned parameter layout.

Every family stacks its layers with `apply_layers`. A config that inherits
`LayerStackConfig` (all but the permutation LM's, directly or through
`MoeConfig`) chooses:

- `remat_policy`: what the backward pass keeps of each layer's forward pass.
  'none' keeps everything; 'full' keeps only the layer's inputs and recomputes the
  rest (jax.checkpoint_policies.nothing_saveable); 'save_dot_products' keeps the
  outputs of the weight matmuls (dots without batch dimensions, bf16 ones by name) and recomputes
  norms, activations and attention (dots_with_no_batch_dims_saveable).
- `scan_layers`: one `nn.scan` over the stack instead of a Python loop, so the
  layer is traced and compiled once. Parameters are then stacked: a stack's
  `layers_0 ... layers_{n-1}` become one `layers` entry whose arrays carry a
  leading logical axis 'layers' (mapped to no mesh axis by the default rules).
  With MoE every k-th layer the scan steps over periods of k layers: `layers`
  holds `layers_0 ... layers_{k-1}` (the last one MoE), stacked n / k times, so
  each stack's depth must be a multiple of `moe_every`. Layers shared across
  the stack (ALBERT: `repeats` > 1) scan over the distinct parameter sets,
  each step applying its layer `repeats` times.
- `layerdrop` (and `decoder_layerdrop` for a stack at ('decoder',)): LayerDrop
  (Fan et al., 2019), in training only (enable_dropout=True). Each layer of
  the stack is skipped (the identity) this step with that probability: one
  Bernoulli draw per layer applied, for the whole batch, from the 'dropout'
  rng stream. The draws are made once per stack, before its layers run, and
  sown into 'intermediates' as `layerdrop/dropped`, so a scanned stack drops
  the layers an unscanned one drops given the same rng. A dropped layer still
  runs and its output is discarded (`jnp.where`), so it saves no compute and
  its parameters get a zero gradient. At 0 nothing is drawn.
- The 'layer_schedule' collection (`LAYER_SCHEDULE`): a run's layer schedule
  (ptmjax/training/layer_schedule.py: progressive stacking, progressive layer
  dropping) gives each stack, as the variables `active` (bool [depth]) and
  `keep` (float [depth]) of its child `layer_schedule`, which layers run: an
  inactive layer is skipped always, evaluation included, and in training each
  active layer is also skipped with probability 1 - keep (one draw per layer
  and step from the 'dropout' stream, sown as `layer_schedule/skipped`). The
  skip is LayerDrop's; a model applied without the collection runs every layer.

Neither remat nor scanning changes the numbers: logits and gradients equal the plain
model's. Dropout (and MoE jitter) draws differ, since a scan splits the rngs
per step instead of per layer name. The default, unscanned layout is the one
the golden files and Hugging Face converters use; `scan` and `unscan` convert
a parameter tree between the two layouts, and `unscanned` gives a model's plain
twin with its parameters. The trainer applies the optimizer
to the unscanned layout (`training.optimizers.on_unscanned_layout`), so a
scanned run's updates and optimizer state are the plain run's.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ptmjax.layers import mixed_precision, pipeline

Array = jax.Array
Tree = Mapping[str, Any]

REMAT_POLICIES: dict[str, Callable[..., bool] | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dot_products": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(mixed_precision.NO_BATCH_DOT),  # bf16's dots
    ),
}
SCANNED = "layers"  # the name of a scanned stack's module, and the logical axis of its stacked parameters
LAYERDROP = "layerdrop"  # the name of a stack's LayerDrop draw, whose 'intermediates' hold `dropped`
LAYER_SCHEDULE = "layer_schedule"  # the collection of a run's layer schedule, and the stack's child that reads it
DECODER_STACK = ("decoder",)  # the stack `decoder_layerdrop` applies to


class LayerStacks(abc.ABC):
    """A config whose model has layer stacks: what `scan`, `unscan` and the trainer read of it.

    `LayerStackConfig` is one; a config holding several models' configs (the
    joint ELECTRA) is another.
    """

    scan_layers: bool

    @abc.abstractmethod
    def layer_stacks(self) -> dict[tuple[str, ...], int]:
        """{path of a layer stack in the parameter tree: its number of parameter sets}, e.g. {('encoder',): 12}."""

    @abc.abstractmethod
    def with_scan_layers(self, scan_layers: bool) -> LayerStacks:
        """This config with `scan_layers` set."""

    @property
    def scan_period(self) -> int:
        """Layers per scan step (MoeConfig: moe_every, so that each period ends in its MoE layer)."""
        return 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayerStackConfig(LayerStacks):
    """How a family's layer stacks run; a subclass names its stacks in `layer_stacks()`.

    remat_policy: 'none', 'full' or 'save_dot_products' (see the module docstring).
    scan_layers: scan over layers; parameters get a leading 'layers' axis.
    layerdrop: in training, the probability of skipping each layer of every stack (LayerDrop), in [0, 1).
    decoder_layerdrop: the decoder stack's own rate (Hugging Face's decoder_layerdrop); None: `layerdrop`.
    """

    remat_policy: str = "none"
    scan_layers: bool = False
    layerdrop: float = 0.0
    decoder_layerdrop: float | None = None

    def layer_fields(self, index: int) -> dict[str, Any]:
        """Fields of layer `index`'s module besides the config (MoeConfig: whether it is an MoE layer)."""
        return {}

    def with_scan_layers(self, scan_layers: bool) -> LayerStackConfig:
        return dataclasses.replace(self, scan_layers=scan_layers)

    def stack_depth_fields(self) -> dict[tuple[str, ...], str]:
        """{path of a layer stack: the field holding its number of layers}; what layer pruning changes."""
        return {}

    def with_stack_depths(self, depths: Mapping[tuple[str, ...], int]) -> LayerStackConfig:
        """This config with the stack at each path of `depths` that many layers deep (layer pruning)."""
        fields = self.stack_depth_fields()
        missing = [path for path in depths if path not in fields]
        if missing:
            raise ValueError(
                f"{type(self).__name__} names no depth field for the stacks {missing}; its stack_depth_fields() "
                f"are {fields}."
            )
        return dataclasses.replace(self, **{fields[path]: depth for path, depth in depths.items()})

    def stack_layerdrop(self, stack: tuple[str, ...]) -> float:
        """The LayerDrop rate of the stack at path `stack` (a key of `layer_stacks()`)."""
        if stack == DECODER_STACK and self.decoder_layerdrop is not None:
            return self.decoder_layerdrop
        return self.layerdrop

    def check_layer_stacks(self) -> None:
        """Validate the stack options; errors name the field and the fix."""
        check_remat_policy(self)
        owner = type(self).__name__
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"{owner}.scan_layers must be True or False, got {self.scan_layers!r}.")
        if self.scan_layers:
            check_period_divides(self)
        check_layerdrop(self)


def check_layerdrop(config: LayerStackConfig) -> None:
    """Raise unless the LayerDrop rates are in [0, 1) and `decoder_layerdrop` has a decoder stack to drop in."""
    owner = type(config).__name__
    rates = {"layerdrop": config.layerdrop}
    if config.decoder_layerdrop is not None:
        rates["decoder_layerdrop"] = config.decoder_layerdrop
    for name, value in rates.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"{owner}.{name} must be a probability in [0, 1), got {value!r}; 0 turns LayerDrop off.")
    if config.decoder_layerdrop is not None and DECODER_STACK not in config.layer_stacks():
        raise ValueError(
            f"{owner}.decoder_layerdrop={config.decoder_layerdrop!r}, but this model has no decoder stack; "
            "set layerdrop instead."
        )


def check_remat_policy(config: Any) -> None:
    """Raise unless `config.remat_policy` names one of REMAT_POLICIES."""
    if config.remat_policy not in REMAT_POLICIES:
        raise ValueError(
            f"{type(config).__name__}.remat_policy={config.remat_policy!r} is unknown; "
            f"use one of {list(REMAT_POLICIES)}."
        )


def rematerialised(layer: type[nn.Module], policy: str, num_args: int, prevent_cse: bool = True) -> type[nn.Module]:
    """`layer` recomputed in the backward pass as `policy` says ('none': `layer` itself).

    The layer is called as (x, *args, enable_dropout) with `num_args` args; enable_dropout is static.
    """
    if policy == "none":
        return layer
    return nn.remat(  # static_argnums count self: x is 1, enable_dropout comes after the args
        layer, policy=REMAT_POLICIES[policy], prevent_cse=prevent_cse, static_argnums=(num_args + 2,)
    )


def check_period_divides(config: LayerStacks) -> None:
    """Raise unless every stack's depth is a multiple of the scan period."""
    period = config.scan_period
    for path, depth in config.layer_stacks().items():
        if depth % period:
            where = f"the {'/'.join(path)} stack" if path else "the layer stack"
            raise ValueError(
                f"{type(config).__name__}: scanning steps over periods of moe_every={period} layers (the last one "
                f"MoE), but {where} has {depth} layers; make every stack a multiple of {period} layers, change "
                "moe_every, or set scan_layers=False."
            )


class LayerPeriod(nn.Module):
    """One step of a scanned MoE stack: layers_0 ... layers_{k-1} of `layer`, k = config.scan_period."""

    layer: Any  # the layer's module class, remat-wrapped or not
    config: LayerStackConfig
    fields: tuple[tuple[str, Any], ...] = ()  # the layer's own fields, as (name, value) pairs

    @nn.compact
    def __call__(self, x: Array, *args: Any) -> Array:
        """x [b, l, embed] and one layer's other arguments -> [b, l, embed]."""
        c = self.config
        for j in range(c.scan_period):
            x = self.layer(c, **dict(self.fields), **c.layer_fields(j), name=f"layers_{j}")(x, *args)
        return x


class LayerDropDraw(nn.Module):
    """Which layers of a stack this step skips: one Bernoulli(rate) draw per layer applied, for the whole batch."""

    rate: float

    @nn.compact
    def __call__(self, depth: int) -> Array:
        """-> bool [depth], True where the layer is dropped; sown into 'intermediates' as `dropped`."""
        dropped = jax.random.bernoulli(self.make_rng("dropout"), self.rate, (depth,))
        self.sow("intermediates", "dropped", dropped)
        return dropped


class LayerSchedule(nn.Module):
    """Which layers of a stack a run's layer schedule skips, from the 'layer_schedule' collection (if given)."""

    @nn.compact
    def __call__(self, depth: int, train: bool) -> Array | None:
        """-> bool [depth], True where the layer is skipped (inactive, or not kept in training); None without
        the collection. Training's draw is sown into 'intermediates' as `skipped`."""
        if not self.has_variable(LAYER_SCHEDULE, "active"):
            return None
        active, keep = self.get_variable(LAYER_SCHEDULE, "active"), self.get_variable(LAYER_SCHEDULE, "keep")
        if active.shape != (depth,) or keep.shape != (depth,):
            raise ValueError(
                f"the layer schedule gives {'/'.join(self.scope.path)} active {active.shape} and keep {keep.shape}, "
                f"but the stack applies {depth} layers; a schedule needs one entry per layer (no shared layers)."
            )
        skipped = ~active
        if train:
            skipped = skipped | ~jax.random.bernoulli(self.make_rng("dropout"), keep)
            self.sow("intermediates", "skipped", skipped)
        return skipped


def _skipped_layers(config: LayerStackConfig, stack: tuple[str, ...], depth: int, train: bool) -> Array | None:
    """bool [depth], True where a layer is skipped this application (LayerDrop's draw, the run's layer
    schedule), or None where none can be."""
    rate = config.stack_layerdrop(stack) if train else 0.0
    dropped = LayerDropDraw(rate, name=LAYERDROP)(depth) if rate else None
    scheduled = LayerSchedule(name=LAYER_SCHEDULE)(depth, train)
    if scheduled is not None and config.scan_layers and config.scan_period != 1:
        raise ValueError(
            f"{type(config).__name__}: a layer schedule skips single layers, but the scan steps over periods of "
            f"{config.scan_period} layers; set scan_layers=False."
        )
    if dropped is None or scheduled is None:
        return scheduled if dropped is None else dropped
    return dropped | scheduled


def apply_layers(
    layer: type[nn.Module], config: LayerStackConfig, num_layers: int, x: Array, *args: Array | None,
    enable_dropout: bool = False, repeats: int = 1, stack: tuple[str, ...] = (), **fields: Any,
) -> Array:
    """Applies a stack of `num_layers` layers `layer(config, **fields, **config.layer_fields(i))` to x.

    Each is called as `(x, *args, enable_dropout)`, `repeats` times in a row
    (ALBERT's shared layers), so the stack is num_layers * repeats deep. Call
    it inside a compact method: the layers become the caller's children,
    `layers_{i}`, or with `config.scan_layers` one scanned `layers` module.
    `args` (attention biases, the encoder output) are the same for every layer.
    `stack` is the stack's path in `config.layer_stacks()`, which picks its LayerDrop rate;
    with enable_dropout and a rate > 0, each layer applied is skipped as `LayerDropDraw` draws; the
    'layer_schedule' collection skips layers too (see the module docstring).
    """
    dropped = _skipped_layers(config, stack, num_layers * repeats, enable_dropout)
    layer = rematerialised(layer, config.remat_policy, len(args), prevent_cse=not config.scan_layers)
    staged = pipeline.stage_layout(config, num_layers * repeats, dropped is not None)
    if not config.scan_layers:
        for i in range(num_layers):
            module = layer(config, **fields, **config.layer_fields(i), name=f"layers_{i}")
            for r in range(repeats):
                x = _unless_dropped(module(x, *args, enable_dropout), x, dropped, i * repeats + r)
        return x

    period = config.scan_period
    if period == 1:
        body = layer(config, **fields, **config.layer_fields(0), name=SCANNED)
    else:
        body = LayerPeriod(layer, config, tuple(fields.items()), name=SCANNED)
    if staged is not None and pipeline.runs_staged(body):  # pipeline stages over a mesh axis (pipeline.py)
        return pipeline.apply_stages(body, config, x, args, enable_dropout, staged, REMAT_POLICIES[config.remat_policy])

    def step(module: nn.Module, carry: Array, dropped_here: Array | None, *broadcast: Any) -> tuple[Array, None]:
        for r in range(repeats):
            carry = _unless_dropped(module(carry, *broadcast, enable_dropout), carry, dropped_here, r)
        return carry, None

    scanned = nn.scan(
        step, variable_axes={True: 0}, split_rngs={True: True},
        in_axes=(nn.broadcast if dropped is None else 0, *(nn.broadcast,) * len(args)),
        length=num_layers // period, metadata_params={nn.PARTITION_NAME: SCANNED},
    )
    per_step = None if dropped is None else dropped.reshape(num_layers, repeats)  # period 1 (_skipped_layers)
    return scanned(body, x, per_step, *args)[0]


def _unless_dropped(output: Array, x: Array, dropped: Array | None, index: int) -> Array:
    """The layer's output, or its input x where `dropped[index]` (no draws: the output)."""
    return output if dropped is None else jnp.where(dropped[index], x, output)


def scanning_config(model: nn.Module) -> LayerStacks | None:
    """The model's config if it scans its layers, else None."""
    config = getattr(model, "config", None)
    return config if isinstance(config, LayerStacks) and config.scan_layers else None


def with_scan_layers(model: nn.Module, scan_layers: bool) -> nn.Module | None:
    """The same model with `scan_layers` set (its parameters convert by `scan`/`unscan`), or None without stacks."""
    config = getattr(model, "config", None)
    if not isinstance(config, LayerStacks):
        return None
    return model.clone(config=config.with_scan_layers(scan_layers))


def unscanned(model: nn.Module, params: Tree) -> tuple[nn.Module, Any]:
    """`model` with plain layers and `params` in their layout (a model that does not scan: both as given)."""
    config = scanning_config(model)
    return (model, params) if config is None else (with_scan_layers(model, False), unscan(params, config))


def scan(params: Tree, config: LayerStacks) -> dict:
    """Unscanned -> scanned parameters (unboxed arrays, with or without a top 'params' key).

    In each of `config.layer_stacks()`, `layers_0 ... layers_{n-1}` become one
    `layers` entry, stacked on a new leading axis (per period of k layers with
    MoE every k layers; see the module docstring). Whether `config` itself
    scans does not matter. numpy stays numpy.
    """
    period = config.scan_period

    def to_scanned(stack: dict, depth: int, where: str) -> None:
        names = [f"layers_{i}" for i in range(depth)]
        if SCANNED in stack or not set(names) <= set(stack):
            raise ValueError(
                f"scan: {where} should hold unscanned layers_0 ... layers_{depth - 1}, got keys {sorted(stack)}; "
                "is the tree already scanned, or from another config?"
            )
        layers = [stack.pop(name) for name in names]
        periods = [layers[start : start + period] for start in range(0, depth, period)]
        steps = [p[0] if period == 1 else {f"layers_{j}": sub for j, sub in enumerate(p)} for p in periods]
        stack[SCANNED] = jax.tree.map(_stack, *steps)

    return _map_stacks(params, config, to_scanned)


def unscan(params: Tree, config: LayerStacks) -> dict:
    """Scanned -> unscanned parameters: the inverse of `scan` (so unscan(scan(p)) == p exactly)."""
    period = config.scan_period

    def to_unscanned(stack: dict, depth: int, where: str) -> None:
        leaves = jax.tree.leaves(stack.get(SCANNED))
        if not leaves or any(np.shape(leaf)[0] != depth // period for leaf in leaves):
            raise ValueError(
                f"unscan: {where} should hold a scanned '{SCANNED}' entry stacked {depth // period} times, got keys "
                f"{sorted(stack)}; is the tree already unscanned, or from another config?"
            )
        scanned = stack.pop(SCANNED)
        for step in range(depth // period):
            sliced = jax.tree.map(lambda x, step=step: x[step], scanned)
            for j in range(period):
                stack[f"layers_{step * period + j}"] = sliced if period == 1 else sliced[f"layers_{j}"]

    return _map_stacks(params, config, to_unscanned)


def _stack(*arrays: Any) -> Any:
    if all(isinstance(a, np.ndarray) for a in arrays):
        return np.stack(arrays)
    return jnp.stack(arrays)


def _map_stacks(params: Tree, config: LayerStacks, convert: Callable[[dict, int, str], None]) -> dict:
    """Copies the dicts on the way to each stack, then `convert(stack, depth, where)` edits the copy in place."""
    check_period_divides(config)
    has_root = set(params) == {"params"}
    tree = dict(params["params"] if has_root else params)
    for path, depth in config.layer_stacks().items():
        node = tree
        for key in path:
            if key not in node:
                raise ValueError(f"no {'/'.join(path)} in the parameters (keys {sorted(node)}); is the config right?")
            node[key] = dict(node[key])
            node = node[key]
        convert(node, depth, "/".join(path) or "the top level")
    return {"params": tree} if has_root else tree
