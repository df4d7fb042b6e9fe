"""Where metrics go: a JSONL file, TensorBoard, and a loss-curve PNG."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping

import numpy as np

from ptmjax.storage.written_whole import file_written_whole
from ptmjax.training.tensorboard_events import drop_steps_after

EVAL_PREFIX = "eval_"


class MetricsLog:
    """Appends metrics to `model_dir/metrics.jsonl` and TensorBoard.

    Train and eval records share the file; eval keys start with `eval_`. A value
    that is not finite (the loss of a skipped step) is written as null: the file
    stays strict JSON, which has no NaN.
    TensorBoard gets two runs, `tensorboard/train` and `tensorboard/eval`, with
    the same tags (an eval key loses its prefix), so that `loss` or `accuracy`
    of both overlay in one chart.
    Reading the file back on resume keeps the loss curve continuous. A resume
    first drops the records of steps it will replay, from both, rewriting the
    files through a temporary file and a rename, so a crash keeps every record
    of the steps it keeps. A torn last line (a crash mid-write) is skipped with a warning.
    With `read_only` (every process but the first of a multi-host run) it
    reads the files but writes nothing.
    """

    def __init__(self, model_dir: str, read_only: bool = False):
        self.model_dir = model_dir
        self.read_only = read_only
        self.jsonl_path = os.path.join(model_dir, "metrics.jsonl")
        self.png_path = os.path.join(model_dir, "loss_curve.png")
        self._tb_dir = os.path.join(model_dir, "tensorboard")
        self._writers = {}  # 'train' / 'eval' -> its TensorBoard file writer

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.read_only:
            return
        record = {"step": int(step), **{k: _json_number(v) for k, v in metrics.items()}}
        with open(self.jsonl_path, "a") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")
        import tensorflow as tf

        for name, value in metrics.items():
            run, tag = ("eval", name.removeprefix(EVAL_PREFIX)) if name.startswith(EVAL_PREFIX) else ("train", name)
            with self._tensorboard(run).as_default():
                tf.summary.scalar(tag, float(value), step=int(step))
        for writer in self._writers.values():
            writer.flush()

    def records(self, up_to_step: int | None = None) -> list[dict]:
        """All records so far (optionally only those at or before a step)."""
        if not os.path.exists(self.jsonl_path):
            return []
        with open(self.jsonl_path) as f:
            lines = [(number, line) for number, line in enumerate(f, 1) if line.strip()]
        records = []
        for number, line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                if number != lines[-1][0]:
                    raise ValueError(
                        f"{self.jsonl_path} line {number} is not JSON ({error}); fix or delete that line"
                    ) from None
                warnings.warn(f"skipped the torn last line {number} of {self.jsonl_path} (a crash mid-write)",
                              stacklevel=2)
        return [r for r in records if up_to_step is None or r["step"] <= up_to_step]

    def truncate_after(self, step: int) -> None:
        """Drops records past `step` (a resumed run replays those steps) from metrics.jsonl and TensorBoard."""
        if self.read_only:
            return
        kept = self.records(up_to_step=step)
        with file_written_whole(self.jsonl_path) as f:
            f.writelines(json.dumps(r) + "\n" for r in kept)
        for run in ("train", "eval"):
            drop_steps_after(os.path.join(self._tb_dir, run), step)

    def plot(self) -> str:
        """Draws train and eval loss against step into loss_curve.png; returns its path."""
        if self.read_only:
            return self.png_path
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        records = self.records()
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for key, label in (("loss", "train"), ("eval_loss", "validation")):
            points = np.array([(r["step"], r[key]) for r in records if r.get(key) is not None])
            if len(points):
                ax.plot(points[:, 0], points[:, 1], marker="o" if key == "eval_loss" else None,
                        markersize=3, label=label)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy per target token")
        ax.set_title(os.path.basename(os.path.normpath(self.model_dir)))
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(self.png_path, dpi=110)
        plt.close(fig)
        return self.png_path

    def _tensorboard(self, run: str):
        if run not in self._writers:
            import tensorflow as tf

            self._writers[run] = tf.summary.create_file_writer(os.path.join(self._tb_dir, run))
        return self._writers[run]

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()


def _json_number(value: float) -> float | None:
    """`value` as a float, or None (JSON's null) when it is NaN or infinite."""
    number = float(value)
    return number if np.isfinite(number) else None
