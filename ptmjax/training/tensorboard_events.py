"""Rewriting TensorBoard event files: a resumed run drops the steps it will replay, as metrics.jsonl does."""

from __future__ import annotations

import os


def drop_steps_after(run_dir: str, step: int) -> None:
    """Removes the summaries of steps after `step` from every event file in `run_dir` (one TensorBoard run).

    A file is rewritten through a temporary file and a rename, so a crash leaves
    either the old or the new file; a torn last record (a crash mid-write) is dropped.
    """
    if not os.path.isdir(run_dir):
        return
    import tensorflow as tf

    for name in sorted(os.listdir(run_dir)):
        if "tfevents" not in name:
            continue
        path = os.path.join(run_dir, name)
        records, complete = [], True
        try:
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                records.append(record)
        except tf.errors.DataLossError:
            complete = False
        kept = [r for r in records if _step_of_summary(tf.compat.v1.Event.FromString(r)) <= step]
        if complete and len(kept) == len(records):
            continue
        partial = os.path.join(run_dir, ".rewrite.tmp")  # TensorBoard reads only names with 'tfevents' in them
        with tf.io.TFRecordWriter(partial) as writer:
            for record in kept:
                writer.write(record)
        os.replace(partial, path)


def _step_of_summary(event) -> int:
    """An event's step if it holds a summary; -1 (always kept) for the file's version and other bookkeeping."""
    return event.step if event.HasField("summary") else -1
