"""Where evaluation results go: a JSON file per evaluation, and TensorBoard.

TensorBoard layout: the run folder `MODEL_DIR/tensorboard/eval` (the one the
training loop's eval loss goes to), one scalar tag `<task>/<metric>` per
metric at the checkpoint's step, so TensorBoard groups each task's metrics
and evaluations during and after training share one chart. In-training
evaluation writes the same tags through `MetricsLog` (keys `eval_<task>/<metric>`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from ptmjax.storage.written_whole import file_written_whole

TENSORBOARD_RUN = os.path.join("tensorboard", "eval")


def flat(results: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """{task: {metric: value}} -> {'<task>/<metric>': value}."""
    return {f"{task}/{name}": value for task, values in results.items() for name, value in values.items()}


def write_json(path: str, payload: Mapping[str, Any], overwrite: bool = False) -> str:
    """Writes `payload` to `path` through a temporary file and a rename, so a reader never sees half a file.

    An existing file is replaced only with `overwrite`; else a ValueError says how to proceed.
    """
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"{path} exists; pass --overwrite to replace it, or --output to write elsewhere")
    with file_written_whole(path) as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    return path


def write_tensorboard(model_dir: str, step: int, results: Mapping[str, Mapping[str, float]]) -> str:
    """Scalars `<task>/<metric>` at `step` in MODEL_DIR/tensorboard/eval; returns that folder."""
    import tensorflow as tf

    folder = os.path.join(model_dir, TENSORBOARD_RUN)
    writer = tf.summary.create_file_writer(folder)
    with writer.as_default():
        for tag, value in flat(results).items():
            tf.summary.scalar(tag, float(value), step=int(step))
    writer.close()
    return folder
