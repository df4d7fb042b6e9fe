"""What a training run is, apart from its data and its folder: built the same way by `train` and `compile`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from jax.sharding import Mesh

from ptmjax import partitioning
from ptmjax.families.model_api import model_api
from ptmjax.families.token_loss import LossConfig
from ptmjax.training.extra_state import ExtraState
from ptmjax.training.objective import Objective, StatefulObjective, family_loss
from ptmjax.training.parameter_ema import ParameterEma
from ptmjax.training.schedules import rsqrt_with_warmup
from ptmjax.training.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """The model, optimizer, schedule, loss, mesh and batch of a run: `ptmjax.training.run.train`'s
    arguments of these names. `run.run_spec_from_gin()` reads it from the parsed gin config.

    None takes the default: T5's rsqrt schedule with warmup, `LossConfig()` and
    `MeshConfig()` with their gin bindings; `ema_decay` None keeps no EMA of the
    parameters (ptmjax/training/parameter_ema.py); `objective` None minimises the family's own loss
    (ptmjax/training/objective.py); `extra_state` is more state the run carries (ptmjax/training/extra_state.py).
    """

    model: nn.Module
    batch_size: int
    task_feature_lengths: Mapping[str, int]
    optimizer: Callable[[optax.Schedule], optax.GradientTransformation]
    schedule: optax.Schedule | None = None
    loss_config: LossConfig | None = None
    mesh_config: partitioning.MeshConfig | None = None
    num_microbatches: int = 1
    pack: bool = True
    trainable: Sequence[str] | None = None
    ema_decay: float | None = None
    objective: Objective | None = None
    extra_state: Sequence[ExtraState] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_feature_lengths", dict(self.task_feature_lengths))
        object.__setattr__(self, "schedule", self.schedule or rsqrt_with_warmup())
        object.__setattr__(self, "loss_config", self.loss_config or LossConfig())
        object.__setattr__(self, "mesh_config", self.mesh_config or partitioning.MeshConfig())
        object.__setattr__(self, "extra_state", tuple(self.extra_state))
        carried = [slot.name for slot in self.carried()]  # checks ema_decay here, before anything is built
        if len(set(carried)) < len(carried):
            raise ValueError(f"the run carries two extra states of one name: {carried}; give train.extra_state "
                             "entries of other kinds than the EMA's and the objective's")

    def trainer(self, mesh: Mesh) -> Trainer:
        """The Trainer of this run on `mesh`; checks first that the batch splits over it."""
        data_ways = partitioning.data_parallel_size(mesh)
        ways = data_ways * self.num_microbatches
        if self.batch_size % ways:
            raise ValueError(
                f"train.batch_size={self.batch_size} does not split over the {data_ways} "
                f"data-parallel devices of mesh {dict(mesh.shape)} times num_microbatches={self.num_microbatches}; "
                f"pick a multiple of {ways}"
            )
        return Trainer(self.model, self.optimizer(self.schedule), self.schedule, mesh, self.mesh_config.rules,
                       self.loss_config, self.num_microbatches, self.trainable, self.carried(),
                       self.objective or family_loss)

    def carried(self) -> tuple[ExtraState, ...]:
        """What the run carries beside its parameters: the EMA of `ema_decay`, if set, what the objective
        carries (a distillation's teacher), and `extra_state` (pruning masks)."""
        ema = () if self.ema_decay is None else (ParameterEma(self.ema_decay),)
        stateful = isinstance(self.objective, StatefulObjective)
        return ema + (self.objective.extra_state(self.model) if stateful else ()) + self.extra_state

    def abstract_batch(self, sharding: jax.sharding.Sharding) -> dict[str, jax.ShapeDtypeStruct]:
        """The global batch the family's feature converter produces, as ShapeDtypeStructs on `sharding`; a model
        input of more than two axes (ELMo's character ids) has the trailing axes of the family's init input."""
        family = model_api(self.model).family
        converter = family.feature_converter(pack=self.pack)
        lengths = converter.get_model_feature_lengths(self.task_feature_lengths)
        batch = {}
        for name, length in lengths.items():
            feature = converter.MODEL_FEATURES.get(name)  # packing's segment ids and positions are int32
            dtype = feature.dtype.as_numpy_dtype if feature else jnp.int32
            trailing = family.init_inputs[name].shape[2:] if name in family.init_inputs else ()
            shape = (self.batch_size,) if feature and feature.rank == 0 else (self.batch_size, length, *trailing)
            batch[name] = jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
        return batch
