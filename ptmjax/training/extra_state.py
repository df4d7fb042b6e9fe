"""State a run carries between steps without training it: a frozen teacher, pruning masks, a recurrent memory,
an exponential moving average of the parameters.

An `ExtraState` names its entry of `TrainState.extra` and says, from the
trainer's `ParamsView`, what it holds (abstract arrays and their shardings,
so that it is sharded by the same rules as the parameters it follows), how it
starts from the initial parameters, and how each finite train step changes
it, inside the jitted step. A `StoredExtraState` starts from storage instead (a frozen teacher's
parameters, read from its model folder): the trainer reads it, already sharded, beside the jitted
initialisation. A step with a non-finite loss or gradient leaves it as it was, like the parameters.
The checkpoint saves it with the rest of the state; a resume restores it and checks its shapes
(ptmjax/training/resume_check.py). A `ScheduledExtraState` also changes between steps, by a callback
of its own. A `ParamsConstraint` also limits the parameters themselves (pruning masks zero the pruned
weights): the trainer applies it to the initial parameters and after every finite step, so no forward
pass sees parameters outside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class ParamsView:
    """What an ExtraState may build on: the parameters' abstract arrays, shardings and logical axis names (in
    the model's own layout: a scanned stack's leaves lead with the 'layers' axis), the paths of those the step
    trains, and the mesh and logical-axis rules they are sharded by."""

    abstract_params: Any
    param_shardings: Any
    logical_axes: Any
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


@runtime_checkable
class ParamsConstraint(Protocol):
    """An ExtraState that also constrains the parameters (pruning masks: the pruned weights are zero)."""

    name: str

    def abstract(self, view: ParamsView) -> Any: ...

    def shardings(self, view: ParamsView) -> Any: ...

    def init(self, params: Any, view: ParamsView) -> Any: ...

    def update(self, value: Any, params: Any, view: ParamsView) -> Any: ...

    def constrain(self, params: Any, value: Any, view: ParamsView) -> Any:
        """`params` as the run may hold them given its value (traced under jit)."""


@runtime_checkable
class ScheduledExtraState(Protocol):
    """An ExtraState that also changes between steps, on a schedule of its own (pruning masks): a run adds
    its callback (ptmjax/training/callbacks/callback.py) to its own, before the checkpointing one, which
    then saves what it did."""

    name: str

    def callback(self, trainer: Any, bar: Any = None) -> Any:
        """The Callback that acts for it in the run of `trainer`, printing through the progress `bar`."""


def constrained(params: Any, extra: dict[str, Any], slots: Sequence[Any], view: ParamsView) -> Any:
    """`params` with every ParamsConstraint among `slots` applied, from its value in `extra`."""
    for slot in slots:
        if isinstance(slot, ParamsConstraint):
            params = slot.constrain(params, extra[slot.name], view)
    return params
