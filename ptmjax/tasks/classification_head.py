"""Module classification for models with a classification head: the label as a class id, not as text.

Importing this module registers, with the stdlib SentencePiece vocabulary,
'ptmjax_stdlib_module_classification_head': the documents, splits and labels of the text-to-text
'ptmjax_stdlib_module_classification' (`module_classification`: the 12 modules of `module_labels()`,
23 train and 8 validation documents each, 276 and 96 in all on CPython 3.11). Features:

* 'inputs' [n] int32: the docstring's ids as the vocabulary's tokenizer encodes one text
  (`head_inputs`): with ptmjax's vocabulary, cut to the 'inputs' sequence length less one, then EOS
  (no [CLS] is added: a head pools as its model does); with an imported tokenizer, its template
  (`[CLS] ... [SEP]`) around the text cut to fit;
* 'label' int32 scalar: the module's index into `module_labels()`;
* 'inputs_pretokenized': the docstring (for reading).

Metric: `metrics.accuracy` (0-100) of class ids: the postprocessor gives an example's 'label' as its
target and a prediction, the predicted class id (a head's argmax), as an int. Chance level
(`majority_class_baseline`: the train split's most frequent class, the first on ties) on
validation: 8.33 (the classes are balanced: 1/12).
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Mapping
from typing import Any

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import corpus, vocabularies
from ptmjax.data.without_autograph import without_autograph
from ptmjax.tasks import head_inputs, module_classification, registry

MODULE_HEAD_TASK = "ptmjax_stdlib_module_classification_head"


@functools.cache
def labelled_examples(split: str) -> tuple[tuple[str, int], ...]:
    """(docstring, class id) pairs of one split, in the order of the text-to-text task."""
    labels = module_classification.module_labels()
    examples = module_classification.module_classification_examples(split)
    return tuple((text, labels.index(module)) for text, module in examples)


def module_head_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn: {'inputs': docstring (tf.string), 'label': class id (tf.int32)}."""
    examples = labelled_examples(split)
    dataset = tf.data.Dataset.from_tensor_slices(
        {"inputs": [text for text, _ in examples], "label": tf.constant([label for _, label in examples], tf.int32)}
    )
    if shuffle_files:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    return dataset


def label_postprocessor(output: Any, example: Mapping[str, Any] | None = None, is_target: bool = False) -> int:
    """A target: the example's 'label'; a prediction: the predicted class id, as an int."""
    return int(example["label"]) if is_target else int(output)


def majority_class_baseline(split: str = "validation") -> dict[str, float]:
    """The accuracy on `split` of always predicting the most frequent class of 'train': the chance level."""
    counts = collections.Counter(label for _, label in labelled_examples("train"))
    majority = min(counts, key=lambda label: (-counts[label], label))
    targets = [label for _, label in labelled_examples(split)]
    return metrics.accuracy(targets, [majority] * len(targets))


def register_module_head_task(vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """(Re-)registers the task of the module doc; vocabulary defaults to the stdlib SentencePiece one (an
    imported model's: `register_module_head_task.vocabulary = @folder_vocabulary()`)."""
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    source = seqio.FunctionDataSource(module_head_dataset_fn, splits=corpus.SPLITS)
    preprocessors = [without_autograph(head_inputs.tokenize_as_one_text)]
    return registry.register_task(MODULE_HEAD_TASK, source, preprocessors, vocabulary, [metrics.accuracy],
                                  label_postprocessor, {"inputs": seqio.Feature(vocabulary, add_eos=True)})


register_module_head_task()
