"""A sentence-embedding pair task over the embedded stdlib corpus: a docstring's summary line against its body.

Importing this module registers, with the stdlib SentencePiece vocabulary, 'ptmjax_stdlib_docstring_pairs':

* 'inputs': the summary line (the anchor), 'targets': the rest of the docstring (its positive), each as the
  vocabulary's tokenizer encodes one text (`head_inputs`: an import's `[CLS] ... [SEP]` around the text cut to
  fit, ptmjax's vocabulary the text then EOS), for a sentence encoder (ptmjax/models/sentence_encoder.py)
  trained with in-batch negatives;
* the pairs: the docstrings of both corpus splits in PEP 257 form with a body of at least
  `summaries.MIN_BODY_WORDS` words (`summaries.summary_and_body`, the summary task's filter), one per summary
  line (the first in corpus order), in the order of the SHA-256 of summary and body; the first
  `VALIDATION_PAIRS` form 'validation', the rest 'train' (100 and 575 on CPython 3.11);
* metric: `metrics.retrieval_at_1` (0-100): each validation summary's nearest body, by cosine similarity
  of their embeddings, among all the split's bodies (chance: 1 in 100).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping
from typing import Any

import seqio
import tensorflow as tf

from ptmjax import metrics
from ptmjax.data import corpus, vocabularies
from ptmjax.data.without_autograph import without_autograph
from ptmjax.tasks import head_inputs, registry, summaries

PAIRS_TASK = "ptmjax_stdlib_docstring_pairs"
VALIDATION_PAIRS = 100


@functools.cache
def _pairs() -> tuple[tuple[str, str], ...]:
    """(summary, body) of every qualifying docstring, one per summary, in hash order (see the module doc)."""
    by_summary: dict[str, str] = {}
    for split in corpus.SPLITS:
        for document in corpus.stdlib_docstrings(split):
            pair = summaries.summary_and_body(document)
            if pair is not None:
                by_summary.setdefault(*pair)
    return tuple(sorted(by_summary.items(), key=lambda pair: hashlib.sha256("\0".join(pair).encode()).digest()))


def docstring_pairs(split: str) -> tuple[tuple[str, str], ...]:
    """(summary, body) pairs of one split of the task."""
    if split not in corpus.SPLITS:
        raise ValueError(f"unknown split {split!r} of {PAIRS_TASK!r}; known: {', '.join(corpus.SPLITS)}")
    pairs = _pairs()
    return pairs[:VALIDATION_PAIRS] if split == "validation" else pairs[VALIDATION_PAIRS:]


def docstring_pairs_dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
    """seqio `FunctionDataSource` dataset_fn: {'inputs': summary, 'targets': body} (tf.string)."""
    anchors, bodies = zip(*docstring_pairs(split), strict=True)
    dataset = tf.data.Dataset.from_tensor_slices({"inputs": list(anchors), "targets": list(bodies)})
    return dataset.shuffle(len(bodies), seed=seed, reshuffle_each_iteration=True) if shuffle_files else dataset


def body_postprocessor(output: Any, example: Mapping[str, Any] | None = None, is_target: bool = False) -> Any:
    """A target: the example's body text; a prediction: the (anchor, positive) embeddings as they are."""
    return example["targets_pretokenized"].decode("utf-8") if is_target else output


def register_pairs_task(vocabulary: seqio.Vocabulary | None = None) -> seqio.Task:
    """(Re-)registers the task of the module doc; vocabulary defaults to the stdlib SentencePiece one (an
    imported model's: `register_pairs_task.vocabulary = @folder_vocabulary()`)."""
    vocabulary = vocabulary or vocabularies.stdlib_sentencepiece_vocabulary()
    source = seqio.FunctionDataSource(docstring_pairs_dataset_fn, splits=corpus.SPLITS)
    preprocessors = [without_autograph(functools.partial(head_inputs.tokenize_as_one_text,
                                                         keys=("inputs", "targets")))]
    return registry.register_task(PAIRS_TASK, source, preprocessors, vocabulary, [metrics.retrieval_at_1],
                                  body_postprocessor)


register_pairs_task()
