"""Downstream tasks over the embedded stdlib corpus, for fine-tuning and comparing pre-trained models.

Importing this module registers, with the stdlib SentencePiece vocabulary:

* 'ptmjax_stdlib_module_classification': which standard-library module a
  docstring comes from, as text to text: inputs = the docstring (cut to the
  inputs length), targets = the module name ('logging.handlers'), both with
  EOS; metric 'accuracy' (of the generated module name, 0-100). Classes:
  the `NUM_MODULES` modules with the most documents in the corpus (both
  corpus splits). Balanced: each module gives as many documents
  as the smallest of them has (31 on CPython 3.11), taken in the order of
  the SHA-256 of their text; the first `VALIDATION_PER_MODULE` of each form
  'validation' and the rest 'train' (12 x 8 = 96 and 12 x 23 = 276 on
  CPython 3.11). The corpus' own validation split would leave 0 to 7
  documents per module, too few to compare models; so most validation
  documents here are in the corpus' train split, whose text (not its labels)
  pre-training reads.

`module_labels()` lists the class names: the candidates of rank
classification (`ptmjax.evaluation.rank_classification`).
"""

from __future__ import annotations

import functools
import hashlib

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import corpus, vocabularies
from ptmjax.tasks import text_to_text

MODULE_TASK = "ptmjax_stdlib_module_classification"
NUM_MODULES = 12
VALIDATION_PER_MODULE = 8


@functools.cache
def _documents_by_module() -> dict[str, tuple[str, ...]]:
    """Every corpus document (both splits) grouped by module, modules in corpus order."""
    by_module: dict[str, list[str]] = {}
    for split in corpus.SPLITS:
        for module, document in corpus.stdlib_documents_with_modules(split):
            by_module.setdefault(module, []).append(document)
    return {module: tuple(documents) for module, documents in by_module.items()}


def module_labels() -> tuple[str, ...]:
    """The `NUM_MODULES` modules with the most documents, most first (ties: corpus order)."""
    by_module = _documents_by_module()
    ranked = sorted(by_module, key=lambda module: -len(by_module[module]))  # a stable sort keeps corpus order
    return tuple(ranked[:NUM_MODULES])


def _text_hash(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8")).digest()


@functools.cache
def module_classification_examples(split: str) -> tuple[tuple[str, str], ...]:
    """(docstring, module) pairs of one split of the task, module by module (see the module doc)."""
    if split not in corpus.SPLITS:
        raise ValueError(f"unknown split {split!r} of {MODULE_TASK!r}; known: {', '.join(corpus.SPLITS)}")
    by_module = _documents_by_module()
    labels = module_labels()
    per_module = min(len(by_module[module]) for module in labels)
    if per_module <= VALIDATION_PER_MODULE:
        raise RuntimeError(
            f"{MODULE_TASK}: module {labels[-1]!r} has only {per_module} documents, none left for training "
            f"beside {VALIDATION_PER_MODULE} for validation"
        )
    examples = []
    for module in labels:
        documents = sorted(by_module[module], key=_text_hash)[:per_module]
        chosen = documents[:VALIDATION_PER_MODULE] if split == "validation" else documents[VALIDATION_PER_MODULE:]
        examples.extend((document, module) for document in chosen)
    return tuple(examples)


def module_classification_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn: {'inputs': docstring, 'targets': module name} (tf.string)."""
    examples = module_classification_examples(split)
    dataset = tf.data.Dataset.from_tensor_slices(
        {"inputs": [text for text, _ in examples], "targets": [module for _, module in examples]}
    )
    if shuffle_files:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    return dataset


def register_downstream_tasks(vocabulary: seqio.Vocabulary | None = None) -> None:
    """(Re-)registers the tasks of the module doc; vocabulary defaults to the stdlib SentencePiece one."""
    source = seqio.FunctionDataSource(module_classification_dataset_fn, splits=corpus.SPLITS)
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    text_to_text.register(MODULE_TASK, source, None, vocabulary, (metrics.accuracy,))


register_downstream_tasks()
