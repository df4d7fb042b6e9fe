"""Before a run resumes: the model, optimizer and extra state (an EMA, ...) it builds must be those its newest
checkpoint holds."""

from __future__ import annotations

from ptmjax.storage.model_dir import ModelDir
from ptmjax.training.train_state import TrainState
from ptmjax.tree_paths import shape_differences, shapes_by_path


def check_resumable(folder: ModelDir, abstract_state: TrainState) -> None:
    """Raises a ValueError naming the differing paths and shapes when `folder`'s newest checkpoint was saved
    from another model or optimizer; reads only the checkpoint's metadata and writes nothing. A checkpoint whose
    metadata does not read is skipped: it is damaged, and `damaged_checkpoints` sets it aside when the run resumes."""
    for step in sorted(folder.saved_steps(), reverse=True):
        try:
            saved = folder.state_metadata(step)
            break
        except (OSError, ValueError):
            continue
    else:
        return
    fields = ("params", "opt_state", "extra")
    differences = shape_differences(shapes_by_path({name: saved.get(name) for name in fields}),
                                    shapes_by_path({name: getattr(abstract_state, name) for name in fields}))
    if differences:
        raise ValueError(
            f"{folder.checkpoints_path} (step {step}) holds another model or optimizer than this config builds: "
            f"{differences}. Nothing was written: train this config in a new --model_dir, or resume this run "
            f"with its own config ({folder.config_path})"
        )
