"""State a run carries between steps without training it: a frozen teacher, pruning masks, a recurrent memory,
an exponential moving average of the parameters.

An `ExtraState` names its entry of `TrainState.extra` and says, from the
trainer's `ParamsView`, what it holds (abstract arrays and their shardings,
so that it is sharded by the same rules as the parameters it follows), how it
starts from the initial parameters, and how each finite train step changes
it, inside the jitted step. A `StoredExtraState` starts from storage instead (a frozen teacher's
parameters, read from its model folder): the trainer reads it, already sharded, beside the jitted
initialisation. A step with a non-finite loss or gradient leaves
it as it was, like the parameters. The checkpoint saves it with the rest of
the state; a resume restores it and checks its shapes (ptmjax/training/resume_check.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class ParamsView:
    """What an ExtraState may build on: the parameters' abstract arrays and shardings (in the model's own
    layout), the paths of those the step trains, and the mesh and logical-axis rules they are sharded by."""

    abstract_params: Any
    param_shardings: Any
    trained_paths: tuple[str, ...]
    mesh: Mesh
    rules: Any


class ExtraState(Protocol):
    """One entry of `TrainState.extra`."""

    name: str

    def abstract(self, view: ParamsView) -> Any:
        """Its tree of jax.ShapeDtypeStruct."""

    def shardings(self, view: ParamsView) -> Any:
        """Its tree of shardings, matching `abstract`."""

    def init(self, params: Any, view: ParamsView) -> Any:
        """Its first value, from the run's initial parameters (traced under jit)."""

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        """Its value after a finite step, given the step's new parameters (traced inside the train step)."""


@runtime_checkable
class StoredExtraState(Protocol):
    """An entry of `TrainState.extra` whose first value is read from storage, not computed from the parameters."""

    name: str

    def abstract(self, view: ParamsView) -> Any:
        """Its tree of jax.ShapeDtypeStruct."""

    def shardings(self, view: ParamsView) -> Any:
        """Its tree of shardings, matching `abstract`."""

    def read(self, view: ParamsView) -> Any:
        """Its first value, read and laid out with `shardings` (called outside jit, once per fresh run)."""

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        """Its value after a finite step (traced inside the train step)."""
