"""Orbax checkpoints of the train state together with the data position.

Saves are asynchronous; the last `max_to_keep` are kept. A checkpoint holds
two items: `state` (the sharded TrainState, written with TensorStore) and
`data` (JSON: how many batches the input pipeline has produced), so that a
resumed run reads exactly the batches it would have read. Restoring takes
the target shardings, so a checkpoint saved on one mesh restores onto any
other (Orbax reshards on read).
"""

from __future__ import annotations

import os
from typing import Any

import gin
import jax
import numpy as np
import orbax.checkpoint as ocp

from ptmjax.training.train_state import TrainState


@gin.configurable
class Checkpointer:
    """Saves and restores (TrainState, data position) under `directory`.

    Args:
      directory: the checkpoint folder (created if missing).
      max_to_keep: how many recent checkpoints to keep.
      asynchronous: write in a background thread while training goes on.
      read_only: only read: create nothing, not even a missing `directory`.
    """

    def __init__(self, directory: str, max_to_keep: int = 3, asynchronous: bool = True, read_only: bool = False):
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = os.path.abspath(directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=asynchronous, create=not read_only,
                read_only=read_only,
            ),
        )

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: TrainState, data_state: dict[str, Any]) -> None:
        """Starts saving; returns while the write finishes in the background."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)
            ),
            force=True,
        )

    def restore(
        self, abstract_state: TrainState, shardings: TrainState, step: int | None = None
    ) -> tuple[TrainState, dict[str, Any]]:
        """Restores `step` (default: the latest) onto `shardings`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        target = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state, shardings
        )
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), data=ocp.args.JsonRestore()
            ),
        )
        return restored["state"], dict(restored["data"])

    def save_params(self, step: int, params: Any) -> None:
        """Saves parameters alone (an imported model): a `state` item {'step', 'params'} and data position 0."""
        self._manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave({"step": step, "params": params}),
                data=ocp.args.JsonSave({"batches_consumed": 0}),
            ),
            force=True,
        )

    def restore_params(self, abstract_params: Any, shardings: Any = None, step: int | None = None) -> Any:
        """Restores only the parameters of `step` (default: the latest), of a run or of an imported model.

        shardings: a matching tree of shardings, or None for numpy arrays on the host.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if shardings is None:
            target = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), abstract_params)
        else:
            target = jax.tree.map(
                lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_params, shardings
            )
        item = {"params": target}
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(
                    item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item), partial_restore=True
                )
            ),
        )
        return restored["state"]["params"]

    def wait(self) -> None:
        """Blocks until pending saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def saved_state_metadata(state_dir: str) -> dict[str, Any]:
    """The saved tree of ArrayMetadata (shape, dtype) of a checkpoint's `state` item, read from disk."""
    from etils import epath

    return dict(ocp.StandardCheckpointHandler().metadata(epath.Path(state_dir)))
