"""A frozen teacher: another model's parameters, read from its model folder and carried in the train state as
`extra['teacher']`, never trained (no gradient, no optimizer state)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import jax
from flax import linen as nn

from ptmjax import partitioning
from ptmjax.families.model_api import ModelApi, model_api
from ptmjax.storage.model_dir import ModelDir
from ptmjax.training.extra_state import ParamsView
from ptmjax.tree_paths import shape_differences, shapes_by_path

TEACHER = "teacher"


@dataclasses.dataclass(frozen=True)
class FrozenTeacher:
    """The StoredExtraState of `module`'s parameters from `model_dir`'s newest checkpoint (a `ptmjax train` run
    or a `ptmjax convert --from-hf` import), sharded by the run's rules on the run's mesh."""

    module: nn.Module
    model_dir: str
    name: ClassVar[str] = TEACHER

    @functools.cached_property
    def api(self) -> ModelApi:
        return model_api(self.module)

    def abstract(self, view: ParamsView) -> Any:
        return self.api.abstract_params

    def shardings(self, view: ParamsView) -> Any:
        with jax.set_mesh(view.mesh):
            return partitioning.logical_shardings(self.api.boxed_abstract_params, view.mesh, view.rules)

    def read(self, view: ParamsView) -> Any:
        folder = ModelDir(self.model_dir)
        step = folder.checkpoint_step()
        differences = shape_differences(shapes_by_path(folder.params_metadata(step)),
                                        shapes_by_path(self.abstract(view)))
        if differences:
            raise ValueError(
                f"the teacher in {folder.checkpoints_path} (step {step}) is another model than the "
                f"{type(self.module).__name__} Distillation.teacher builds: {differences}; bind Distillation.teacher "
                "to the model it was trained as (a gin scope: teacher/T5Config.num_encoder_layers = 12, ...)"
            )
        params = folder.read_params(self.abstract(view), self.shardings(view), step)
        print(f"Teacher: {type(self.module).__name__} from {folder.checkpoints_path} (step {step})")
        return params

    def update(self, value: Any, params: Any, view: ParamsView) -> Any:
        return value
