"""A model folder: what `ptmjax train` and `ptmjax convert` write, and what every tool reads.

```
MODEL_DIR/
  config.gin             the resolved gin config; binds train.model (and the mesh)
  checkpoints/<step>/    Orbax: 'state' (train state, or {'step', 'params'} of an import) and 'data'
  tokenizer/             (imports only) the Hugging Face tokenizer files
  generation.json        (imports only) the generation ids: decoder start, EOS, pad, BOS
  base.json              (runs that save only what they train) the base model folder and step
                         the other parameters come from, see ptmjax/training/saved_part.py
  dependants.json        (bases of such runs) the runs that read parameters from it, and the steps
                         they read, which checkpoints/kept_steps.json keeps out of rotation
  metrics.jsonl, tensorboard/, loss_curve.png    (runs only)
  run.lock               (while a run trains) its host and pid, see ptmjax/training/run_lock.py
```

Paths are made absolute once, here: Orbax refuses relative ones. Reading a
folder never creates anything in it. ptmjax/gin_files.py reads what its
config.gin says: the model (`read_model_config`), and with the files above, the
vocabulary (`folder_vocabulary`: a run's is its task's) and generation ids.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Iterator
from typing import Any

import jax

from ptmjax.decoding.generation_ids import GENERATION_FILE
from ptmjax.storage.checkpoints import Checkpointer, saved_state_metadata
from ptmjax.storage.damaged_checkpoints import damage
from ptmjax.storage.written_whole import file_written_whole
from ptmjax.tree_paths import overlay, shape_differences, shapes_by_path, subtree

CONFIG_FILE = "config.gin"
CHECKPOINTS = "checkpoints"
TOKENIZER = "tokenizer"
LOCK_FILE = "run.lock"
BASE_FILE = "base.json"
DEPENDANTS_FILE = "dependants.json"


class DamagedCheckpointError(ValueError):
    """A checkpoint's files do not read back (a ValueError, so a command prints one line)."""


class CheckpointMismatchError(ValueError):
    """A checkpoint holds other parameters than the model that reads it (a ValueError: one line)."""


@dataclasses.dataclass(frozen=True)
class ModelDir:
    """A model folder at `path` (made absolute)."""

    path: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.path.abspath(os.path.expanduser(self.path)))

    @property
    def config_path(self) -> str:
        return os.path.join(self.path, CONFIG_FILE)

    @property
    def checkpoints_path(self) -> str:
        return os.path.join(self.path, CHECKPOINTS)

    @property
    def tokenizer_path(self) -> str:
        return os.path.join(self.path, TOKENIZER)

    @property
    def lock_path(self) -> str:
        return os.path.join(self.path, LOCK_FILE)

    @property
    def generation_path(self) -> str:
        return os.path.join(self.path, GENERATION_FILE)

    @property
    def base_path(self) -> str:
        return os.path.join(self.path, BASE_FILE)

    def base(self) -> tuple[ModelDir, int] | None:
        """The base folder and step that the parameters this folder does not save come from, if it has one."""
        if not os.path.isfile(self.base_path):
            return None
        with open(self.base_path) as f:
            record = json.load(f)
        return ModelDir(record["model_dir"]), int(record["step"])

    def write_base(self, base: ModelDir, step: int) -> None:
        """Records `base` at `step` as where the parameters this folder does not save come from."""
        with open(self.base_path, "w") as f:
            json.dump({"model_dir": base.path, "step": step}, f, indent=2)
            f.write("\n")

    @property
    def dependants_path(self) -> str:
        return os.path.join(self.path, DEPENDANTS_FILE)

    def dependants(self) -> list[tuple[ModelDir, int]]:
        """The folders that read parameters from this one, and the step each reads."""
        if not os.path.isfile(self.dependants_path):
            return []
        with open(self.dependants_path) as f:
            return [(ModelDir(record["model_dir"]), int(record["step"])) for record in json.load(f)]

    def add_dependant(self, dependant: ModelDir, step: int) -> None:
        """Records that `dependant` reads this folder's step `step` (dependants.json, written whole)."""
        records = {(folder.path, s) for folder, s in self.dependants()} | {(dependant.path, step)}
        with file_written_whole(self.dependants_path) as f:
            json.dump([{"model_dir": path, "step": s} for path, s in sorted(records)], f, indent=2)
            f.write("\n")

    def saved_steps(self) -> list[int]:
        """The steps of the complete checkpoints, oldest first (none if there is no checkpoints/ folder)."""
        root = self.checkpoints_path
        if not os.path.isdir(root):
            return []
        steps = sorted(int(name) for name in os.listdir(root) if name.isdigit())
        return [step for step in steps if os.path.isdir(os.path.join(root, str(step), "state"))]

    def checkpoint_step(self, step: int | None = None) -> int:
        """`step` (default: the newest) if its checkpoint exists; else a FileNotFoundError that says what there is."""
        steps = self.saved_steps()
        if not steps:
            raise FileNotFoundError(
                f"no checkpoint under {self.checkpoints_path}; pass the folder of a `ptmjax train` run that saved "
                "one, or of a `ptmjax convert --from-hf` import"
            )
        if step is None:
            return steps[-1]
        if step not in steps:
            raise FileNotFoundError(
                f"no checkpoint for step {step} under {self.checkpoints_path}; saved steps: {steps}"
            )
        return step

    def state_metadata(self, step: int | None = None) -> dict[str, Any]:
        """The saved tree of ArrayMetadata (shape, dtype, sharding) of a checkpoint's state; nothing is restored."""
        return saved_state_metadata(os.path.join(self.checkpoints_path, str(self.checkpoint_step(step)), "state"))

    def params_metadata(self, step: int | None = None) -> dict[str, Any]:
        """The saved parameters' ArrayMetadata tree, with those a folder with a base reads from its base."""
        own = self.state_metadata(step)["params"]
        base = self.base()
        if base is None:
            return own
        return overlay(self._base_params_metadata(base), own)

    def checkpointer(self, **options: Any) -> Checkpointer:
        """The folder's Checkpointer (it creates checkpoints/ when missing: for writing)."""
        return Checkpointer(self.checkpoints_path, **options)

    def read_params(self, abstract_params: Any, shardings: Any = None, step: int | None = None, *,
                    whole: bool = True) -> Any:
        """A checkpoint's parameters (default: the newest): numpy arrays on the host, or placed on `shardings`.

        Those a folder with a base does not save are read from its base (base.json). `whole`: the checkpoint
        must hold exactly the parameters of `abstract_params` (see `check_params`); False reads a part of them.
        """
        step = self.checkpoint_step(step)
        with self._naming_damage(step):
            if whole:
                self.check_params(abstract_params, step)
            base = self.base()
            if base is not None:
                return self._read_over_base(base, abstract_params, shardings, step)
            return self._restore_params(abstract_params, shardings, step)

    @contextlib.contextmanager
    def _naming_damage(self, step: int) -> Iterator[None]:
        """Turns a failed read of checkpoint `step` whose files are damaged into one DamagedCheckpointError
        naming the step, what is wrong, and the previous step to read instead; of a step deleted meanwhile
        (a run training in the folder), into a FileNotFoundError saying so."""
        try:
            yield
        except (DamagedCheckpointError, CheckpointMismatchError):
            raise  # already named; a mismatch is no damage, and probing for damage would read the whole step
        except Exception as error:
            if not os.path.isdir(os.path.join(self.checkpoints_path, str(step))):
                raise FileNotFoundError(
                    f"checkpoint step {step} in {self.checkpoints_path} was deleted while it was read: a run "
                    "training in this folder rotated it out (train.keep_checkpoints); read again for the newest "
                    "step, or once the run has stopped"
                ) from error
            problem = damage(self.checkpoints_path, step)
            if problem is None:
                raise
            older = [s for s in self.saved_steps() if s < step]
            offer = (f"read step {older[-1]} instead with --step {older[-1]} (in Python: step={older[-1]})" if older
                     else "it is the folder's only checkpoint")
            raise DamagedCheckpointError(
                f"checkpoint step {step} in {self.checkpoints_path} is damaged ({problem}); {offer}"
            ) from None

    def check_params(self, abstract_params: Any, step: int | None = None) -> None:
        """Raises a ValueError naming the differing paths and shapes unless checkpoint `step` (with its base's
        parameters, of which it may hold more: a pre-training head) saved the parameters of `abstract_params`
        (the model this folder's config.gin builds, for its readers); reads only metadata."""
        step = self.checkpoint_step(step)
        wanted, saved = shapes_by_path(abstract_params), shapes_by_path(self.params_metadata(step))
        if self.base() is not None:
            saved = {path: shape for path, shape in saved.items() if path in wanted}
        differences = shape_differences(saved, wanted)
        if differences:
            raise CheckpointMismatchError(
                f"{self.checkpoints_path} (step {step}) holds another model than {self.config_path} builds: "
                f"{differences}. Nothing was read: was config.gin edited after the checkpoint was saved? Put "
                "back the config it was saved with"
            )

    def _base_where(self, base: tuple[ModelDir, int]) -> str:
        folder, step = base
        return f"{self.path} takes the parameters it does not save from {folder.path} (step {step}, its {BASE_FILE})"

    def _base_params_metadata(self, base: tuple[ModelDir, int]) -> dict[str, Any]:
        """The base's parameters' metadata; a FileNotFoundError naming this folder's base.json if it is gone."""
        folder, step = base
        try:
            return folder.params_metadata(step)
        except FileNotFoundError as error:
            raise FileNotFoundError(f"{self._base_where(base)}, which is gone ({error}); put it back, or point "
                                    f"{self.base_path} at a copy of it") from None

    def _restore_params(self, abstract_params: Any, shardings: Any, step: int) -> Any:
        checkpointer = Checkpointer(self.checkpoints_path, read_only=True)
        try:
            return checkpointer.restore_params(abstract_params, shardings, step=step)
        finally:
            checkpointer.close()

    def _read_over_base(self, base: tuple[ModelDir, int], abstract_params: Any, shardings: Any, step: int) -> Any:
        """The parameters this folder saves at `step`, and the rest from `base`."""
        wanted = shapes_by_path(abstract_params)
        own = sorted(wanted.keys() & shapes_by_path(self.state_metadata(step)["params"]).keys())
        rest = sorted(wanted.keys() - set(own))

        folder, base_step = base
        where = self._base_where(base)
        in_base = shapes_by_path(self._base_params_metadata(base))
        missing = sorted(set(rest) - in_base.keys())
        if missing:
            raise ValueError(f"{where}, which lacks {len(missing)} of them: {missing[:3]}; put the base back, or "
                             f"point {self.base_path} at a copy of it")

        def part(paths: list[str]) -> tuple[Any, Any]:
            return subtree(abstract_params, paths), None if shardings is None else subtree(shardings, paths)

        base_part = folder.read_params(*part(rest), base_step, whole=False) if rest else {}
        return overlay(base_part, self._restore_params(*part(own), step) if own else {})


def saved_mesh_shape(state_metadata: dict[str, Any]) -> dict[str, int] | None:
    """The mesh axis sizes the checkpoint's arrays were saved from, or None if it recorded no mesh."""
    for leaf in jax.tree.leaves(state_metadata, is_leaf=lambda x: hasattr(x, "sharding")):
        sharding = getattr(leaf, "sharding", None)
        names, shape = getattr(sharding, "axis_names", None), getattr(sharding, "shape", None)
        if names is not None and shape is not None and math.prod(int(n) for n in shape) > 0:
            return {str(name): int(size) for name, size in zip(names, shape, strict=True)}
    return None
