"""Linear probes per layer: how well a logistic regression reads a task's label from each layer of a frozen model.

Each example is the mean of a layer's hidden states over its non-padding tokens; one probe per layer
(0 = embeddings) is fit on the train split (standardised features, L2-regularised multinomial
logistic regression, scikit-learn) and scored on validation. The default task is
'ptmjax_stdlib_module_classification_head' (12 balanced classes: chance 8.33%); any registered seqio
task whose source gives an 'inputs' text and an integer 'label' works, read as text and encoded with
the model's own vocabulary.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import json
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from ptmjax.adapt.probing.layer_features import LayerReader
from ptmjax.adapt.probing.scalar_mix import masked_mean
from ptmjax.adapt.probing.text_rows import batches
from ptmjax.data import pipeline
from ptmjax.tasks import classification_head

DEFAULT_TASK = classification_head.MODULE_HEAD_TASK


def labelled_texts(task_name: str, split: str) -> list[tuple[str, int]]:
    """(text, label) of every example of a registered task's split, in order."""
    dataset = pipeline.get_task_or_mixture(task_name).source.get_dataset(split=split, shuffle=False)
    examples = []
    for example in dataset.as_numpy_iterator():
        if "inputs" not in example or "label" not in example:
            raise ValueError(f"{task_name} gives {sorted(example)}, not an 'inputs' text and a 'label'; probe a "
                             f"classification task such as {DEFAULT_TASK}")
        examples.append((example["inputs"].decode("utf-8"), int(example["label"])))
    if not examples:
        raise ValueError(f"the {split!r} split of {task_name} has no examples")
    return examples


def pooled_features(reader: LayerReader, rows: Sequence[Sequence[int]], length: int, batch_size: int) -> np.ndarray:
    """float32 [layers + 1, n, d]: each layer's mean over each row's non-padding tokens."""
    pooled = []
    for batch in batches(rows, length, reader.stack.pad_id, batch_size):
        hidden = reader(batch.tokens).hidden
        pooled.append(np.asarray(masked_mean(hidden, batch.valid))[:, : batch.size])
    return np.concatenate(pooled, axis=1)


@dataclasses.dataclass(frozen=True)
class ProbeRow:
    """One layer's probe: accuracies (0-100) on the train and validation splits."""

    layer: int
    train_accuracy: float
    accuracy: float


def probe_layers(
    train: np.ndarray, train_labels: np.ndarray, validation: np.ndarray, validation_labels: np.ndarray,
    regularization: float = 1.0,
) -> list[ProbeRow]:
    """train [layers + 1, n, d] and validation [layers + 1, m, d] features -> one row per layer."""
    rows = []
    for layer in range(train.shape[0]):
        probe = make_pipeline(StandardScaler(), LogisticRegression(C=regularization, max_iter=2000))
        probe.fit(train[layer], train_labels)
        rows.append(ProbeRow(layer, 100.0 * probe.score(train[layer], train_labels),
                             100.0 * probe.score(validation[layer], validation_labels)))
    return rows


def majority_accuracy(train_labels: Sequence[int], validation_labels: Sequence[int]) -> float:
    """Validation accuracy (0-100) of always answering the train split's most frequent label (the lowest on ties)."""
    counts = collections.Counter(int(label) for label in train_labels)
    majority = min(counts, key=lambda label: (-counts[label], label))
    return 100.0 * float(np.mean(np.asarray(validation_labels) == majority))


def format_table(rows: Sequence[ProbeRow]) -> str:
    lines = ["layer  train acc  validation acc"]
    lines += [f"{row.layer:5d}  {row.train_accuracy:9.2f}  {row.accuracy:14.2f}" for row in rows]
    return "\n".join(lines)


def write_table(rows: Sequence[ProbeRow], summary: dict, json_path: str, csv_path: str) -> None:
    """The table as JSON ({**summary, 'layers': [rows]}) and as CSV (one line a layer)."""
    records = [dataclasses.asdict(row) for row in rows]
    with open(json_path, "w") as f:
        json.dump({**summary, "layers": records}, f, indent=2)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)


def task_features(
    reader: LayerReader, encode: Callable[[str], list[int]], task_name: str, length: int, batch_size: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """({split: pooled features [layers + 1, n, d]}, {split: labels [n]}) of `task_name`'s train and validation."""
    splits = {split: labelled_texts(task_name, split) for split in ("train", "validation")}
    features = {split: pooled_features(reader, [encode(text) for text, _ in examples], length, batch_size)
                for split, examples in splits.items()}
    labels = {split: np.array([label for _, label in examples]) for split, examples in splits.items()}
    return features, labels


def probe_task(
    reader: LayerReader, encode: Callable[[str], list[int]], task_name: str, length: int, batch_size: int
) -> tuple[list[ProbeRow], float]:
    """Probes of every layer on `task_name` (train -> validation) and the majority-class accuracy."""
    features, labels = task_features(reader, encode, task_name, length, batch_size)
    rows = probe_layers(features["train"], labels["train"], features["validation"], labels["validation"])
    return rows, majority_accuracy(labels["train"], labels["validation"])
